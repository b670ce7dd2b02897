"""The bookkeeping reclaims itself (the second half of pass 11, ``reclaim``).

Runs that changed nothing are folded into per-day counts (``RunDaySummary``) after
``NOOP_KEEP_DAYS``; past the policy's ``audit_retention_days`` the records of purged lineages,
runs nothing refers to and the day counts are removed. Invariants: nothing an operator can
still revert is removed (an event goes only once its entry is purged; a run only when no
event, Tombstone, pruned link, open proposal or open dispute refers to it); the newest run of
each (kind, status, dry run) stays, for the dispatcher and the dashboard; a dry run removes
nothing and reports what the real run removes. No backup: no memory is removed. What is kept
and for how long: docs/maintenance.md ("What the bookkeeping keeps").
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, Max, OuterRef, Q, QuerySet

from maintenance.models import (
    Dispute,
    DisputeStatus,
    MaintenanceRun,
    Proposal,
    ProposalStatus,
    RunDaySummary,
    RunStatus,
)
from maintenance.pass_tools import PassResult, RunContext
from maintenance.run_results import COUNT_KEYS, METRICS
from memory.models import LifecycleEvent, Relationship, Tombstone

NOOP_KEEP_DAYS = 7
MAX_BATCHES = 20
# The kinds of rows the pass reports, in the order it removes them.
ROW_KINDS = ("folded_runs", "tombstones", "lifecycle_events", "proposals", "runs", "run_days")
# Real runs with one of these statuses are folded when they changed nothing; a dry run (which
# changes nothing by definition) also when it ended blocked or proposed. Failed runs keep their
# error, blocked real runs their breaker message, until the audit retention.
FOLDED_REAL = (RunStatus.SUCCEEDED, RunStatus.SKIPPED)
FOLDED_DRY = (RunStatus.SUCCEEDED, RunStatus.SKIPPED, RunStatus.PROPOSED, RunStatus.BLOCKED)


def reclaim_bookkeeping(ctx: RunContext) -> PassResult:
    """Fold week-old runs that changed nothing; past the audit retention, remove the records
    of purged lineages, runs nothing refers to and old day counts. ``PassResult.reclaimed_rows``
    holds the rows removed per kind."""
    removed: Counter[str] = Counter()
    keep = newest_runs(ctx)
    removed["folded_runs"] = _fold(ctx, keep)
    days = ctx.policy.audit_retention_days
    if days > 0:
        cutoff = ctx.now - timedelta(days=days)
        removed["tombstones"] = _delete(ctx, purged_tombstones(ctx, cutoff))
        removed["lifecycle_events"] = _delete(ctx, purged_events(ctx, cutoff))
        runs, proposals = _delete_runs(ctx, cutoff, keep)
        removed["runs"], removed["proposals"] = runs, proposals
        removed["run_days"] = _delete(
            ctx, RunDaySummary.objects.filter(workspace=ctx.workspace, day__lt=_day(cutoff))
        )
    rows = {kind: removed[kind] for kind in ROW_KINDS if removed[kind]}
    return PassResult(count=sum(rows.values()), reclaimed_rows=rows)


def _day(moment: datetime) -> date:
    return moment.astimezone(UTC).date()


# --- what stays ---------------------------------------------------------------------------------


def newest_runs(ctx: RunContext) -> set[int]:
    """The newest run of each (kind, status, dry run) of the workspace: never folded or
    removed. Two queries: the latest start of each group (one GROUP BY), then the runs that
    started then (a tie keeps both)."""
    runs = MaintenanceRun.objects.filter(workspace=ctx.workspace)
    latest = runs.values("kind", "status", "dry_run").annotate(last=Max("started_at")).order_by()
    match = Q(pk__in=[])
    for group in latest:
        match |= Q(
            kind=group["kind"], status=group["status"], dry_run=group["dry_run"], started_at=group["last"]
        )
    return set(runs.filter(match).values_list("pk", flat=True))


def unreferenced(runs: QuerySet[MaintenanceRun]) -> QuerySet[MaintenanceRun]:
    """The runs of ``runs`` nothing refers to: no event (an event of a live entry may still be
    reverted), no Tombstone, no link it pruned, no open proposal or dispute. (A backup row
    outlives its run: it only loses the link to it.)"""
    run = OuterRef("pk")
    return runs.exclude(
        Exists(LifecycleEvent.objects.filter(run=run))
        | Exists(Tombstone.objects.filter(run=run))
        | Exists(Relationship.objects.filter(pruned_by_run=run))
        | Exists(Proposal.objects.filter(run=run, status=ProposalStatus.OPEN))
        | Exists(Dispute.objects.filter(run=run, status=DisputeStatus.OPEN))
    )


# --- folding runs that changed nothing ----------------------------------------------------------


def changed_nothing(counts: Any) -> bool:
    """A real run's counts say it changed nothing (metrics aside); a skipped run has none."""
    if not isinstance(counts, dict):
        return True
    for key in COUNT_KEYS:
        if key in METRICS:
            continue
        value = counts.get(key)
        if isinstance(value, dict):
            if any(value.values()):
                return False
        elif value:
            return False
    return True


def fold_candidates(ctx: RunContext, keep: set[int]) -> QuerySet[MaintenanceRun]:
    cutoff = ctx.now - timedelta(days=NOOP_KEEP_DAYS)
    runs = MaintenanceRun.objects.filter(workspace=ctx.workspace, started_at__lt=cutoff).filter(
        Q(dry_run=False, status__in=FOLDED_REAL) | Q(dry_run=True, status__in=FOLDED_DRY)
    )
    return unreferenced(runs.exclude(pk__in=keep))


def _fold(ctx: RunContext, keep: set[int]) -> int:
    candidates = fold_candidates(ctx, keep)
    folded = 0
    last = 0
    for _ in range(MAX_BATCHES):
        with transaction.atomic():
            rows = list(
                candidates.filter(pk__gt=last)
                .order_by("pk")
                .values("pk", "kind", "status", "dry_run", "started_at", "counts")[: ctx.batch_size]
            )
            if not rows:
                break
            last = rows[-1]["pk"]
            # A real run that succeeded folds only when its counts say it changed nothing
            # (a run whose only change left no row, e.g. bookkeeping it removed, stays).
            rows = [r for r in rows if r["dry_run"] or changed_nothing(r["counts"])]
            if rows:
                _add_to_days(
                    ctx, Counter((_day(r["started_at"]), r["kind"], r["status"], r["dry_run"]) for r in rows)
                )
                MaintenanceRun.objects.filter(pk__in=[r["pk"] for r in rows]).delete()
                folded += len(rows)
        ctx.heartbeat()
    return folded


def _add_to_days(ctx: RunContext, groups: Counter[tuple[date, str, str, bool]]) -> None:
    """Add each group's count to its day row (one read, one insert, one update at most: the
    lease keeps any other run of the workspace away meanwhile)."""
    days = {day for day, *_ in groups}
    existing = {
        (row.day, row.kind, row.status, row.dry_run): row
        for row in RunDaySummary.objects.filter(workspace=ctx.workspace, day__in=days)
    }
    changed = []
    for key, n in groups.items():
        if key in existing:
            existing[key].runs += n
            changed.append(existing[key])
    RunDaySummary.objects.bulk_update(changed, ["runs"])
    RunDaySummary.objects.bulk_create(
        RunDaySummary(workspace=ctx.workspace, day=day, kind=kind, status=status, dry_run=dry, runs=n)
        for (day, kind, status, dry), n in groups.items()
        if (day, kind, status, dry) not in existing
    )


# --- past the audit retention -------------------------------------------------------------------


def purged_tombstones(ctx: RunContext, cutoff: datetime) -> QuerySet[Tombstone]:
    """Content-free records of lineages purged before ``cutoff`` (a purge is final)."""
    return Tombstone.objects.filter(workspace=ctx.workspace, purged_at__isnull=False, purged_at__lt=cutoff)


def purged_events(ctx: RunContext, cutoff: datetime) -> QuerySet[LifecycleEvent]:
    """Events older than ``cutoff`` whose entry is gone: its lineage was purged (the only way an
    entry row is deleted), so nothing of it can be reverted any more."""
    return LifecycleEvent.objects.filter(workspace=ctx.workspace, entry__isnull=True, created_at__lt=cutoff)


def retired_runs(ctx: RunContext, cutoff: datetime, keep: set[int]) -> QuerySet[MaintenanceRun]:
    """Finished runs started before ``cutoff`` that nothing refers to any more."""
    runs = MaintenanceRun.objects.filter(workspace=ctx.workspace, started_at__lt=cutoff).exclude(
        status=RunStatus.RUNNING
    )
    return unreferenced(runs.exclude(pk__in=keep))


def _delete(ctx: RunContext, rows: QuerySet[Any]) -> int:
    """Delete ``rows`` in keyset batches of ids; how many went."""
    deleted = 0
    last = 0
    for _ in range(MAX_BATCHES):
        with transaction.atomic():
            ids = list(rows.filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[: ctx.batch_size])
            if not ids:
                break
            last = ids[-1]
            deleted += rows.model.objects.filter(pk__in=ids).delete()[1].get(rows.model._meta.label, 0)
        ctx.heartbeat()
    return deleted


def _delete_runs(ctx: RunContext, cutoff: datetime, keep: set[int]) -> tuple[int, int]:
    """Remove the retired runs with their closed proposals; (runs, proposals) removed."""
    candidates = retired_runs(ctx, cutoff, keep)
    runs = proposals = 0
    last = 0
    for _ in range(MAX_BATCHES):
        with transaction.atomic():
            ids = list(
                candidates.filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[: ctx.batch_size]
            )
            if not ids:
                break
            last = ids[-1]
            proposals += Proposal.objects.filter(run_id__in=ids).delete()[1].get(Proposal._meta.label, 0)
            runs += MaintenanceRun.objects.filter(pk__in=ids).delete()[1].get(MaintenanceRun._meta.label, 0)
        ctx.heartbeat()
    return runs, proposals
