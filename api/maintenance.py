"""The maintenance endpoints of the agent API: runs, their history and revert,
tombstones, backups, stats and the policy.

Every endpoint first calls ``require`` with its minimum role. A real run is never worked in
the request: it is recorded ``queued`` and handed to the worker in the same transaction
(``maintenance.tasks.enqueue_run``), answering 202; only a small workspace's dry run answers
inline. A run refused because another holds the workspace's lease is recorded ``skipped`` and
answers 409 with both ids. The contract: docs/maintenance.md ("Runs out of the request").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from django.urls import reverse
from ninja import Query, Router
from ninja.params import Path
from ninja.responses import Status

from api.maintenance_schemas import (
    ERRORS,
    BackupPageOut,
    DecayOut,
    FullRunIn,
    IdPath,
    PageIn,
    PruneIn,
    PruneOut,
    RevertOut,
    RunAffectedIn,
    RunAffectedPageOut,
    RunDayPageOut,
    RunDetailOut,
    RunIn,
    RunListIn,
    RunPageOut,
    RunQueuedOut,
    RunResultOut,
    TombstoneListIn,
    TombstonePageOut,
)
from api.policy_schemas import PolicyIn, PolicyOut, StatsOut
from maintenance import lease
from maintenance.models import RunKind, RunStatus, RunTrigger
from maintenance.revert import revert_run
from maintenance.run_results import PRUNE_PARAMS, decay_result, prune_result
from maintenance.run_start import run_maintenance, runs_inline
from maintenance.selectors import (
    backup_list,
    folded_runs,
    policy_values,
    run_affected,
    run_days,
    run_get,
    run_list,
    tombstone_list,
    workspace_stats,
)
from maintenance.tasks import submit_run
from memory.auth import ROLE_LEVEL, require
from memory.errors import Conflict, InvalidInput
from memory.policy_model import MaintenancePolicy
from memory.selectors import page

router = Router(tags=["maintenance"])


@dataclass(frozen=True)
class Queued:
    """A run handed to the worker: the 202 answer."""

    body: dict[str, Any]


def queued_answer(run: Any) -> Queued:
    return Queued(
        {
            "run_id": run.pk,
            "kind": run.kind,
            "dry_run": run.dry_run,
            "status": run.status,
            "url": reverse("api-v1:maintenance_run_detail", kwargs={"id": run.pk}),
        }
    )


def _refuse_held(result: dict[str, Any], running: int | None) -> Conflict:
    return Conflict(
        f"another run holds this workspace's lease (run {running}); this one was recorded as skipped",
        run_id=result["run_id"],
        running_run_id=running,
    )


def start_run(request: HttpRequest, payload: RunIn, kind: str, **params: Any) -> dict[str, Any] | Queued:
    """Start a run for the caller: inline (its result) or queued (``Queued``), see the module
    docstring. Agents may preview (and their runs default to dry runs); applying needs an
    operator. The MCP endpoint's dry-run preview (``api.mcp``) starts its runs here too."""
    who = require(request, "agent")
    dry_run = payload.dry_run
    if dry_run is None:
        dry_run = who.level < ROLE_LEVEL["operator"]
    if not dry_run:
        require(request, "operator")
    run_args: dict[str, Any] = {
        "workspace": who.workspace,
        "kind": kind,
        "trigger": RunTrigger.API,
        "dry_run": dry_run,
        "force": payload.force,
        "actor": who.actor,
    }
    if runs_inline(who.workspace, dry_run=dry_run):
        result = run_maintenance(**run_args, **params)
        if result["status"] == RunStatus.SKIPPED:
            raise _refuse_held(result, lease.holding_run_id(who.workspace))  # None if it ended meanwhile
        return result
    submitted = submit_run(**run_args, **params)
    if submitted.run.status == RunStatus.SKIPPED:
        raise Conflict(
            f"{submitted.refusal}; this one was recorded as skipped",
            run_id=submitted.run.pk,
            running_run_id=submitted.blocking_run_id,
        )
    return queued_answer(submitted.run)


def _answer(result: dict[str, Any] | Queued, shape: Any = None) -> Any:
    if isinstance(result, Queued):
        return Status(202, result.body)
    return shape(result) if shape else result


QUEUED = {202: RunQueuedOut}


@router.post("/maintenance/run", response={200: RunResultOut, **QUEUED, **ERRORS})
def maintenance_run(request: HttpRequest, payload: FullRunIn | None = None) -> Any:
    """The full maintenance run (every pass, in order) on the caller's workspace, or one quality pass alone
    (``kind`` hygiene, contradictions or consolidate). A real run, and a dry run of a large
    workspace, is queued for the worker: 202 with the run's id and URL."""
    payload = payload or FullRunIn.model_validate({})
    return _answer(start_run(request, payload, payload.kind))


@router.post("/maintenance/prune", response={200: PruneOut, **QUEUED, **ERRORS})
def maintenance_prune(request: HttpRequest, payload: PruneIn | None = None) -> Any:
    """Prune with the caller's parameters; omitted ones come from the policy. Queued
    (202) like a full run."""
    payload = payload or PruneIn.model_validate({})
    params = payload.model_dump(include=set(PRUNE_PARAMS))
    return _answer(start_run(request, payload, RunKind.PRUNE, params=params), prune_result)


@router.post("/maintenance/sweep-decay", response={200: DecayOut, **QUEUED, **ERRORS})
def maintenance_sweep_decay(request: HttpRequest, payload: RunIn | None = None) -> Any:
    """The decay sweep: score, decay, ttl, purge. Queued (202) like a full run."""
    payload = payload or RunIn.model_validate({})
    return _answer(start_run(request, payload, RunKind.DECAY), decay_result)


@router.get("/maintenance/runs", response={200: RunPageOut, **ERRORS})
def maintenance_runs(request: HttpRequest, filters: Query[RunListIn]) -> dict[str, Any]:
    """Run history, newest first, with counts."""
    who = require(request, "viewer")
    runs = run_list(who.workspace, kind=filters.kind, status=filters.status)
    result = page(runs, limit=filters.limit, offset=filters.offset)
    result["folded_runs"] = folded_runs(who.workspace, kind=filters.kind, status=filters.status)
    return result


@router.get("/maintenance/runs/folded", response={200: RunDayPageOut, **ERRORS})
def maintenance_run_days(request: HttpRequest, filters: Query[RunListIn]) -> dict[str, Any]:
    """Runs that changed nothing (skipped runs and dry runs too), folded a week after they ran
    into a count per UTC day, kind, status and dry-run flag; newest day first."""
    who = require(request, "viewer")
    days = run_days(who.workspace, kind=filters.kind, status=filters.status)
    return page(days, limit=filters.limit, offset=filters.offset)


@router.get("/maintenance/runs/{id}", response={200: RunDetailOut, **ERRORS})
def maintenance_run_detail(request: HttpRequest, path: Path[IdPath]) -> Any:
    """One run: its status and progress, result, effective parameters, the first affected ids
    of each action (all of them: /maintenance/runs/{id}/affected) and error."""
    who = require(request, "viewer")
    return run_get(who.workspace, path.id)


@router.get("/maintenance/runs/{id}/affected", response={200: RunAffectedPageOut, **ERRORS})
def maintenance_run_affected(request: HttpRequest, path: Path[IdPath], filters: Query[RunAffectedIn]) -> Any:
    """The entries one run archived, tombstoned or purged (``action``), in id order, paged:
    read from the run's lifecycle events. A dry run changed nothing: it lists what it would
    have changed, as far as its record keeps (the first ids of each action), and ``count``
    is the true number. ``proposed_archive``/``proposed_tombstone``: what a propose-mode
    run proposed (from its record, likewise)."""
    who = require(request, "viewer")
    run = run_get(who.workspace, path.id)
    return run_affected(run, filters.action, limit=filters.limit, offset=filters.offset)


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
    try:
        MaintenancePolicy.write(who.workspace, changes)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    return policy_values(who.workspace)
