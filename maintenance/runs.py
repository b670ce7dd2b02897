"""A maintenance run once its row exists: the lease, the plan, the breaker and the apply.

A run takes the workspace's lease (or ends ``skipped``), marks runs killed earlier ``failed``
(and queued runs no worker started for hours), then works in two phases, recording where it is
once per pass (``Progress``):

1. **Plan.** Every pass runs inside one transaction that is rolled back (the orphan count, a
   metric, only where the run ends with its plan: ``_plan_counts_orphans``): the exact counts and
   ids the run would produce — it *is* the dry run — and the circuit breaker's verdict, before
   anything changes. Scores go to a temporary table (``scoring_db.plan_scores``) and statuses
   beside the entries (``plan_status``), so the entries stay unlocked for the API; the lease is
   kept alive from a connection of its own. The text verdicts it makes are stored afterwards
   (``hygiene.PlanVerdicts``), a cache, not a change.
2. **Apply** (real runs not blocked): the pre-prune backup first when a destructive pass (8–13)
   will change rows — a failed backup fails the run with nothing changed — then every pass for
   real, one transaction per batch. Should a destructive pass find rows the plan did not, the
   backup is written before its first batch: nothing is tombstoned or purged without a backup.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from maintenance import backups, bookkeeping, hygiene, lease, passes, plan_snapshot, plan_status, proposals
from maintenance.models import MaintenanceRun, RunKind, RunStatus
from maintenance.pass_tools import LeaseLost, PassResult, RunContext
from maintenance.run_results import (
    COUNT_KEYS,
    PROPOSING,
    ROWS_KEY,
    Outcome,
    affected_lists,
    breaker_trips,
    empty_counts,
    live_count,
    rows_done,
    stored_result,
)
from maintenance.signals import announce_run
from memory import lifecycle, scoring_db
from memory.models import Workspace
from memory.policy import PolicyValues

log = logging.getLogger(__name__)


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
    counts_orphans: Callable[[Outcome], bool] | None = None,
) -> Outcome:
    """Every pass of ``kind`` in order but those in ``skip``; the orphan count (a metric,
    the last pass) only where ``counts_orphans`` says yes, given what the passes before it did."""
    outcome = Outcome()
    ctx.held, ctx.any_held = set(), None
    for step_no, (key, step) in enumerate(steps(kind), start=1):
        if key in skip or (key == "orphans" and counts_orphans is not None and not counts_orphans(outcome)):
            continue
        if progress is not None:
            progress(key)
        if recorder is not None:
            recorder.record(key, step_no, outcome.rows_done())
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
        if key == ROWS_KEY:
            merged.reclaimed_rows = dict(source.reclaimed_rows)
        else:
            merged.counts[key] = source.counts[key]
        if key in source.ids:
            merged.ids[key] = source.ids[key]
    # The plan ran every pass: candidates evaluated, evicted rows, …
    merged.evaluated, merged.rows = plan.evaluated, plan.rows
    merged.proposed = True
    merged.held = plan.held | applied.held
    merged.counts["held_skipped"] = len(merged.held)
    return merged


def _plan(
    ctx: RunContext,
    kind: str,
    keep_alive: Callable[[], bool] | None = None,
    recorder: Progress | None = None,
    counts_orphans: Callable[[Outcome], bool] | None = None,
    skip: tuple[str, ...] = (),
) -> Outcome:
    """Every pass (but those in ``skip``) inside one transaction that is rolled back. Lease
    renewals inside it would be rolled back too (or, on SQLite, land in the plan's copy of the
    database), so they are skipped and the lease is renewed once the plan is over: a lease lost
    meanwhile is noticed before anything is applied; ``keep_alive`` renews it meanwhile from a
    connection of its own (``lease.keep_alive``: PostgreSQL, and SQLite where the plan runs on a
    copy of the database, ``plan_snapshot``), so a plan longer than the lease's TTL keeps it.
    The score pass writes the plan's scores into a temporary narrow table rather than into every
    entry's row (``scoring_db.plan_scores``). ``counts_orphans``: whether the plan counts
    orphans (``_plan_counts_orphans``)."""
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
                outcome = _execute(
                    planning, kind, None, skip=skip, recorder=recorder, counts_orphans=counts_orphans
                )
                scoring_db.drop_plan_scores()
                raise _Rollback
        except _Rollback:
            pass
        ctx.heartbeat()
        verdicts.store(on_batch=ctx.heartbeat)  # a cache of text verdicts, not a change of memory
    assert outcome is not None
    return outcome


def _result(run: MaintenanceRun, outcome: Outcome | None) -> dict[str, Any]:
    counts = outcome.recorded_counts() if outcome else empty_counts()
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


def finish_run(
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
    run.counts = outcome.recorded_counts() if outcome else {}
    result = {**_result(run, outcome), **(extra or {})}
    if outcome is not None and status == RunStatus.PROPOSED:
        result["proposed"] = outcome.proposals
    if outcome is not None and run.kind == RunKind.DECAY:
        result["sweep"] = _decay_details(outcome, run)
    run.result = stored_result(result)
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


LEASE_HELD = "another run holds this workspace's lease"


def execute_run(
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
        return finish_run(run, RunStatus.SKIPPED, None, error=LEASE_HELD)
    scratch = ExitStack()  # what the run keeps until it ends (the scores computed once)
    try:
        fail_abandoned_runs(workspace, before=run.started_at, holder_run=run)
        ctx = RunContext(
            workspace=workspace,
            now=now,
            policy=policy,
            run=run,
            actor=actor,
            batch_size=batch_size,
            renew=lease.renewer(workspace, holder=holder),
            explicit_grace=kind == RunKind.PRUNE
            and (params or {}).get("hard_delete_older_than_days") is not None,
            details=kind == RunKind.DECAY,
        )
        # On SQLite the plan reads a copy of the database (``plan_snapshot``): the lease can
        # be renewed beside it as beside any reading phase.
        keep_alive = lease.keep_alive(workspace, holder=holder, reading=plan_snapshot.possible())
        twice = not dry_run or policy.proposes  # a propose-mode dry run may plan twice (below)
        if twice and not plan_snapshot.possible() and any(key == "scored" for key, _ in steps(kind)):
            # The plan and the apply (or a propose-mode dry run's two plans) score the same
            # entries at the same ``now``: computed once.
            scratch.enter_context(
                scoring_db.scores_once(
                    workspace,
                    now=now,
                    params=policy.decay_params,
                    live_since=now,
                    settle=passes.settle(policy),
                )
            )
            ctx.heartbeat()
        # The breaker's live entries, read before the plan: the plan then knows before its
        # last pass whether the run ends with it (``_plan_counts_orphans``).
        live_entries = live_count(workspace)
        counts_orphans = partial(_plan_counts_orphans, dry_run, force, policy, live_entries)
        plan = _plan(ctx, kind, keep_alive, recorder, counts_orphans)
        recorder.phase = "apply"
        blocked = breaker_trips(plan, live_entries, policy)
        proposing = policy.proposes and any(plan.counts[k] for k in PROPOSING)
        breaker = {"would_trip": blocked, "tombstones": plan.tombstones, "live": live_entries}
        if _stopped_by_breaker(plan, live_entries, policy, force):
            return finish_run(
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
                # What the real run would report: the proposals as the plan made them, and what
                # every other pass does with the proposals NOT applied (the plan above applied
                # them: its orphans, links and purges are not the real run's), planned again
                # without the proposing passes, as the real run applies it below.
                # The stale marks are the first plan's: only graduation and the staged
                # traces' expiry come before them, and neither changes an active entry.
                again = replace(ctx, replayed={"stale_marked": plan.ids.get("stale_marked", [])})
                rest = _plan(again, kind, keep_alive, recorder, counts_orphans, skip=PROPOSING)
                return finish_run(run, RunStatus.PROPOSED, _proposed(plan, rest), extra={"breaker": breaker})
            return finish_run(run, RunStatus.SUCCEEDED, plan)
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

        # In propose mode only the purge and the pruning of links whose ends are gone already
        # can destroy: no pass that applies archives or tombstones. The plan's purge count is
        # the apply's; its link count is not (the plan applied the proposals, and pruned the
        # links between the entries it tombstoned), so the links are asked as they are now. A
        # link that goes meanwhile (an operator archives both ends) has its backup written on
        # demand (``before_destructive``). At 1,000,000 entries a full run's plan counted
        # ~2,000 such links, none of them prunable, and each run wrote a backup for nothing.
        prunes_links = any(key == "links_pruned" for key, _ in steps(kind))
        destructive = (
            plan.counts["hard_deleted"] or (prunes_links and passes.prunable_links(workspace).exists())
            if policy.proposes
            else plan.destructive
        )
        if destructive:
            try:
                ensure_backup()
            except LeaseLost:
                raise
            except Exception as exc:
                log.exception("pre-prune backup failed; run %s changes nothing", run.pk)
                return finish_run(run, RunStatus.FAILED, None, error=f"pre-prune backup failed: {exc}")
        ctx.before_destructive = ensure_backup
        if not policy.proposes:
            # The apply walks the plan's ids of the passes that change one candidate set
            # (``pass_tools.planned``) and makes its own details: the rest of the plan (a
            # million-entry first run's evicted rows: most of ~100 MB) goes before it starts.
            ctx.planned_ids, held = plan.ids, plan.held
            del plan
            with lifecycle.coalesced():  # open pages hear of the changes once, not once per batch
                applied = _execute(ctx, kind, progress, recorder=recorder)
            # The held entries a pass that walks only its plan's ids no longer sees.
            applied.held |= held
            applied.counts["held_skipped"] = len(applied.held)
            return finish_run(run, RunStatus.SUCCEEDED, applied)
        # Propose mode: everything but the proposing passes applies (a purge past grace writes
        # its backup first, on demand); the proposing passes' plan becomes the proposal set.
        with lifecycle.coalesced():
            applied = _execute(ctx, kind, progress, skip=PROPOSING, recorder=recorder)
        outcome = _proposed(plan, applied)
        keys = [key for key, _ in steps(kind) if key in PROPOSING]
        recorded = proposals.record(run, plan, keys=keys, policy=policy, now=now)
        status = RunStatus.PROPOSED if recorded else RunStatus.SUCCEEDED
        return finish_run(run, status, outcome, extra={"breaker": breaker})
    except LeaseLost as exc:
        return finish_run(run, RunStatus.FAILED, None, error=str(exc))
    except Exception as exc:
        log.exception("maintenance run %s failed", run.pk)
        finish_run(run, RunStatus.FAILED, None, error="".join(traceback.format_exception_only(exc)).strip())
        raise
    finally:
        _usable_connection()
        scratch.close()
        lease.release(workspace, holder=holder)


def _plan_counts_orphans(
    dry_run: bool, force: bool, policy: PolicyValues, live: int, so_far: Outcome
) -> bool:
    """Whether a run's plan counts orphans (the last pass, a metric), given its passes so far
    (the tombstoning passes 8–11 among them) and the breaker's ``live`` entries. Only a run
    that ends with its plan reads that count: a dry run, and a run the circuit breaker blocks
    (apply mode, not forced). A run that applies reports its apply's count (propose mode
    too: orphans is not a proposing pass), so its plan's was 1.7–2.4 s of a first run at
    1,000,000 entries for nothing (bench/reports/maintenance.md, "What a first run must
    write")."""
    return dry_run or _stopped_by_breaker(so_far, live, policy, force)


def _stopped_by_breaker(outcome: Outcome, live: int, policy: PolicyValues, force: bool) -> bool:
    """Whether a run whose plan did ``outcome`` ends there, ``blocked``: the breaker trips, in
    apply mode (propose mode proposes instead), and the run is not forced."""
    return not force and not policy.proposes and breaker_trips(outcome, live, policy)


def _usable_connection() -> None:
    """After a run was interrupted (``tasks.WorkerStopping``): a stop that lands while psycopg
    is sending a statement, rather than waiting for its result, leaves the session busy with
    that statement ("another command is already in progress"), and the way out — dropping the
    run's temporary table, releasing the lease — could not use it. Such a session is closed
    (its temporary tables go with it); the way out opens a new one."""
    raw = connection.connection
    if connection.vendor != "postgresql" or raw is None:
        return
    if raw.info.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
        log.warning("the run's database session was left mid-statement: closing it")
        connection.close()


def _write_backup(
    workspace: Workspace, *, now: datetime, run: MaintenanceRun, renew: Callable[[], bool] | None = None
) -> str:
    def progress(_rows: int) -> None:
        if renew is not None:
            renew()

    backup = backups.write_backup(workspace, reason="pre-prune", now=now, run=run, progress=progress)
    return backup.file_name


def _decay_details(outcome: Outcome, run: MaintenanceRun) -> dict[str, Any]:
    now = datetime.fromisoformat(run.params["now"])
    return {
        "candidates_evaluated": outcome.evaluated,
        "evicted": [
            {
                "id": r["id"],
                "retention": r["retention"],
                "age_days": max(0.0, (now - r["created_at"]).total_seconds() / 86400),
                "access_count": r["access_count"],
            }
            for r in outcome.rows.get("evicted", [])
        ],
        "expired": [
            {"id": r["id"], "expired_at": r["expires_at"].isoformat()}
            for r in outcome.rows.get("expired", [])
        ],
    }
