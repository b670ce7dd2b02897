"""Maintenance runs: the full run and the partial prune and decay sweeps.

A run records a MaintenanceRun — at once (``run_maintenance``: the command line, the
scheduler's task, small dry runs of the API), or first as ``queued`` for a worker to start
(``queue_run``, then ``start_queued`` in ``maintenance.tasks.run_queued``) — takes the
workspace's lease (or is recorded ``skipped``), marks runs killed earlier as ``failed`` (and
queued runs no worker started for hours, ``fail_lost_queued``), and then works in two phases,
recording where it is once per pass (``Progress``):

1. **Plan.** Every pass runs inside one transaction that is rolled back at the end. This gives
   the exact counts and ids the run would produce — it *is* the dry run, so a dry run and a
   real run at the same ``now`` agree by construction — and decides the circuit breaker
   before anything is changed. It does not rewrite entries only to roll them back: its score
   pass scores into a temporary narrow table the plan's passes read (``scoring_db.plan_scores``),
   and its status changes are kept beside the entries (``plan_status``), so the entries it
   would mark stale, archive or tombstone stay unlocked for the API. (Graduation, compaction's
   summaries, link pruning and purges still write inside the plan: a few thousand rows at a
   million entries.) On PostgreSQL the lease is renewed during the plan from a
   connection of its own (``lease.keep_alive``). The hygiene text verdicts the plan makes
   are stored once it is over (a cache the apply reads, not a change: ``hygiene.PlanVerdicts``).
2. **Apply** (real runs that are not blocked). The pre-prune backup is written first when the
   plan will change rows in a destructive pass (8–13); a failed backup fails the run with
   nothing changed. Then every pass runs for real, one transaction per batch, renewing the
   lease after every batch. Should the data move between plan and apply so that a destructive
   pass finds rows the plan did not, the backup is written just before that pass's first
   batch: nothing is ever purged or tombstoned without a backup that contains it.

The result object goes to the caller whole; the row keeps it with at most ``AFFECTED_KEPT`` ids
per list (and the true lengths in ``affected_total``): a real run's complete lists are its
LifecycleEvents (``maintenance.selectors.AffectedIds``).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from maintenance import backups, bookkeeping, hygiene, lease, passes, plan_snapshot, plan_status, proposals
from maintenance.models import MaintenanceRun, RunKind, RunStatus
from maintenance.pass_tools import BATCH_SIZE, LeaseLost, PassResult, RunContext
from maintenance.signals import announce_run
from memory import lifecycle, scoring_db
from memory.models import LISTED_STATUSES, Entry, Workspace
from memory.policy import PolicyValues, clamp_value, clean_tags
from memory.policy_model import MaintenancePolicy

log = logging.getLogger(__name__)

COUNT_KEYS = (
    "scored",
    "staged_graduated",
    "staged_expired",
    "stale_marked",
    "archived",
    "low_quality_archived",
    "summaries_created",
    "consolidated",
    "pruned",
    "evicted",
    "expired",
    "reclaimed",
    "reclaimed_rows",
    "links_pruned",
    "hard_deleted",
    "disputes_flagged",
    "orphans",
    "held_skipped",
)
# The one count that is a mapping: bookkeeping rows the reclaim pass removed, by kind
# (``maintenance.bookkeeping``; kinds with nothing removed are left out).
ROWS_KEY = "reclaimed_rows"
# Counts that are measurements, not changes: shown apart from what a run changed.
METRICS = ("scored", "orphans", "held_skipped")
TOMBSTONING = ("pruned", "evicted", "expired", "reclaimed")
DESTRUCTIVE = (*TOMBSTONING, "links_pruned", "hard_deleted")
BREAKER_MIN_ENTRIES = 20  # the breaker never trips for 20 tombstones or fewer
PRUNE_PARAMS = (
    "archive_older_than_days",
    "prune_older_than_days",
    "hard_delete_older_than_days",
    "importance_threshold",
    "exclude_tags",
)


class _Rollback(Exception):
    """Raised at the end of the plan to undo everything it did."""


class BackupFailed(Exception):
    pass


Step = tuple[str, Callable[[RunContext], PassResult]]


# The passes of each kind of run, in order: the count each feeds and the function that does it,
# by its name in ``maintenance.passes`` (``bookkeeping.`` names one of ``maintenance.bookkeeping``),
# looked up when a run starts. Hygiene, contradictions and compaction can each run alone, after
# scoring.
RUN_PASSES: dict[str, tuple[tuple[str, str], ...]] = {
    RunKind.HYGIENE: (("scored", "score"), ("low_quality_archived", "archive_low_quality")),
    RunKind.CONTRADICTIONS: (("scored", "score"), ("disputes_flagged", "flag_contradictions")),
    RunKind.CONSOLIDATE: (("scored", "score"), ("consolidated", "compact")),
    RunKind.PRUNE: (
        ("scored", "score"),
        ("archived", "archive_aged"),
        ("pruned", "prune"),
        ("hard_deleted", "purge"),
    ),
    RunKind.DECAY: (
        ("scored", "score"),
        ("evicted", "decay"),
        ("expired", "expire_ttl"),
        ("hard_deleted", "purge"),
    ),
    RunKind.FULL: (
        ("scored", "score"),
        ("staged_graduated", "graduate_staged"),
        ("staged_expired", "expire_staged"),
        ("stale_marked", "mark_stale"),
        ("archived", "archive"),
        ("low_quality_archived", "archive_low_quality"),
        ("consolidated", "compact"),
        ("pruned", "prune"),
        ("evicted", "decay"),
        ("expired", "expire_ttl"),
        ("reclaimed", "reclaim"),
        (ROWS_KEY, "bookkeeping.reclaim_bookkeeping"),
        ("links_pruned", "prune_links"),
        ("hard_deleted", "purge"),
        ("disputes_flagged", "flag_contradictions"),
        ("orphans", "count_orphans"),
    ),
}


def steps(kind: str) -> list[Step]:
    """The passes a run of ``kind`` executes (``RUN_PASSES``; a kind it does not name runs the
    full set), each with the count it feeds."""
    return [(key, _pass_named(name)) for key, name in RUN_PASSES.get(kind, RUN_PASSES[RunKind.FULL])]


def _pass_named(name: str) -> Callable[[RunContext], PassResult]:
    module, _, attr = name.rpartition(".")
    home = bookkeeping if module == "bookkeeping" else passes
    found: Callable[[RunContext], PassResult] = getattr(home, attr)
    return found


ARCHIVING = ("staged_expired", "archived", "low_quality_archived", "consolidated")
# The passes that, in propose mode, record proposals instead of changing entries.
PROPOSING = (*ARCHIVING, *TOMBSTONING)


def rows_done(counts: dict[str, Any]) -> int:
    """The rows a run's counts add up to (``reclaimed_rows`` is a count per kind of row)."""
    return sum(sum(v.values()) if isinstance(v, dict) else v for v in counts.values())


def empty_counts() -> dict[str, Any]:
    counts: dict[str, Any] = dict.fromkeys(COUNT_KEYS, 0)
    counts[ROWS_KEY] = {}
    return counts


class Outcome:
    """Counts and affected ids of one execution of the passes."""

    def __init__(self) -> None:
        self.counts: dict[str, Any] = empty_counts()
        self.ids: dict[str, list[int]] = {}
        self.extra: dict[str, Any] = {}
        self.values: dict[str, dict[int, dict[str, Any]]] = {}
        self.held: set[int] = set()
        # A propose-mode outcome: the proposing passes' counts are proposals, nothing they name
        # was changed.
        self.proposed = False

    def add(self, key: str, result: PassResult) -> None:
        if key == ROWS_KEY:
            rows = self.counts[ROWS_KEY]
            for kind, n in result.extra.get(ROWS_KEY, {}).items():
                rows[kind] = rows.get(kind, 0) + n
            return
        self.counts[key] += result.count
        self.ids.setdefault(key, []).extend(result.ids)
        self.values.setdefault(key, {}).update(result.values)
        for k, v in result.extra.items():
            if k in self.counts:
                self.counts[k] += v
            elif isinstance(v, list):
                self.extra.setdefault(k, []).extend(v)
            else:
                self.extra[k] = self.extra.get(k, 0) + v

    @property
    def affected(self) -> dict[str, Any]:
        """The entries changed; a propose-mode outcome changed none by archive or tombstone
        (only purges past grace) and names what it proposed instead."""
        archived = sorted(i for k in ARCHIVING for i in self.ids.get(k, []))
        tombstoned = sorted(i for k in TOMBSTONING for i in self.ids.get(k, []))
        purged = sorted(self.ids.get("hard_deleted", []))
        if self.proposed:
            return {
                "archived": [],
                "tombstoned": [],
                "purged": purged,
                "proposed": {"archive": archived, "tombstone": tombstoned},
            }
        return {"archived": archived, "tombstoned": tombstoned, "purged": purged}

    @property
    def proposals(self) -> dict[str, int]:
        return {
            "archive": sum(self.counts[k] for k in ARCHIVING),
            "tombstone": sum(self.counts[k] for k in TOMBSTONING),
        }

    @property
    def tombstones(self) -> int:
        return sum(self.counts[k] for k in TOMBSTONING)

    @property
    def destructive(self) -> int:
        return sum(self.counts[k] for k in DESTRUCTIVE)


def effective_policy(workspace: Workspace, params: dict[str, Any] | None) -> PolicyValues:
    """The policy read fresh from the database, with the caller's overrides (clamped too)."""
    policy = MaintenancePolicy.for_workspace(workspace)
    overrides: dict[str, Any] = {}
    for name, value in (params or {}).items():
        if value is None:
            continue
        if name == "exclude_tags":
            # The caller's tags add to the policy's: a request can protect more, never less.
            overrides[name] = tuple(dict.fromkeys([*policy.exclude_tags, *clean_tags(value)]))
        elif hasattr(policy, name):
            overrides[name] = clamp_value(name, value)
    return replace(policy, **overrides)


class Progress:
    """Where a run is: recorded on its row (``MaintenanceRun.progress``) once per pass — never
    per row — and announced (``maintenance.signals.run_changed``: the console pushes it to the open run page).

    ``{"phase": "plan" | "apply", "pass": <count key>, "step": i, "steps": n, "rows_done": the
    counts of the phase's finished passes added up, "elapsed_s": seconds since the run started}``.

    During the apply phase every pass commits its own batches, so the row is updated and the
    page told at once. The plan is one transaction that is rolled back: on PostgreSQL its
    progress is written from a connection of its own (committed at once, as the lease's
    ``keep_alive``; at most every ``ASIDE_EVERY`` seconds), and the page is told through it too
    (its outbox row, or straight through a shared channel layer); on SQLite the same while the
    plan works on its copy of the database (``plan_snapshot``); inside a caller's transaction
    on SQLite (the plan then holds the database's only write lock) the row says "plan" until
    the plan is over. A run started
    inside a caller's transaction (nobody else can see its row before that commits) records it
    in that transaction only."""

    def __init__(self, run: MaintenanceRun, kind: str) -> None:
        self.run = run
        self.steps = len(steps(kind))
        self.started = time.monotonic()
        self.phase = "plan"
        self.inside_caller = connection.in_atomic_block
        self.last_aside = self.started

    def state(self, key: str, step: int, rows_done: int) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "pass": key,
            "step": step,
            "steps": self.steps,
            "rows_done": rows_done,
            "elapsed_s": round(time.monotonic() - self.started, 1),
        }

    def record(self, key: str, step: int, rows_done: int) -> None:
        state = self.state(key, step, rows_done)
        self.run.progress = state
        try:
            if not connection.in_atomic_block or self.inside_caller:
                MaintenanceRun.objects.filter(pk=self.run.pk).update(progress=state)
                announce_run(self.run, "progress")
            elif (connection.vendor == "postgresql" or plan_snapshot.active()) and (
                time.monotonic() - self.last_aside >= ASIDE_EVERY
            ):
                self.last_aside = time.monotonic()
                _write_aside(self.run, state)
        except Exception:  # progress is a courtesy: it never fails the run
            log.warning("progress of run %s not recorded", self.run.pk, exc_info=True)


# Seconds between two progress writes from the side connection during the plan: a plan of a
# small workspace (most dry runs) opens none.
ASIDE_EVERY = 2.0


def _write_aside(run: MaintenanceRun, state: dict[str, Any]) -> None:
    """Update the run's progress from a connection of its own (committed at once), for a phase
    that runs inside one long transaction, and tell the run's open page."""
    import json

    side = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with side.cursor() as cursor:
            cursor.execute(
                f"UPDATE {MaintenanceRun._meta.db_table} SET progress = %s WHERE id = %s",
                [json.dumps(state), run.pk],
            )
            announce_run(run, "progress", cursor=cursor)
    finally:
        side.close()


def _execute(
    ctx: RunContext,
    kind: str,
    progress: Callable[[str], None] | None,
    *,
    skip: tuple[str, ...] = (),
    recorder: Progress | None = None,
) -> Outcome:
    outcome = Outcome()
    ctx.held = set()
    for step_no, (key, step) in enumerate(steps(kind), start=1):
        if key in skip:
            continue
        if progress is not None:
            progress(key)
        if recorder is not None:
            recorder.record(key, step_no, rows_done(outcome.counts))
        outcome.add(key, step(ctx))
    outcome.held = set(ctx.held)
    outcome.counts["held_skipped"] = len(outcome.held)
    return outcome


def _proposed(plan: Outcome, applied: Outcome) -> Outcome:
    """A propose-mode run's outcome: what it applied, and for the proposing passes the counts
    and ids a real run would have had (the plan's), which became proposals."""
    merged = Outcome()
    for key in COUNT_KEYS:
        source = plan if key in (*PROPOSING, "summaries_created") else applied
        merged.counts[key] = source.counts[key] if key != ROWS_KEY else dict(source.counts[key])
        if key in source.ids:
            merged.ids[key] = source.ids[key]
    merged.extra = plan.extra  # the plan ran every pass: candidates evaluated, evicted rows, …
    merged.proposed = True
    merged.held = plan.held | applied.held
    merged.counts["held_skipped"] = len(merged.held)
    return merged


def _plan(
    ctx: RunContext,
    kind: str,
    keep_alive: Callable[[], bool] | None = None,
    recorder: Progress | None = None,
) -> Outcome:
    """Every pass inside one transaction that is rolled back. Lease renewals inside it would be
    rolled back too (or, on SQLite, land in the plan's copy of the database), so they are
    skipped and the lease is renewed once the plan is over: a lease lost meanwhile is noticed before
    anything is applied; ``keep_alive`` renews it meanwhile from a connection of its own
    (``lease.keep_alive``: PostgreSQL, and SQLite where the plan runs on a copy of the database,
    ``plan_snapshot``), so a plan longer than the lease's TTL keeps it. The score
    pass writes the plan's scores into a temporary narrow table rather than into every entry's
    row (``scoring_db.plan_scores``)."""
    outcome: Outcome | None = None

    def renew() -> bool:
        # On SQLite only while the plan reads its copy: a plan in the database (no copy could be
        # made) holds the write lock a side renewal would wait for.
        if keep_alive is None or (connection.vendor == "sqlite" and not plan_snapshot.active()):
            return True
        return keep_alive()

    planning = replace(ctx, renew=renew, planning=True)
    statuses = plan_status.overlay() if plan_status.needed(ctx.policy.purge_grace_days) else nullcontext()
    with hygiene.plan_verdicts() as verdicts:
        try:
            with (
                plan_snapshot.snapshot(),
                transaction.atomic(),
                scoring_db.planning(),
                statuses,
                verdicts.kept(),
            ):
                outcome = _execute(planning, kind, None, recorder=recorder)
                scoring_db.drop_plan_scores()
                raise _Rollback
        except _Rollback:
            pass
        ctx.heartbeat()
        verdicts.store(on_batch=ctx.heartbeat)  # a cache of text verdicts, not a change of memory
    assert outcome is not None
    return outcome


def live_count(workspace: Workspace) -> int:
    return Entry.objects.filter(
        workspace=workspace,
        is_latest=True,
        status__in=LISTED_STATUSES,
    ).count()


def breaker_trips(outcome: Outcome, live: int, policy: PolicyValues) -> bool:
    """Passes 8–11 would tombstone more than max_tombstone_fraction of the live entries (and
    more than 20 entries)."""
    return tombstones_trip(outcome.tombstones, live, policy)


def tombstones_trip(n: int, live: int, policy: PolicyValues) -> bool:
    """The circuit breaker's rule for ``n`` tombstones among ``live`` entries (runs and approvals)."""
    return n > BREAKER_MIN_ENTRIES and live > 0 and n / live > policy.max_tombstone_fraction


# A run keeps on its row at most this many entry ids per action (``affected``, and the ids of
# a decay sweep's ``sweep`` lists in ``result``): the row that every run list reads stays small
# however much the run changed. The complete lists of a real run are its LifecycleEvents
# (``maintenance.selectors.run_affected``); a dry run changed nothing and records only these.
AFFECTED_KEPT = 200
AFFECTED_LISTS = ("archived", "tombstoned", "purged", "proposed_archive", "proposed_tombstone")


def affected_lists(affected: dict[str, Any]) -> dict[str, list[int]]:
    """The five id lists of an ``affected`` object, flat: archived, tombstoned, purged,
    proposed_archive, proposed_tombstone (missing ones empty)."""
    found_proposed = affected.get("proposed")
    proposed: dict[str, Any] = found_proposed if isinstance(found_proposed, dict) else {}
    found = {
        "archived": affected.get("archived"),
        "tombstoned": affected.get("tombstoned"),
        "purged": affected.get("purged"),
        "proposed_archive": proposed.get("archive"),
        "proposed_tombstone": proposed.get("tombstone"),
    }
    return {k: [i for i in v if isinstance(i, int)] if isinstance(v, list) else [] for k, v in found.items()}


def bounded_affected(affected: dict[str, Any]) -> dict[str, Any]:
    """``affected`` with every id list cut to its first AFFECTED_KEPT ids (rows recorded before
    runs kept a bounded sample can hold every id)."""
    return {
        key: {k: ids[:AFFECTED_KEPT] if isinstance(ids, list) else ids for k, ids in value.items()}
        if isinstance(value, dict)
        else value[:AFFECTED_KEPT]
        if isinstance(value, list)
        else value
        for key, value in affected.items()
    }


def _stored_result(result: dict[str, Any]) -> dict[str, Any]:
    """The result object as kept on the row: its id lists cut to AFFECTED_KEPT (the true
    lengths are the row's ``affected_total``; a sweep's counts are its result's
    ``hard_deleted`` and the run's counts)."""
    stored = {**result, "affected": bounded_affected(result["affected"])}
    sweep = result.get("sweep")
    if isinstance(sweep, dict):
        stored["sweep"] = {
            **sweep,
            "evicted": sweep["evicted"][:AFFECTED_KEPT],
            "expired": sweep["expired"][:AFFECTED_KEPT],
        }
    return stored


def _result(run: MaintenanceRun, outcome: Outcome | None) -> dict[str, Any]:
    counts = outcome.counts if outcome else empty_counts()
    affected = outcome.affected if outcome else {"archived": [], "tombstoned": [], "purged": []}
    return {
        "run_id": run.pk,
        "workspace": run.workspace.slug,
        "kind": run.kind,
        "dry_run": run.dry_run,
        "status": run.status,
        "backup_file": run.backup_file or None,
        "counts": dict(counts),
        "affected": affected,
    }


def _finish(
    run: MaintenanceRun,
    status: str,
    outcome: Outcome | None,
    *,
    error: str = "",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Record how the run ended and return its result object. The caller gets every affected
    id; the row keeps a bounded sample (``AFFECTED_KEPT``)."""
    run.status = status
    run.finished_at = timezone.now()
    run.error = error
    run.counts = dict(outcome.counts) if outcome else {}
    result = {**_result(run, outcome), **(extra or {})}
    if outcome is not None and status == RunStatus.PROPOSED:
        result["proposed"] = outcome.proposals
    if outcome is not None and run.kind == RunKind.DECAY:
        result["sweep"] = _decay_details(outcome, run)
    run.result = _stored_result(result)
    run.affected = run.result["affected"] if outcome else {}
    run.affected_total = {k: len(v) for k, v in affected_lists(result["affected"]).items()}
    progress = run.progress if isinstance(run.progress, dict) else {}
    run.progress = {
        **progress,
        "phase": "done",
        "rows_done": rows_done(run.counts),
        "elapsed_s": round(max(0.0, (run.finished_at - run.started_at).total_seconds()), 1),
    }
    run.save(
        update_fields=[
            "status",
            "finished_at",
            "error",
            "counts",
            "affected",
            "affected_total",
            "result",
            "progress",
        ]
    )
    announce_run(run, "finished")
    return result


def fail_abandoned_runs(workspace: Workspace, *, before: datetime, holder_run: MaintenanceRun) -> int:
    """Runs still marked running while we hold the lease were killed: say so. Queued runs that
    no worker started within ``QUEUED_GIVEN_UP_AFTER`` are given up too (``fail_lost_queued``)."""
    failed = (
        MaintenanceRun.objects.filter(workspace=workspace, status=RunStatus.RUNNING, started_at__lte=before)
        .exclude(pk=holder_run.pk)
        .update(
            status=RunStatus.FAILED,
            finished_at=timezone.now(),
            error="interrupted: the run stopped without finishing (process killed?); "
            "its committed batches stand, nothing was half-applied",
        )
    )
    return failed + fail_lost_queued(workspace=workspace)


# A queued run that no worker has started after this long is given up (its task was lost: the
# cluster is not running, or the broker dropped it): it ends ``failed`` and says so, and a
# worker that picks its task up later finds it no longer queued and does nothing.
QUEUED_GIVEN_UP_AFTER = timedelta(hours=2)
QUEUED_GIVEN_UP_ERROR = (
    "never started: no worker took this queued run within 2 hours (is the django-q2 cluster running?)"
)


def fail_lost_queued(*, workspace: Workspace | None = None, now: datetime | None = None) -> int:
    """Mark queued runs older than QUEUED_GIVEN_UP_AFTER failed (of one workspace, or all)."""
    now = now or timezone.now()
    lost = MaintenanceRun.objects.filter(status=RunStatus.QUEUED, started_at__lte=now - QUEUED_GIVEN_UP_AFTER)
    if workspace is not None:
        lost = lost.filter(workspace=workspace)
    return lost.update(status=RunStatus.FAILED, finished_at=now, error=QUEUED_GIVEN_UP_ERROR)


def _new_run(
    workspace: Workspace, kind: str, trigger: str, dry_run: bool, force: bool, actor: str, **fields: Any
) -> MaintenanceRun:
    """The row of a run that starts now (``fields``: its status when not ``running``, params)."""
    return MaintenanceRun.objects.create(
        workspace=workspace,
        kind=kind,
        trigger=trigger,
        dry_run=dry_run,
        forced=force,
        actor=actor,
        started_at=timezone.now(),
        **fields,
    )


def run_maintenance(
    *,
    workspace: Workspace,
    kind: str = RunKind.FULL,
    trigger: str = "cli",
    dry_run: bool = False,
    force: bool = False,
    now: datetime | None = None,
    actor: str = "system",
    params: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
    """Run maintenance of one kind (full, prune, decay, hygiene, contradictions, consolidate)
    on one workspace, here and now; returns the run's result object (counts and every affected id),
    also stored on the MaintenanceRun (with a bounded sample of them)."""
    if kind not in RunKind.values:
        raise ValueError(f"unknown run kind {kind!r}")
    now = now or timezone.now()
    policy = effective_policy(workspace, params if kind == RunKind.PRUNE else None)
    run = _new_run(
        workspace,
        kind,
        trigger,
        dry_run,
        force,
        actor,
        params={"now": now.isoformat(), **_policy_params(policy)},
    )
    announce_run(run, "started")
    return _run(run, now=now, policy=policy, params=params, progress=progress, batch_size=batch_size)


def queue_run(
    *,
    workspace: Workspace,
    kind: str,
    trigger: str,
    dry_run: bool = False,
    force: bool = False,
    actor: str = "system",
    params: dict[str, Any] | None = None,
) -> MaintenanceRun:
    """Record a run as ``queued`` for a worker to start (``maintenance.tasks.run_queued``). Its
    ``params`` hold the caller's parameters (``requested``) until it starts; the policy is read
    when it starts, as for any run."""
    if kind not in RunKind.values:
        raise ValueError(f"unknown run kind {kind!r}")
    requested = {k: v for k, v in (params or {}).items() if v is not None}
    run = _new_run(
        workspace,
        kind,
        trigger,
        dry_run,
        force,
        actor,
        status=RunStatus.QUEUED,
        params={"requested": requested} if requested else {},
    )
    announce_run(run, "started")
    return run


LEASE_HELD = "another run holds this workspace's lease"


def record_refused(
    *,
    workspace: Workspace,
    kind: str,
    trigger: str,
    dry_run: bool,
    force: bool,
    actor: str,
    error: str = LEASE_HELD,
) -> MaintenanceRun:
    """Record a run refused before it was queued because another run holds the workspace's
    lease (or waits in the queue for it): ``skipped``, like a run that meets the lease when it
    starts."""
    run = _new_run(workspace, kind, trigger, dry_run, force, actor)
    _finish(run, RunStatus.SKIPPED, None, error=error)
    return run


def start_queued(run: MaintenanceRun, *, batch_size: int = BATCH_SIZE) -> dict[str, Any]:
    """Execute a queued run that its worker has just claimed (status running): the policy is
    read now, and the caller's parameters come from the row."""
    requested = run.params.get("requested") if isinstance(run.params, dict) else None
    params = requested if isinstance(requested, dict) else None
    now = timezone.now()
    policy = effective_policy(run.workspace, params if run.kind == RunKind.PRUNE else None)
    run.params = {"now": now.isoformat(), **_policy_params(policy)}
    run.save(update_fields=["params"])
    announce_run(run, "started")
    return _run(run, now=now, policy=policy, params=params, progress=None, batch_size=batch_size)


def _run(
    run: MaintenanceRun,
    *,
    now: datetime,
    policy: PolicyValues,
    params: dict[str, Any] | None,
    progress: Callable[[str], None] | None,
    batch_size: int,
) -> dict[str, Any]:
    workspace, kind, dry_run, force, actor = run.workspace, run.kind, run.dry_run, run.forced, run.actor
    recorder = Progress(run, kind)
    holder = lease.new_holder()
    if not lease.acquire(workspace, holder=holder, now=timezone.now(), run=run):
        return _finish(run, RunStatus.SKIPPED, None, error=LEASE_HELD)
    try:
        fail_abandoned_runs(workspace, before=run.started_at, holder_run=run)
        ctx = RunContext(
            workspace=workspace,
            now=now,
            policy=policy,
            run=run,
            actor=actor,
            batch_size=batch_size,
            renew=lambda: lease.renew(workspace, holder=holder, now=timezone.now()),
            explicit_grace=kind == RunKind.PRUNE
            and (params or {}).get("hard_delete_older_than_days") is not None,
            details=kind == RunKind.DECAY,
        )
        # On SQLite the plan reads a copy of the database (``plan_snapshot``): the lease can
        # be renewed beside it as beside any reading phase.
        keep_alive = lease.keep_alive(workspace, holder=holder, reading=plan_snapshot.possible())
        plan = _plan(ctx, kind, keep_alive, recorder)
        recorder.phase = "apply"
        live_entries = live_count(workspace)
        blocked = breaker_trips(plan, live_entries, policy)
        proposing = policy.proposes and any(plan.counts[k] for k in PROPOSING)
        breaker = {"would_trip": blocked, "tombstones": plan.tombstones, "live": live_entries}
        if blocked and not force and not policy.proposes:
            return _finish(
                run,
                RunStatus.BLOCKED,
                plan,
                error=f"circuit breaker: {plan.tombstones} tombstones would exceed "
                f"{policy.max_tombstone_fraction:.0%} of the {live_entries} live entries; "
                "run with force to apply",
                extra={"breaker": breaker},
            )
        if dry_run:
            if proposing:
                plan.proposed = True
                return _finish(run, RunStatus.PROPOSED, plan, extra={"breaker": breaker})
            return _finish(run, RunStatus.SUCCEEDED, plan)
        backup_made = False

        def ensure_backup() -> None:
            nonlocal backup_made
            if backup_made:
                return
            # The backup reads one snapshot (a minute at 1,000,000 entries): the lease is renewed
            # from a side connection meanwhile, and checked on ours after it.
            renew = lease.keep_alive(workspace, holder=holder, reading=True)
            run.backup_file = _write_backup(workspace, now=now, run=run, renew=renew)
            run.save(update_fields=["backup_file"])
            backup_made = True
            ctx.heartbeat()

        # In propose mode only the purge and the pruning of links to already-gone ends can
        # destroy; the plan's counts of them are an upper bound, so the backup never misses.
        destructive = (
            plan.counts["hard_deleted"] + plan.counts["links_pruned"] if policy.proposes else plan.destructive
        )
        if destructive:
            try:
                ensure_backup()
            except LeaseLost:
                raise
            except Exception as exc:
                log.exception("pre-prune backup failed; run %s changes nothing", run.pk)
                return _finish(run, RunStatus.FAILED, None, error=f"pre-prune backup failed: {exc}")
        ctx.before_destructive = ensure_backup
        if not policy.proposes:
            # The apply makes its own ids and details: the plan's (a million-entry first run's
            # ids and evicted rows: ~100 MB) go before it starts, not after it ends.
            del plan
            with lifecycle.coalesced():  # open pages hear of the changes once, not once per batch
                applied = _execute(ctx, kind, progress, recorder=recorder)
            return _finish(run, RunStatus.SUCCEEDED, applied)
        # Propose mode: everything but the proposing passes applies (a purge past grace writes
        # its backup first, on demand); the proposing passes' plan becomes the proposal set.
        with lifecycle.coalesced():
            applied = _execute(ctx, kind, progress, skip=PROPOSING, recorder=recorder)
        outcome = _proposed(plan, applied)
        keys = [key for key, _ in steps(kind) if key in PROPOSING]
        recorded = proposals.record(run, plan, keys=keys, policy=policy, now=now)
        status = RunStatus.PROPOSED if recorded else RunStatus.SUCCEEDED
        return _finish(run, status, outcome, extra={"breaker": breaker})
    except LeaseLost as exc:
        return _finish(run, RunStatus.FAILED, None, error=str(exc))
    except Exception as exc:
        log.exception("maintenance run %s failed", run.pk)
        _finish(run, RunStatus.FAILED, None, error="".join(traceback.format_exception_only(exc)).strip())
        raise
    finally:
        lease.release(workspace, holder=holder)


def _write_backup(
    workspace: Workspace, *, now: datetime, run: MaintenanceRun, renew: Callable[[], bool] | None = None
) -> str:
    def progress(_rows: int) -> None:
        if renew is not None:
            renew()

    backup = backups.write_backup(workspace, reason="pre-prune", now=now, run=run, progress=progress)
    return backup.file_name


def _policy_params(policy: PolicyValues) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(policy)
    data["exclude_tags"] = list(policy.exclude_tags)
    return data


def _decay_details(outcome: Outcome, run: MaintenanceRun) -> dict[str, Any]:
    now = datetime.fromisoformat(run.params["now"])
    return {
        "candidates_evaluated": outcome.extra.get("candidates_evaluated", 0),
        "evicted": [
            {
                "id": r["id"],
                "retention": r["retention"],
                "age_days": max(0.0, (now - r["created_at"]).total_seconds() / 86400),
                "access_count": r["access_count"],
            }
            for r in outcome.extra.get("evicted_rows", [])
        ],
        "expired": [
            {"id": r["id"], "expired_at": r["expires_at"].isoformat()}
            for r in outcome.extra.get("expired_rows", [])
        ],
    }


def decay_result(result: dict[str, Any]) -> dict[str, Any]:
    """A decay sweep's result as POST /maintenance/sweep-decay and ``sweep_decay --json`` return it."""
    sweep = result.get("sweep") or {"candidates_evaluated": 0, "evicted": [], "expired": []}
    return {
        "dry_run": result["dry_run"],
        "candidates_evaluated": sweep["candidates_evaluated"],
        "evicted": sweep["evicted"],
        "expired": sweep["expired"],
        "hard_deleted": result["counts"]["hard_deleted"],
        "run_id": result["run_id"],
        "status": result["status"],
    }


def prune_result(result: dict[str, Any]) -> dict[str, Any]:
    """A prune run's result as POST /maintenance/prune and ``prune --json`` return it."""
    counts = result["counts"]
    return {
        "success": result["status"] in (RunStatus.SUCCEEDED, RunStatus.PROPOSED),
        "archived_count": counts["archived"],
        "pruned_count": counts["pruned"],
        "hard_deleted_count": counts["hard_deleted"],
        "backup_file": result["backup_file"],
        "dry_run": result["dry_run"],
        "run_id": result["run_id"],
        "status": result["status"],
    }


# --- dry runs in the request -------------------------------------------------------------

INLINE_DRY_RUN_MAX_ENTRIES = 2000


def inline_dry_run_max() -> int:
    """Latest entries up to which a dry run is worked in the request (setting
    ``MAINTENANCE_INLINE_DRY_RUN_MAX_ENTRIES``)."""
    return int(getattr(settings, "MAINTENANCE_INLINE_DRY_RUN_MAX_ENTRIES", INLINE_DRY_RUN_MAX_ENTRIES))


def runs_inline(workspace: Any, *, dry_run: bool) -> bool:
    """A dry run of a small workspace is worked in the request; everything else is queued. The
    count stops at the limit: one bounded query however large the workspace is."""
    if not dry_run:
        return False
    limit = inline_dry_run_max()
    return (
        Entry.objects.filter(workspace=workspace, is_latest=True).values("pk")[: limit + 1].count() <= limit
    )
