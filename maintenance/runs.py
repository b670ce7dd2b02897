"""Maintenance runs (SPEC §4.1, §4.2): the full run and the partial prune and decay sweeps.

A run records a MaintenanceRun, takes the workspace's lease (or is recorded ``skipped``), marks
runs killed earlier as ``failed``, and then works in two phases:

1. **Plan.** Every pass runs inside one transaction that is rolled back at the end. This gives
   the exact counts and ids the run would produce — it *is* the dry run, so a dry run and a
   real run at the same ``now`` agree by construction — and decides the circuit breaker
   before anything is changed.
2. **Apply** (real runs that are not blocked). The pre-prune backup is written first when the
   plan will change rows in a destructive pass (8–13); a failed backup fails the run with
   nothing changed. Then every pass runs for real, one transaction per batch, renewing the
   lease after every batch. Should the data move between plan and apply so that a destructive
   pass finds rows the plan did not, the backup is written just before that pass's first
   batch: nothing is ever purged or tombstoned without a backup that contains it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from maintenance import backups, lease, passes
from maintenance.models import MaintenancePolicy, MaintenanceRun, RunKind, RunStatus
from maintenance.passes import LeaseLost, PassResult, RunContext
from maintenance.policy import PolicyValues, clamp_value, clean_tags
from memory import live
from memory.models import Entry, Status, Workspace

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
    "links_pruned",
    "hard_deleted",
    "disputes_flagged",
    "orphans",
)
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


def steps(kind: str) -> list[Step]:
    """The passes of each kind of run, in order, each with the count it feeds. Hygiene,
    contradictions and compaction can each run alone, after scoring (SPEC §4.2)."""
    if kind == RunKind.HYGIENE:
        return [("scored", passes.score), ("low_quality_archived", passes.archive_low_quality)]
    if kind == RunKind.CONTRADICTIONS:
        return [("scored", passes.score), ("disputes_flagged", passes.flag_contradictions)]
    if kind == RunKind.CONSOLIDATE:
        return [("scored", passes.score), ("consolidated", passes.compact)]
    if kind == RunKind.PRUNE:
        return [
            ("scored", passes.score),
            ("archived", lambda ctx: passes.archive(ctx, stale_part=False)),
            ("pruned", passes.prune),
            ("hard_deleted", passes.purge),
        ]
    if kind == RunKind.DECAY:
        return [
            ("scored", passes.score),
            ("evicted", passes.decay),
            ("expired", passes.expire_ttl),
            ("hard_deleted", passes.purge),
        ]
    return [
        ("scored", passes.score),
        ("staged_graduated", passes.graduate_staged),
        ("staged_expired", passes.expire_staged),
        ("stale_marked", passes.mark_stale),
        ("archived", passes.archive),
        ("low_quality_archived", passes.archive_low_quality),
        ("consolidated", passes.compact),
        ("pruned", passes.prune),
        ("evicted", passes.decay),
        ("expired", passes.expire_ttl),
        ("reclaimed", passes.reclaim),
        ("links_pruned", passes.prune_links),
        ("hard_deleted", passes.purge),
        ("disputes_flagged", passes.flag_contradictions),
        ("orphans", passes.count_orphans),
    ]


ARCHIVING = ("staged_expired", "archived", "low_quality_archived", "consolidated")


class Outcome:
    """Counts and affected ids of one execution of the passes."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(COUNT_KEYS, 0)
        self.ids: dict[str, list[int]] = {}
        self.extra: dict[str, Any] = {}

    def add(self, key: str, result: PassResult) -> None:
        self.counts[key] += result.count
        self.ids.setdefault(key, []).extend(result.ids)
        for k, v in result.extra.items():
            if k in self.counts:
                self.counts[k] += v
            elif isinstance(v, list):
                self.extra.setdefault(k, []).extend(v)
            else:
                self.extra[k] = self.extra.get(k, 0) + v

    @property
    def affected(self) -> dict[str, list[int]]:
        return {
            "archived": sorted(i for k in ARCHIVING for i in self.ids.get(k, [])),
            "tombstoned": sorted(i for k in TOMBSTONING for i in self.ids.get(k, [])),
            "purged": sorted(self.ids.get("hard_deleted", [])),
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


def _execute(ctx: RunContext, kind: str, progress: Callable[[str], None] | None) -> Outcome:
    outcome = Outcome()
    for key, step in steps(kind):
        if progress is not None:
            progress(key)
        outcome.add(key, step(ctx))
    return outcome


def _plan(ctx: RunContext, kind: str) -> Outcome:
    """Every pass inside one transaction that is rolled back. Lease renewals inside it would be
    rolled back too (and on SQLite would only lengthen the write lock), so they are skipped
    and the lease is renewed once the plan is over: a lease lost meanwhile is noticed before
    anything is applied."""
    outcome: Outcome | None = None
    planning = replace(ctx, renew=lambda: True)
    try:
        with transaction.atomic():
            outcome = _execute(planning, kind, None)
            raise _Rollback
    except _Rollback:
        pass
    ctx.heartbeat()
    assert outcome is not None
    return outcome


def _live_count(workspace: Workspace) -> int:
    return Entry.objects.filter(
        workspace=workspace,
        is_latest=True,
        status__in=[Status.STAGED, Status.ACTIVE, Status.STALE, Status.ARCHIVED],
    ).count()


def breaker_trips(outcome: Outcome, live: int, policy: PolicyValues) -> bool:
    """Passes 8–11 would tombstone more than max_tombstone_fraction of the live entries (and
    more than 20 entries)."""
    n = outcome.tombstones
    return n > BREAKER_MIN_ENTRIES and live > 0 and n / live > policy.max_tombstone_fraction


def _result(run: MaintenanceRun, outcome: Outcome | None) -> dict[str, Any]:
    counts = outcome.counts if outcome else dict.fromkeys(COUNT_KEYS, 0)
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


def _finish(run: MaintenanceRun, status: str, outcome: Outcome | None, *, error: str = "") -> dict[str, Any]:
    run.status = status
    run.finished_at = timezone.now()
    run.error = error
    run.counts = dict(outcome.counts) if outcome else {}
    run.affected = outcome.affected if outcome else {}
    run.result = _result(run, outcome)
    if outcome is not None and run.kind == RunKind.DECAY:
        run.result["sweep"] = _decay_details(outcome, run)
    run.save(update_fields=["status", "finished_at", "error", "counts", "affected", "result"])
    live.run_finished(run)
    return run.result


def fail_abandoned_runs(workspace: Workspace, *, before: datetime, holder_run: MaintenanceRun) -> int:
    """Runs still marked running while we hold the lease were killed: say so."""
    return (
        MaintenanceRun.objects.filter(workspace=workspace, status=RunStatus.RUNNING, started_at__lte=before)
        .exclude(pk=holder_run.pk)
        .update(
            status=RunStatus.FAILED,
            finished_at=timezone.now(),
            error="interrupted: the run stopped without finishing (process killed?); "
            "its committed batches stand, nothing was half-applied",
        )
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
    batch_size: int = passes.BATCH_SIZE,
) -> dict[str, Any]:
    """Run maintenance of one kind (full, prune, decay, hygiene, contradictions, consolidate)
    on one workspace; returns the SPEC §4.1 result object, also stored on the MaintenanceRun."""
    if kind not in RunKind.values:
        raise ValueError(f"unknown run kind {kind!r}")
    now = now or timezone.now()
    policy = effective_policy(workspace, params if kind == RunKind.PRUNE else None)
    run = MaintenanceRun.objects.create(
        workspace=workspace,
        kind=kind,
        trigger=trigger,
        dry_run=dry_run,
        forced=force,
        actor=actor,
        started_at=timezone.now(),
        params={"now": now.isoformat(), **_policy_params(policy)},
    )
    live.run_started(run)
    holder = lease.new_holder()
    if not lease.acquire(workspace, holder=holder, now=timezone.now(), run=run):
        return _finish(run, RunStatus.SKIPPED, None, error="another run holds this workspace's lease")
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
        )
        plan = _plan(ctx, kind)
        blocked = breaker_trips(plan, _live_count(workspace), policy)
        if blocked and not force:
            return _finish(
                run,
                RunStatus.BLOCKED,
                plan,
                error=f"circuit breaker: {plan.tombstones} tombstones would exceed "
                f"{policy.max_tombstone_fraction:.0%} of the live entries; run with force to apply",
            )
        if dry_run:
            return _finish(run, RunStatus.SUCCEEDED, plan)
        backup_made = False

        def ensure_backup() -> None:
            nonlocal backup_made
            if backup_made:
                return
            run.backup_file = _write_backup(workspace, now=now, run=run)
            run.save(update_fields=["backup_file"])
            backup_made = True

        if plan.destructive:
            try:
                ensure_backup()
            except Exception as exc:
                log.exception("pre-prune backup failed; run %s changes nothing", run.pk)
                return _finish(run, RunStatus.FAILED, None, error=f"pre-prune backup failed: {exc}")
        ctx.before_destructive = ensure_backup
        outcome = _execute(ctx, kind, progress)
        return _finish(run, RunStatus.SUCCEEDED, outcome)
    except LeaseLost as exc:
        return _finish(run, RunStatus.FAILED, None, error=str(exc))
    except Exception as exc:
        log.exception("maintenance run %s failed", run.pk)
        _finish(run, RunStatus.FAILED, None, error="".join(traceback.format_exception_only(exc)).strip())
        raise
    finally:
        lease.release(workspace, holder=holder)


def _write_backup(workspace: Workspace, *, now: datetime, run: MaintenanceRun) -> str:
    backup = backups.write_backup(workspace, reason="pre-prune", now=now, run=run)
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
    """The SPEC §4.2 shape of a decay sweep."""
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
    """The SPEC §4.2 shape of a prune run."""
    counts = result["counts"]
    return {
        "success": result["status"] == RunStatus.SUCCEEDED,
        "archived_count": counts["archived"],
        "pruned_count": counts["pruned"],
        "hard_deleted_count": counts["hard_deleted"],
        "backup_file": result["backup_file"],
        "dry_run": result["dry_run"],
        "run_id": result["run_id"],
        "status": result["status"],
    }
