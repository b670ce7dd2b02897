"""Starting runs: here and now (``run_maintenance``: the command line, the scheduler's task,
small dry runs of the API), queued for a worker (``queue_run``, then ``start_queued`` in
``maintenance.tasks.run_queued``) or refused when another run holds the lease; and whether a
dry run is small enough to be worked in the request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from maintenance.models import MaintenanceRun, RunKind, RunStatus
from maintenance.pass_tools import BATCH_SIZE
from maintenance.run_results import effective_policy
from maintenance.runs import LEASE_HELD, execute_run, finish_run
from maintenance.signals import announce_run
from memory.models import Entry, Workspace
from memory.policy import PolicyValues


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
    return execute_run(run, now=now, policy=policy, params=params, progress=progress, batch_size=batch_size)


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
    finish_run(run, RunStatus.SKIPPED, None, error=error)
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
    return execute_run(run, now=now, policy=policy, params=params, progress=None, batch_size=batch_size)


def _policy_params(policy: PolicyValues) -> dict[str, Any]:
    data = asdict(policy)
    data["exclude_tags"] = list(policy.exclude_tags)
    return data


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
