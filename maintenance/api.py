"""The maintenance endpoints of the agent API (SPEC §5): runs, their history and revert,
tombstones, backups, stats and the policy.

Every endpoint first calls ``require`` with its minimum role. Runs are started synchronously
and answer with their result object whatever their status: ``blocked`` (circuit breaker) and
``skipped`` (another run holds the workspace's lease) are outcomes of a run that was recorded,
not errors of the request, so they come with 200 and the run id like any other run.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest
from ninja import Query, Router
from ninja.params import Path

from maintenance.hygiene import clean_residue_patterns
from maintenance.models import MaintenancePolicy, RunKind, RunTrigger
from maintenance.revert import revert_run
from maintenance.runs import PRUNE_PARAMS, decay_result, prune_result, run_maintenance
from maintenance.schemas import (
    ERRORS,
    BackupPageOut,
    DecayOut,
    FullRunIn,
    IdPath,
    PageIn,
    PolicyIn,
    PolicyOut,
    PruneIn,
    PruneOut,
    RevertOut,
    RunDetailOut,
    RunIn,
    RunListIn,
    RunPageOut,
    RunResultOut,
    StatsOut,
    TombstoneListIn,
    TombstonePageOut,
)
from maintenance.selectors import (
    backup_list,
    policy_values,
    run_get,
    run_list,
    tombstone_list,
    workspace_stats,
)
from memory.auth import ROLE_LEVEL, require
from memory.errors import InvalidInput
from memory.selectors import page

router = Router(tags=["maintenance"])


def _start(request: HttpRequest, payload: RunIn, kind: str, **params: Any) -> dict[str, Any]:
    """Start a run for the caller. Agents may preview (and their runs default to dry runs);
    applying needs an operator."""
    who = require(request, "agent")
    dry_run = payload.dry_run
    if dry_run is None:
        dry_run = who.level < ROLE_LEVEL["operator"]
    if not dry_run:
        require(request, "operator")
    return run_maintenance(
        workspace=who.workspace,
        kind=kind,
        trigger=RunTrigger.API,
        dry_run=dry_run,
        force=payload.force,
        actor=who.actor,
        **params,
    )


@router.post("/maintenance/run", response={200: RunResultOut, **ERRORS})
def maintenance_run(request: HttpRequest, payload: FullRunIn | None = None) -> dict[str, Any]:
    """The full run of SPEC §4.1 on the caller's workspace, or one quality pass alone
    (``kind`` hygiene, contradictions or consolidate)."""
    payload = payload or FullRunIn.model_validate({})
    return _start(request, payload, payload.kind)


@router.post("/maintenance/prune", response={200: PruneOut, **ERRORS})
def maintenance_prune(request: HttpRequest, payload: PruneIn | None = None) -> dict[str, Any]:
    """Prune (SPEC §4.2) with the caller's parameters; omitted ones come from the policy."""
    payload = payload or PruneIn.model_validate({})
    params = payload.model_dump(include=set(PRUNE_PARAMS))
    return prune_result(_start(request, payload, RunKind.PRUNE, params=params))


@router.post("/maintenance/sweep-decay", response={200: DecayOut, **ERRORS})
def maintenance_sweep_decay(request: HttpRequest, payload: RunIn | None = None) -> dict[str, Any]:
    """The decay sweep (SPEC §4.2): score, decay, ttl, purge."""
    payload = payload or RunIn.model_validate({})
    return decay_result(_start(request, payload, RunKind.DECAY))


@router.get("/maintenance/runs", response={200: RunPageOut, **ERRORS})
def maintenance_runs(request: HttpRequest, filters: Query[RunListIn]) -> dict[str, Any]:
    """Run history, newest first, with counts."""
    who = require(request, "viewer")
    runs = run_list(who.workspace, kind=filters.kind, status=filters.status)
    return page(runs, limit=filters.limit, offset=filters.offset)


@router.get("/maintenance/runs/{id}", response={200: RunDetailOut, **ERRORS})
def maintenance_run_detail(request: HttpRequest, path: Path[IdPath]) -> Any:
    """One run: its result, effective parameters, affected ids and error."""
    who = require(request, "viewer")
    return run_get(who.workspace, path.id)


@router.post("/maintenance/runs/{id}/revert", response={200: RevertOut, **ERRORS})
def maintenance_run_revert(request: HttpRequest, path: Path[IdPath]) -> dict[str, Any]:
    """Undo what the run archived or tombstoned (not what it purged) and relink its pruned links."""
    who = require(request, "operator")
    return revert_run(who.workspace, path.id, actor=who.actor)


@router.get("/tombstones", response={200: TombstonePageOut, **ERRORS})
def tombstones(request: HttpRequest, filters: Query[TombstoneListIn]) -> dict[str, Any]:
    """Soft deletions with their purge countdown; open ones unless asked otherwise."""
    who = require(request, "viewer")
    rows = tombstone_list(
        who.workspace,
        include_restored=filters.include_restored,
        include_purged=filters.include_purged,
        reason=filters.reason,
        run_id=filters.run_id,
    )
    return page(rows, limit=filters.limit, offset=filters.offset)


@router.get("/backups", response={200: BackupPageOut, **ERRORS})
def backups(request: HttpRequest, filters: Query[PageIn]) -> dict[str, Any]:
    """The workspace's backups, newest first."""
    who = require(request, "viewer")
    return page(backup_list(who.workspace), limit=filters.limit, offset=filters.offset)


@router.get("/stats", response={200: StatsOut, **ERRORS})
def stats(request: HttpRequest) -> dict[str, Any]:
    """Entries by status, totals, open tombstones and disputes, the last run of each kind, the
    policy."""
    who = require(request, "viewer")
    return workspace_stats(who.workspace)


@router.get("/policy", response={200: PolicyOut, **ERRORS})
def policy_get(request: HttpRequest) -> dict[str, Any]:
    """The effective maintenance policy; the next run reads it."""
    who = require(request, "viewer")
    return policy_values(who.workspace)


@router.put("/policy", response={200: PolicyOut, **ERRORS})
def policy_put(request: HttpRequest, payload: PolicyIn) -> dict[str, Any]:
    """Change policy settings (omitted ones stay); values are clamped into their ranges."""
    who = require(request, "admin")
    changes = {k: v for k, v in payload.model_dump(exclude_unset=True).items() if v is not None}
    if "residue_patterns" in changes:
        try:
            changes["residue_patterns"] = clean_residue_patterns(changes["residue_patterns"])
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    with transaction.atomic():
        row, _ = MaintenancePolicy.objects.select_for_update().get_or_create(workspace=who.workspace)
        for name, value in changes.items():
            setattr(row, name, value)
        # Only the changed columns: two admins changing different settings at once both win.
        row.save(update_fields=[*changes, "updated_at"])
    return policy_values(who.workspace)
