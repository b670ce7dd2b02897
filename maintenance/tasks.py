"""django-q2 tasks (thin): the maintenance dispatcher and the run it enqueues, and
the runs the API and the console queue (``submit_run`` → ``run_queued``, at the end).

``dispatch_due_maintenance`` (every two minutes, ``maintenance.schedules``) decides what is
due from rows in the database only (run history, policy, the ORM broker's queue), so no
restart can postpone maintenance and dry runs never count. Dispatchers take turns under a
lock, so a due run is enqueued once; the workspace lease makes any duplicate harmless
(``skipped``). Every failure of a scheduled run ends in its MaintenanceRun row. The rules,
the duplicate guard and the cost are in docs/maintenance.md ("The dispatcher, exactly").
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, Subquery
from django.db.models.signals import post_save
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from maintenance import hygiene, lease
from maintenance.models import MaintenanceLease, MaintenanceRun, RunKind, RunStatus, RunTrigger
from maintenance.run_start import queue_run, record_refused, run_maintenance, start_queued
from maintenance.runs import LEASE_HELD, QUEUED_GIVEN_UP_AFTER, QUEUED_GIVEN_UP_ERROR, fail_lost_queued
from maintenance.signals import announce_run
from memory.errors import Unavailable
from memory.models import Workspace
from memory.policy import PolicyValues
from memory.policy_model import MaintenancePolicy

log = logging.getLogger(__name__)

RUN_TASK = "maintenance.tasks.run_scheduled"
QUEUED_TASK = "maintenance.tasks.run_queued"
TASK_GROUP = "maintenance"
QUEUE_REFUSED = "the task queue did not accept the run"
# A full run that started this recently and is still "running" is in progress; one that failed
# this recently is not retried yet.
FULL_HOLD_OFF = timedelta(minutes=60)
# A queued task older than this (by the wall clock) is assumed lost, e.g. left locked by a
# killed worker, and no longer stops a new enqueue.
QUEUED_FORGOTTEN_AFTER = timedelta(hours=2)
COMPLETED_STATUSES = (RunStatus.SUCCEEDED, RunStatus.PROPOSED, RunStatus.BLOCKED)


@dataclass(frozen=True)
class RunHistory:
    """What the schedule needs to know about one workspace's past runs (``last_decay_started``:
    of a decay sweep or of a full run, which sweeps too; ``last_full_failed``: the start of a
    full run that failed within ``FULL_HOLD_OFF``). Read by ``run_history`` for the
    dispatcher and for the dashboard's "next runs" alike."""

    last_decay_started: datetime | None
    last_full_finished: datetime | None
    full_running: bool
    last_full_failed: datetime | None

    @classmethod
    def of(cls, workspace: Any) -> RunHistory:
        """The history of a workspace read with ``run_history``'s annotations."""
        return cls(**{f.name: getattr(workspace, f.name) for f in fields(cls)})


def run_history(now: datetime) -> dict[str, Any]:
    """Annotations of a Workspace query that make its ``RunHistory``: one indexed ``LIMIT 1`` or
    ``EXISTS`` each over the workspace's non-dry runs."""
    runs = MaintenanceRun.objects.filter(workspace=OuterRef("pk"), dry_run=False)
    full = runs.filter(kind=RunKind.FULL)
    recent_full = full.filter(started_at__gt=now - FULL_HOLD_OFF)
    return {
        # A full run sweeps too (unless the lease turned it away).
        "last_decay_started": Subquery(
            runs.filter(Q(kind=RunKind.DECAY) | Q(kind=RunKind.FULL) & ~Q(status=RunStatus.SKIPPED))
            .order_by("-started_at")
            .values("started_at")[:1]
        ),
        "last_full_finished": Subquery(
            full.filter(status__in=COMPLETED_STATUSES, finished_at__isnull=False)
            .order_by("-finished_at")
            .values("finished_at")[:1]
        ),
        # A full run queued by the API or the console counts as in progress too.
        "full_running": Exists(recent_full.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING])),
        "last_full_failed": Subquery(
            recent_full.filter(status=RunStatus.FAILED).order_by("-started_at").values("started_at")[:1]
        ),
    }


def due_at(history: RunHistory, policy: PolicyValues) -> tuple[datetime | None, datetime | None]:
    """When the next full run and the next decay sweep are due (None: as soon as the
    dispatcher passes), by the rules of docs/maintenance.md ("The dispatcher,
    exactly"); while a full run is in progress
    neither is started."""
    full_after = [
        *(
            [history.last_full_finished + timedelta(hours=policy.maintenance_interval_hours)]
            if history.last_full_finished is not None
            else []
        ),
        *([history.last_full_failed + FULL_HOLD_OFF] if history.last_full_failed is not None else []),
    ]
    decay = (
        None
        if history.last_decay_started is None
        else history.last_decay_started + timedelta(seconds=policy.decay_interval_seconds)
    )
    return max(full_after, default=None), decay


def due_kinds(*, history: RunHistory, policy: PolicyValues, now: datetime) -> list[str]:
    """The run kinds due for one workspace (pure: the rules of docs/maintenance.md)."""
    if history.full_running:
        return []
    full, decay = due_at(history, policy)
    if full is None or full <= now:
        return [RunKind.FULL.value]  # it does the decay passes too: a sweep beside it would meet its lease
    if decay is None or decay <= now:
        return [RunKind.DECAY.value]
    return []


def _workspaces_with_history(now: datetime) -> list[Workspace]:
    """Every workspace with its policy row and its RunHistory columns, in one query."""
    return list(Workspace.objects.select_related("policy").annotate(**run_history(now)).order_by("pk"))


def policy_of(workspace: Workspace) -> PolicyValues:
    """The policy of a workspace read with ``select_related("policy")`` (the defaults if it has
    no row): what the schedule decides on."""
    try:
        row = workspace.policy
    except MaintenancePolicy.DoesNotExist:
        return PolicyValues()
    return row.values()


def queued_runs() -> set[tuple[int, str]]:
    """(workspace id, kind) of every run_scheduled task waiting or in progress in the ORM
    broker's queue; empty with any other broker (docs/maintenance.md, "The dispatcher,
    exactly")."""
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


# The key of the PostgreSQL advisory lock that makes dispatchers take turns (any constant
# number the application uses for nothing else).
DISPATCH_LOCK = 7_340_221_015


def _take_turns() -> None:
    """Wait until no other dispatcher is between its reads and its enqueues, for the rest of
    the transaction. PostgreSQL: a transaction-scoped advisory lock. SQLite needs none: its
    transactions start IMMEDIATE (config/settings.py), one writer at a time."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [DISPATCH_LOCK])


# Seconds one call of the hygiene-verdict schedule (every 5 minutes) may spend assessing: a
# workspace of a million new entries is assessed over a few calls, and a worker is never held
# for long.
HYGIENE_BUDGET_SECONDS = 120.0


def assess_hygiene_verdicts(budget_seconds: float | None = None) -> dict[str, Any]:
    """The missing hygiene verdicts of every workspace (``hygiene.assess_in_background``), one
    workspace after the other until the budget is spent (at least one batch is assessed), each
    workspace's kept rank folded once its verdicts are made (``hygiene.fold_rank``); the next
    call goes on where work is left — a workspace with nothing left costs a few queries."""
    deadline = time.monotonic() + (HYGIENE_BUDGET_SECONDS if budget_seconds is None else budget_seconds)

    def spent() -> bool:
        return time.monotonic() >= deadline

    assessed: dict[str, int] = {}
    ranked: dict[str, dict[str, int]] = {}
    for workspace in Workspace.objects.order_by("pk"):
        n, done = hygiene.assess_in_background(workspace, until=spent)
        if n:
            assessed[workspace.slug] = n
        if done:  # the kept rank takes the verdicts in: the next reader finds nothing to fold
            folded = hygiene.fold_rank(workspace)
            if any(folded.values()):
                ranked[workspace.slug] = folded
        if not done or spent():  # the workspaces after this one wait for the next call
            return {"assessed": assessed, "ranked": ranked, "done": False}
    return {"assessed": assessed, "ranked": ranked, "done": True}


def dispatch_due_maintenance(now: datetime | None = None) -> dict[str, Any]:
    """Enqueue every maintenance run that is due; return what was enqueued and how many
    workspaces were checked. One dispatcher at a time (``_take_turns``): the next one reads
    the history and the queue once this one's tasks are in it."""
    with transaction.atomic():
        _take_turns()
        return _dispatch(now or timezone.now())


# Task results. django-q2 keeps the newest Q_CLUSTER["save_limit"] successful ones by itself but
# every failure for ever; after each scheduled full run the worker trims failures to the newest
# Q_FAILURES_KEEP and drops those older than Q_FAILURES_KEEP_DAYS (config/settings.py), in
# bounded batches.
RECLAIM_BATCH = 1000
RECLAIM_BATCHES = 10


def reclaim_worker_rows(
    now: datetime | None = None, *, batch: int = RECLAIM_BATCH, batches: int = RECLAIM_BATCHES
) -> dict[str, int]:
    """Delete old failed task results and outbox rows past their retention; the rows removed
    per kind (kinds with none left out)."""
    from django.conf import settings
    from django_q.models import Failure

    from memory.events import clean_outbox

    now = now or timezone.now()
    keep = max(int(getattr(settings, "Q_FAILURES_KEEP", 500)), 0)
    days = max(int(getattr(settings, "Q_FAILURES_KEEP_DAYS", 30)), 0)
    doomed = Q(stopped__lt=now - timedelta(days=days))
    boundary = list(Failure.objects.order_by("-stopped", "-pk").values_list("stopped", "pk")[keep : keep + 1])
    if boundary:  # more than ``keep`` failures: the older ones go too
        stopped, pk = boundary[0]
        doomed |= Q(stopped__lt=stopped) | Q(stopped=stopped, pk__lte=pk)
    removed = {"task_failures": 0, "live_messages": clean_outbox(now)}
    for _ in range(batches):
        ids = list(
            Failure.objects.filter(doomed).order_by("stopped", "pk").values_list("pk", flat=True)[:batch]
        )
        if not ids:
            break
        removed["task_failures"] += Failure.objects.filter(pk__in=ids).delete()[0]
    if any(removed.values()):
        log.info("trimmed the worker's bookkeeping: %s", removed)
    return {kind: n for kind, n in removed.items() if n}


def _dispatch(now: datetime) -> dict[str, Any]:
    fail_lost_queued(now=now)  # queued runs no worker started for hours are given up, visibly
    workspaces = _workspaces_with_history(now)
    queued = queued_runs()
    enqueued: list[dict[str, str]] = []
    for workspace in workspaces:
        for kind in due_kinds(history=RunHistory.of(workspace), policy=policy_of(workspace), now=now):
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


class WorkerStopping(KeyboardInterrupt):
    """Raised in a run when its worker is told to stop (SIGTERM). No Exception: the run's
    transaction rolls back and its lease is released on the way out, but it is no error of
    the run and logs no traceback. A KeyboardInterrupt because psycopg cancels the query in
    flight on one and keeps the connection usable; any other exception landing mid-query
    leaves it "another command is already in progress" for the release and the failed row."""


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While a run is in hand, SIGTERM abandons it (the cluster's stop, ``maintenance``'s
    qcluster, sends it when the run would not finish in time); otherwise the worker ignores
    SIGTERM and stops at its next task. Only the main thread can take signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def abandon(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the way out must not be cut short
        raise WorkerStopping(f"interrupted: the worker was stopped ({signal.Signals(signum).name})")

    previous = signal.signal(signal.SIGTERM, abandon)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _runs_created_here() -> Iterator[list[int]]:
    """The ids of the MaintenanceRun rows this thread creates meanwhile."""
    ids: list[int] = []
    me = threading.get_ident()

    def remember(sender: Any, instance: MaintenanceRun, created: bool = False, **kwargs: Any) -> None:
        if created and threading.get_ident() == me:
            ids.append(instance.pk)

    post_save.connect(remember, sender=MaintenanceRun, weak=False)
    try:
        yield ids
    finally:
        post_save.disconnect(remember, sender=MaintenanceRun)


def _let_go(stop: BaseException) -> None:
    """Release what the abandoned run's frames still hold — a half-read chunked cursor (a
    backup's or compaction's ``iterator()``), above all — now, while the connection is open.
    The exception keeps those frames alive (the worker's ``SystemExit`` names it as its
    context) until the process exits, after the worker has closed its connections: the
    cursor's cleanup then failed on a closed database and printed a traceback to the log."""
    traceback.clear_frames(stop.__traceback__)


def _record_failure(workspace: Workspace, kind: str, created: list[int], error: str) -> None:
    """Make sure the console shows the failure: the run's own row marked failed if it is still
    running (the failure hit while it was being finished), or a failed row of its own if the
    run failed before it could write one (the database refused the insert). A lease still held
    by the run is released: the failure may have hit between taking it and the ``try`` whose
    ``finally`` gives it back."""
    try:
        connection.close_if_unusable_or_obsolete()  # the error may have broken the connection
        now = timezone.now()
        if created:
            MaintenanceRun.objects.filter(pk__in=created, status=RunStatus.RUNNING).update(
                status=RunStatus.FAILED, finished_at=now, error=error
            )
            held = MaintenanceLease.objects.filter(workspace=workspace, run_id__in=created)
            held.update(holder="", run=None)
        else:
            MaintenanceRun.objects.create(
                workspace=workspace,
                kind=kind if kind in RunKind.values else RunKind.FULL,
                trigger=RunTrigger.SCHEDULE,
                status=RunStatus.FAILED,
                started_at=now,
                finished_at=now,
                error=error,
            )
    except Exception:
        log.exception("could not record the failure of a %s run of workspace %s", kind, workspace.pk)


def _trim_worker_rows() -> None:
    try:
        reclaim_worker_rows()
    except Exception:  # never a reason for the run's task to fail: the next full run tries again
        log.warning("could not trim the worker's task results", exc_info=True)


def run_scheduled(workspace_id: int, kind: str) -> dict[str, Any] | None:
    """One scheduled run. A workspace deleted since the dispatch has nothing left to maintain.
    Whatever goes wrong, the run's row says so (``_record_failure``); a run abandoned because
    the worker is stopping ends ``failed`` with its lease released, and the worker exits."""
    workspace = Workspace.objects.filter(pk=workspace_id).first()
    if workspace is None:
        return None
    with _runs_created_here() as created, stop_on_sigterm():
        try:
            result = run_maintenance(workspace=workspace, kind=kind, trigger=RunTrigger.SCHEDULE)
            if kind == RunKind.FULL:
                _trim_worker_rows()
            return result
        except WorkerStopping as stop:
            log.info("%s run of workspace %s abandoned: %s", kind, workspace.slug, stop)
            _let_go(stop)
            _record_failure(workspace, kind, created, str(stop))
            # Then the worker goes: django-q2 also sends SIGTERM to a worker whose task ran
            # past Q_TIMEOUT, and has replaced it already; one that went on would take tasks
            # beside its replacement. The task, unacknowledged, is delivered again after
            # Q_CLUSTER["retry"]: one more run of the workspace, harmless (the lease keeps it
            # from overlapping another; a run only applies the policy, as the next one would).
            raise SystemExit(0) from None
        except Exception as exc:
            _record_failure(workspace, kind, created, "".join(traceback.format_exception_only(exc)).strip())
            raise


def enqueue_run(run: MaintenanceRun) -> None:
    """Hand a ``queued`` run (``maintenance.run_start.queue_run``) to the worker. With the ORM broker
    (the default) the task is a row written in the caller's transaction, so the run and its
    task are committed together or not at all; with another broker it is sent once the run's
    row is committed, so the worker always finds it."""

    def send() -> None:
        async_task(
            QUEUED_TASK,
            run.pk,
            group=TASK_GROUP,
            task_name=f"maintenance {run.kind} run {run.pk}"[:100],
        )

    def send_or_fail() -> None:
        # After the commit: the run's row exists, so a broker that refuses the task (Redis
        # down) must not leave it ``queued`` until it is given up hours later. It fails now,
        # with the broker's error, and the caller hears 503.
        try:
            send()
        except Exception as exc:
            error = f"{QUEUE_REFUSED}: {''.join(traceback.format_exception_only(exc)).strip()}"
            log.warning("run %s: %s", run.pk, error)
            failed = MaintenanceRun.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
                status=RunStatus.FAILED, finished_at=timezone.now(), error=error
            )
            if failed:
                run.refresh_from_db()
                announce_run(run, "finished")
            raise Unavailable(f"{QUEUE_REFUSED}; the run was recorded as failed", run_id=run.pk) from exc

    if Conf.ORM and not Conf.BROKER_CLASS:
        send()
    else:
        transaction.on_commit(send_or_fail)


def run_queued(run_id: int) -> dict[str, Any] | None:
    """Start a run that the API or the console queued (``enqueue_run``). The run is claimed
    with a conditional UPDATE (queued → running): a task delivered twice, or one that comes
    after the run was given up (``maintenance.runs.fail_lost_queued``), finds it no longer
    queued and does nothing. Then it works as any run (the lease may still turn it into
    ``skipped``), and a failure or a stopping worker ends it ``failed`` as for scheduled runs;
    the redelivered task of a run abandoned that way does nothing."""
    # A run queued longer than QUEUED_GIVEN_UP_AFTER is given up here too: when the worker comes
    # back after an outage, its waiting tasks are delivered before the dispatcher's first pass,
    # and an operator's hours-old request must not apply to today's data.
    now = timezone.now()
    MaintenanceRun.objects.filter(
        pk=run_id, status=RunStatus.QUEUED, started_at__lte=now - QUEUED_GIVEN_UP_AFTER
    ).update(status=RunStatus.FAILED, finished_at=now, error=QUEUED_GIVEN_UP_ERROR)
    claimed = MaintenanceRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
        status=RunStatus.RUNNING, started_at=now
    )
    if not claimed:
        log.info("queued run %s is not queued any more (already started, or given up)", run_id)
        return None
    run = MaintenanceRun.objects.select_related("workspace").get(pk=run_id)
    with stop_on_sigterm():
        try:
            return start_queued(run)
        except WorkerStopping as stop:
            log.info("queued run %s abandoned: %s", run_id, stop)
            _let_go(stop)
            _record_failure(run.workspace, run.kind, [run.pk], str(stop))
            raise SystemExit(0) from None
        except Exception as exc:
            _record_failure(
                run.workspace, run.kind, [run.pk], "".join(traceback.format_exception_only(exc)).strip()
            )
            raise


@dataclass(frozen=True)
class Submitted:
    """What became of a run asked for: ``run`` is queued, or ``skipped`` because the run
    ``blocking_run_id`` holds the workspace's lease or waits in its queue (None when the
    lease's holder is no run: an approval); ``refusal`` then says which."""

    run: MaintenanceRun
    blocking_run_id: int | None = None
    refusal: str = ""


def submit_run(
    *,
    workspace: Workspace,
    kind: str,
    trigger: str,
    dry_run: bool = False,
    force: bool = False,
    actor: str = "system",
    params: dict[str, Any] | None = None,
) -> Submitted:
    """Queue a run for the worker (the API's and the console's long runs): one at a time per
    workspace. If another run holds the workspace's lease right now, or another one waits in
    the queue (queued less than ``QUEUED_GIVEN_UP_AFTER`` ago), the run is recorded
    ``skipped`` at once instead: a second "run now" while one is pending would only meet the
    lease later. Submitters of one workspace take turns on its lease row (SELECT … FOR UPDATE;
    SQLite's single writer), so of two at once exactly one is queued."""
    args: dict[str, Any] = {
        "workspace": workspace,
        "kind": kind,
        "trigger": trigger,
        "dry_run": dry_run,
        "force": force,
        "actor": actor,
    }
    MaintenanceLease.objects.get_or_create(workspace=workspace)
    with transaction.atomic():  # the run and its task, together or not at all
        MaintenanceLease.objects.select_for_update().filter(workspace=workspace).first()
        now = timezone.now()
        is_held, holding = lease.held(workspace, now=now)
        if is_held:
            return Submitted(record_refused(**args), holding, f"{LEASE_HELD} (run {holding})")
        waiting = (
            MaintenanceRun.objects.filter(
                workspace=workspace,
                status=RunStatus.QUEUED,
                started_at__gt=now - QUEUED_GIVEN_UP_AFTER,
            )
            .order_by("pk")
            .values_list("pk", flat=True)
            .first()
        )
        if waiting is not None:
            error = f"another run of this workspace waits in the queue (run {waiting})"
            return Submitted(record_refused(**args, error=error), waiting, error)
        run = queue_run(**args, params=params)
        enqueue_run(run)
    return Submitted(run)
