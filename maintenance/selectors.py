"""Reads of maintenance state for the API and pages. Every function is scoped to the workspace
it is given: another workspace's id is simply not found."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery

from maintenance.models import (
    Backup,
    Dispute,
    DisputeStatus,
    MaintenancePolicy,
    MaintenanceRun,
    RunKind,
)
from memory.errors import NotFound
from memory.models import AnchorStatus, CodeAnchor, Relationship, Status, Tag, Tombstone, Workspace
from memory.selectors import status_counts


def run_list(
    workspace: Workspace, *, kind: str | None = None, status: str | None = None
) -> QuerySet[MaintenanceRun]:
    """Runs of the workspace, newest first; ``affected``, ``params`` and ``result`` (which can be
    large) are left out: the detail has them."""
    runs = MaintenanceRun.objects.filter(workspace=workspace).defer("affected", "params", "result")
    if kind:
        runs = runs.filter(kind=kind)
    if status:
        runs = runs.filter(status=status)
    return runs.order_by("-started_at", "-pk")


def run_get(workspace: Workspace, run_id: int) -> MaintenanceRun:
    run = MaintenanceRun.objects.filter(workspace=workspace, pk=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


def tombstone_list(
    workspace: Workspace,
    *,
    include_restored: bool = False,
    include_purged: bool = False,
    reason: str | None = None,
    run_id: int | None = None,
) -> QuerySet[Tombstone]:
    """Open tombstones (neither restored nor purged) by default, the next purge first."""
    tombstones = Tombstone.objects.filter(workspace=workspace)
    if not include_restored:
        tombstones = tombstones.filter(restored_at__isnull=True)
    if not include_purged:
        tombstones = tombstones.filter(purged_at__isnull=True)
    if reason:
        tombstones = tombstones.filter(reason=reason)
    if run_id is not None:
        tombstones = tombstones.filter(run_id=run_id)
    return tombstones.order_by("purge_after", "pk")


def backup_list(workspace: Workspace) -> QuerySet[Backup]:
    """The workspace's backups, newest first (the order of maintenance.backups.list_backups)."""
    return Backup.objects.filter(workspace=workspace).order_by("-created_at", "-pk")


def policy_values(workspace: Workspace) -> dict[str, Any]:
    """The effective policy as runs read it: clamped, defaults when the workspace has no row."""
    row = MaintenancePolicy.objects.filter(workspace=workspace).first()
    values = asdict(row.values() if row else MaintenancePolicy(workspace=workspace).values())
    values["exclude_tags"] = list(values["exclude_tags"])
    values["residue_patterns"] = list(row.residue_patterns or []) if row else []
    values["updated_at"] = row.updated_at if row else None
    return values


def last_runs(workspace: Workspace) -> dict[str, MaintenanceRun | None]:
    """The last started run of each kind, in one query."""
    newest_of_kind = (
        MaintenanceRun.objects.filter(workspace=workspace, kind=OuterRef("kind"))
        .order_by("-started_at", "-pk")
        .values("pk")[:1]
    )
    runs = MaintenanceRun.objects.filter(workspace=workspace, pk=Subquery(newest_of_kind)).only(
        "id", "kind", "status", "dry_run", "trigger", "started_at", "finished_at"
    )
    found: dict[str, MaintenanceRun | None] = dict.fromkeys(RunKind.values)
    for run in runs:
        found[run.kind] = run
    return found


def workspace_stats(workspace: Workspace) -> dict[str, Any]:
    """The numbers of the dashboard, in a constant number of queries."""
    by_status = status_counts(workspace)
    entries = {status: by_status.get(status, 0) for status in Status.values}
    entries["total"] = sum(by_status.values())
    links = Relationship.objects.filter(workspace=workspace).aggregate(
        active=Count("pk", filter=Q(pruned_at__isnull=True)),
        pruned=Count("pk", filter=Q(pruned_at__isnull=False)),
    )
    anchors = CodeAnchor.objects.filter(workspace=workspace).aggregate(
        **{status: Count("pk", filter=Q(status=status)) for status in AnchorStatus.values}
    )
    return {
        "workspace": workspace.slug,
        "entries": entries,
        "tags": Tag.objects.filter(workspace=workspace).count(),
        "links": links,
        "anchors": anchors,
        "open_tombstones": Tombstone.objects.filter(
            workspace=workspace, restored_at__isnull=True, purged_at__isnull=True
        ).count(),
        "open_disputes": Dispute.objects.filter(workspace=workspace, status=DisputeStatus.OPEN).count(),
        "last_runs": last_runs(workspace),
        "policy": policy_values(workspace),
    }
