"""django-q2 tasks (thin): the maintenance dispatcher and the run it enqueues (SPEC §4.7).

``dispatch_due_maintenance`` runs every two minutes (``maintenance.schedules``). For each
workspace it reads the run history in the database and the policy fresh, and enqueues
``run_scheduled(workspace_id, kind)``:

- a **decay** sweep when the last non-dry decay run *started* more than
  ``decay_interval_seconds`` ago (or there is none). Any status counts, failed and skipped
  included: a sweep that crashes, or one that keeps finding the lease held, is retried after
  one interval instead of every two minutes, so a crash loop cannot hammer the database. No
  sweep is started while a full run is in progress: the full run executes the decay passes
  itself, and the lease would only record the sweep as skipped.
- a **full** run when the last *completed* (succeeded or blocked) non-dry full run finished
  more than ``maintenance_interval_hours`` ago (or there is none), unless a full run started
  less than 60 minutes ago is still running (in progress; a "running" row older than that
  belongs to a killed run, which the next run marks failed) or failed (the same crash-loop
  guard as above, with the retry one hour later). Blocked counts as completed: the circuit
  breaker would block again until an operator forces it, so retrying is pointless.

Dry runs never count: an agent previewing maintenance every few minutes must not postpone the
real thing. Because everything is decided from rows in the database, a restart of the web
server or the cluster cannot postpone maintenance either.

Idempotency. The broker may deliver the dispatcher twice and the dispatcher may run while an
earlier run_scheduled task still waits in the queue. The workspace lease already makes a
duplicate run harmless (it is recorded as ``skipped``), so the dispatcher only has to avoid
piling duplicates up. Between enqueue and start there is no MaintenanceRun row yet, so the
dispatcher also looks at the queue itself: with the ORM broker (the default, embedded and
hosted) every task waiting or in progress is an ``OrmQ`` row until it is acknowledged, so one
query plus decoding the signed payloads tells which (workspace, kind) pairs are already queued
(a row older than two hours, e.g. left locked by a killed worker, no longer counts).
We rely on neither a cache (the default LocMem cache is per process, and q2 workers are
processes) nor new models. With another broker the queue check is skipped and the lease is the
only guard. Two dispatchers racing at the very same instant can still both enqueue; the lease
turns the second run into a ``skipped`` row.

The work per dispatch is a constant number of queries whatever the number of workspaces: one
reading all workspaces with their policy rows and four correlated subqueries over the run
history (each an indexed ``LIMIT 1``/``EXISTS``), one for the queue, plus one insert per
enqueued task.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Subquery
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from maintenance.models import MaintenancePolicy, MaintenanceRun, RunKind, RunStatus, RunTrigger
from maintenance.policy import PolicyValues
from maintenance.runs import run_maintenance
from memory.models import Workspace

RUN_TASK = "maintenance.tasks.run_scheduled"
TASK_GROUP = "maintenance"
# A full run that started this recently and is still "running" is in progress; one that failed
# this recently is not retried yet.
FULL_HOLD_OFF = timedelta(minutes=60)
# A queued task older than this (by the wall clock) is assumed lost, e.g. left locked by a
# killed worker, and no longer stops a new enqueue.
QUEUED_FORGOTTEN_AFTER = timedelta(hours=2)
COMPLETED_STATUSES = (RunStatus.SUCCEEDED, RunStatus.BLOCKED)


@dataclass(frozen=True)
class RunHistory:
    """What the dispatcher needs to know about one workspace's past runs."""

    last_decay_started: datetime | None
    last_full_finished: datetime | None
    full_running: bool
    full_failed_recently: bool


def due_kinds(*, history: RunHistory, policy: PolicyValues, now: datetime) -> list[str]:
    """The run kinds due for one workspace (pure: the rules of the module docstring)."""
    kinds: list[str] = []
    if history.full_running:
        return kinds
    decay_every = timedelta(seconds=policy.decay_interval_seconds)
    if history.last_decay_started is None or now - history.last_decay_started >= decay_every:
        kinds.append(RunKind.DECAY.value)
    full_every = timedelta(hours=policy.maintenance_interval_hours)
    if not history.full_failed_recently and (
        history.last_full_finished is None or now - history.last_full_finished >= full_every
    ):
        kinds.append(RunKind.FULL.value)
    return kinds


def _workspaces_with_history(now: datetime) -> list[Workspace]:
    """Every workspace with its policy row and its RunHistory columns, in one query."""
    runs = MaintenanceRun.objects.filter(workspace=OuterRef("pk"), dry_run=False)
    full = runs.filter(kind=RunKind.FULL)
    recent_full = full.filter(started_at__gt=now - FULL_HOLD_OFF)
    return list(
        Workspace.objects.select_related("policy")
        .annotate(
            last_decay_started=Subquery(
                runs.filter(kind=RunKind.DECAY).order_by("-started_at").values("started_at")[:1]
            ),
            last_full_finished=Subquery(
                full.filter(status__in=COMPLETED_STATUSES, finished_at__isnull=False)
                .order_by("-finished_at")
                .values("finished_at")[:1]
            ),
            full_running=Exists(recent_full.filter(status=RunStatus.RUNNING)),
            full_failed_recently=Exists(recent_full.filter(status=RunStatus.FAILED)),
        )
        .order_by("pk")
    )


def _policy(workspace: Workspace) -> PolicyValues:
    try:
        row = workspace.policy
    except MaintenancePolicy.DoesNotExist:
        return PolicyValues()
    return row.values()


def queued_runs() -> set[tuple[int, str]]:
    """(workspace id, kind) of every run_scheduled task waiting or in progress in the ORM
    broker's queue; empty with any other broker (see the module docstring)."""
    if not Conf.ORM or Conf.BROKER_CLASS:
        return set()
    forgotten = timezone.now() - QUEUED_FORGOTTEN_AFTER
    found: set[tuple[int, str]] = set()
    for payload in OrmQ.objects.using(Conf.ORM).values_list("payload", flat=True):
        try:
            task = SignedPackage.loads(payload)
        except Exception:  # signed with another SECRET_KEY, or not ours: not our business
            continue
        if not isinstance(task, dict) or task.get("func") != RUN_TASK:
            continue
        enqueued_at = task.get("started")
        if isinstance(enqueued_at, datetime) and enqueued_at < forgotten:
            continue
        args = task.get("args")
        if isinstance(args, tuple | list) and len(args) == 2:
            found.add((args[0], args[1]))
    return found


def dispatch_due_maintenance(now: datetime | None = None) -> dict[str, Any]:
    """Enqueue every maintenance run that is due; return what was enqueued and how many
    workspaces were checked."""
    now = now or timezone.now()
    workspaces = _workspaces_with_history(now)
    queued = queued_runs()
    enqueued: list[dict[str, str]] = []
    for workspace in workspaces:
        history = RunHistory(
            last_decay_started=workspace.last_decay_started,  # type: ignore[attr-defined]
            last_full_finished=workspace.last_full_finished,  # type: ignore[attr-defined]
            full_running=workspace.full_running,  # type: ignore[attr-defined]
            full_failed_recently=workspace.full_failed_recently,  # type: ignore[attr-defined]
        )
        for kind in due_kinds(history=history, policy=_policy(workspace), now=now):
            if (workspace.pk, kind) in queued:
                continue
            async_task(
                RUN_TASK,
                workspace.pk,
                kind,
                group=TASK_GROUP,
                # Shown in the admin's task lists (q2's Task.name holds 100 characters).
                task_name=f"maintenance {kind} {workspace.slug}"[:100],
            )
            enqueued.append({"workspace": workspace.slug, "kind": kind})
    return {"enqueued": enqueued, "checked": len(workspaces)}


def run_scheduled(workspace_id: int, kind: str) -> dict[str, Any] | None:
    """One scheduled run. A workspace deleted since the dispatch has nothing left to maintain."""
    workspace = Workspace.objects.filter(pk=workspace_id).first()
    if workspace is None:
        return None
    return run_maintenance(workspace=workspace, kind=kind, trigger=RunTrigger.SCHEDULE)
