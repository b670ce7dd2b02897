"""Reads of maintenance state for the API and pages. Every function is scoped to the workspace
it is given: another workspace's id is simply not found."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, overload

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery, Sum

from maintenance.models import (
    Backup,
    Dispute,
    DisputeStatus,
    MaintenanceRun,
    RunDaySummary,
    RunKind,
    RunStatus,
)
from maintenance.run_results import AFFECTED_LISTS, affected_lists
from memory.errors import NotFound
from memory.models import CodeAnchor, LifecycleEvent, Relationship, Tag, Tombstone, Workspace
from memory.models.choices import AnchorStatus, Status
from memory.policy_model import MaintenancePolicy
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


def run_days(
    workspace: Workspace, *, kind: str | None = None, status: str | None = None
) -> QuerySet[RunDaySummary]:
    """The per-day counts of runs folded by the reclaim pass (runs that changed nothing, a week
    old), newest day first."""
    days = RunDaySummary.objects.filter(workspace=workspace)
    if kind:
        days = days.filter(kind=kind)
    if status:
        days = days.filter(status=status)
    return days.order_by("-day", "kind", "status", "dry_run", "pk")


def folded_runs(workspace: Workspace, *, kind: str | None = None, status: str | None = None) -> int:
    """How many runs (matching the filters) the per-day counts hold, in one query."""
    return folded_summary(workspace, kind=kind, status=status)[0]


def folded_summary(
    workspace: Workspace, *, kind: str | None = None, status: str | None = None
) -> tuple[int, int]:
    """(runs, day rows) of the per-day counts matching the filters, in one query."""
    found = run_days(workspace, kind=kind, status=status).aggregate(n=Sum("runs"), rows=Count("pk"))
    return found["n"] or 0, found["rows"]


def run_get(workspace: Workspace, run_id: int) -> MaintenanceRun:
    run = MaintenanceRun.objects.filter(workspace=workspace, pk=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


# The status a run's LifecycleEvent moves an entry to, for each action a run changes.
EVENT_STATUS_OF = {"archived": Status.ARCHIVED, "tombstoned": Status.TOMBSTONED, "purged": "purged"}


def affected_totals(run: MaintenanceRun) -> dict[str, int]:
    """How many entries each action of the run has (the run's ``affected_total``, or, on a row
    recorded before runs kept it, the length of its lists)."""
    totals = run.affected_total
    if isinstance(totals, dict) and totals:
        return {k: int(totals.get(k) or 0) for k in AFFECTED_LISTS}
    affected = run.affected if isinstance(run.affected, dict) else {}
    return {k: len(v) for k, v in affected_lists(affected).items()}


def changed_entries(run: MaintenanceRun) -> bool:
    """Whether the run may have changed entries: not a dry run and not blocked by the circuit
    breaker (those name what they would have changed, on their record)."""
    return not run.dry_run and run.status != RunStatus.BLOCKED


class AffectedIds(Sequence[int]):
    """The entry ids of one action of one run, in id order, as a sequence a Paginator can page
    (its length known, each slice one query). A real run's archived, tombstoned and purged
    entries are read from its LifecycleEvents, so the list is complete however long it is (and
    for runs recorded before runs kept only a sample too); a dry run or a blocked one changed
    nothing, and its lists, like every run's proposals, come from the run's record, which keeps
    the first ``AFFECTED_KEPT`` of each (``complete`` False when there were more)."""

    def __init__(self, run: MaintenanceRun, action: str, total: int | None = None) -> None:
        self.run = run
        self.action = action
        self.from_events = changed_entries(run) and action in EVENT_STATUS_OF
        recorded = affected_lists(run.affected if isinstance(run.affected, dict) else {})[action]
        self.recorded: list[int] = recorded
        if total is None:
            total = self._count() if self.from_events else affected_totals(run)[action]
        self.total = max(total, 0 if self.from_events else len(recorded))
        self.complete = self.from_events or len(recorded) >= self.total

    def events(self) -> QuerySet[LifecycleEvent]:
        return LifecycleEvent.objects.filter(
            run=self.run, automatic=True, to_status=EVENT_STATUS_OF[self.action]
        ).order_by("entry_ref")

    def _count(self) -> int:
        return self.events().count()

    def __len__(self) -> int:
        """The ids there are to page: all of a real run's, the recorded ones of a dry run
        (``total`` is the true count either way)."""
        return self.total if self.from_events else len(self.recorded)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, int):
            found = self[index : index + 1]
            if not found:
                raise IndexError(index)
            return found[0]
        if not self.from_events:
            return self.recorded[index]
        if self.total == 0:
            return []
        return list(self.events().values_list("entry_ref", flat=True)[index])


def run_affected(run: MaintenanceRun, action: str, *, limit: int, offset: int) -> dict[str, Any]:
    """One page of the entries of one action of a run (the API's /maintenance/runs/{id}/affected)."""
    ids = AffectedIds(run, action)
    return {
        "count": ids.total,
        "limit": limit,
        "offset": offset,
        "action": action,
        "complete": ids.complete,
        "items": ids[offset : offset + limit] if offset < len(ids) else [],
    }


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
    row = MaintenancePolicy.read(workspace)
    values = asdict(row.values())
    values["exclude_tags"] = list(values["exclude_tags"])
    values["residue_patterns"] = list(row.residue_patterns or [])
    values["updated_at"] = row.updated_at if row.pk is not None else None
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


# --- hygiene candidates, as pages and the command show them --------------------------------


def hygiene_reason_codes() -> list[str]:
    """The reasons a candidate can be filtered by, in the order the pages list them."""
    return [
        "incomplete_fragment",
        "truncated_or_unbalanced",
        "code_heavy",
        "implementation_residue",
        "exact_duplicate",
        "flagged_by_feedback",
        "legacy_import",
    ]
