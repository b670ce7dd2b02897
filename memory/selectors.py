"""Reads that span models. Every function takes the workspace (or the user) it is scoped to."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Exists, OuterRef, Prefetch, Q, QuerySet, Subquery

from memory import rawsql, scoring
from memory.errors import NotFound
from memory.models import (
    CodeAnchor,
    Entry,
    EntryAccess,
    LifecycleEvent,
    Membership,
    Relationship,
    Tag,
    Tombstone,
    Workspace,
)
from memory.models.choices import CAUSAL_TYPES, LISTED_STATUSES, Status
from memory.models.entries import EntryQuerySet, stored_retention, visible_statuses

# Lists count exactly up to this many rows; a larger total is counted once and cached for
# COUNT_CACHE_SECONDS (counting 900,000 rows costs ~80 ms on every page otherwise).
COUNT_EXACT_UP_TO = 10_000
COUNT_CACHE_SECONDS = 30


def bounded_count(queryset: QuerySet[Any] | Callable[[], QuerySet[Any]], key: str | None = None) -> int:
    """The number of rows of ``queryset``: exact up to COUNT_EXACT_UP_TO (reading at most that
    many), above it the exact count of at most COUNT_CACHE_SECONDS ago. A count that was large
    is served from the cache until it expires, without reading any row. ``key`` names the
    query's rows (what it filters, not how it sorts); by default its SQL, which costs a compile.
    ``queryset`` may be a function that builds it, called only when a count is made."""
    if key is None:
        if not isinstance(queryset, QuerySet):
            queryset = queryset()
        sql, params = queryset.query.sql_with_params()
        key = repr((sql, params))
    key = "count:" + hashlib.sha256(key.encode()).hexdigest()
    cached = cache.get(key)
    if cached is not None:
        return int(cached)
    if not isinstance(queryset, QuerySet):
        queryset = queryset()
    # Unsorted: a sliced count keeps the query's ORDER BY, and a sort of every row (or a walk
    # in index order, reading rows at random) costs far more than counting them.
    n = queryset.order_by()[: COUNT_EXACT_UP_TO + 1].count()
    if n <= COUNT_EXACT_UP_TO:
        return n
    n = queryset.count()
    cache.set(key, n, COUNT_CACHE_SECONDS)
    return n


def page(
    queryset: QuerySet[Any],
    *,
    limit: int,
    offset: int,
    count_key: str | None = None,
    counted: Callable[[], QuerySet[Any]] | None = None,
) -> dict[str, Any]:
    """One page of a list and the list's ``count``, the total number of matching rows whatever
    the offset. ``counted`` builds the same rows written to count fast (by default
    ``queryset``), only when a count is needed. One or two queries whatever the page size:

    - a page shorter than ``limit`` that shows rows is the last one and counts itself;
    - a full page reads ``bounded_count``, never below what it shows (a cached count may lag
      behind rows written since);
    - an empty page past the end counts exactly: the total is below the offset, and a cached
      count, or the offset itself, would report rows that are not there."""
    items = list(queryset[offset : offset + limit])
    if (items and len(items) < limit) or (offset == 0 and not items):
        count = offset + len(items)
    elif items:
        count = max(bounded_count(queryset if counted is None else counted, count_key), offset + len(items))
    else:
        count = (queryset if counted is None else counted()).count()
    return {"count": count, "limit": limit, "offset": offset, "items": items}


def workspaces_for_user(user: Any) -> QuerySet[Workspace]:
    if not getattr(user, "is_authenticated", False):
        return Workspace.objects.none()
    if user.is_superuser:
        return Workspace.objects.all()
    return Workspace.objects.filter(memberships__user=user)


def membership_role(user: Any, workspace: Workspace) -> str | None:
    row = Membership.objects.filter(user=user, workspace=workspace).values_list("role", flat=True).first()
    return row


def status_counts(workspace: Workspace) -> dict[str, int]:
    """Latest entries of a workspace by status, in one query."""
    rows = (
        Entry.objects.of(workspace)
        .latest_versions()
        .values("status")
        .annotate(n=Count("id"))
        .order_by("status")
    )
    return {row["status"]: row["n"] for row in rows}


def workspace_summaries(user: Any) -> list[dict[str, Any]]:
    """Each workspace the user may see with its entry counts by status (two queries in all)."""
    workspaces = list(workspaces_for_user(user).order_by("slug"))
    rows = (
        Entry.objects.filter(workspace__in=workspaces, is_latest=True)
        .values("workspace_id", "status")
        .annotate(n=Count("id"))
    )
    counts: dict[int, dict[str, int]] = {}
    for row in rows:
        counts.setdefault(row["workspace_id"], {})[row["status"]] = row["n"]
    return [
        {
            "workspace": ws,
            "counts": counts.get(ws.pk, {}),
            # (status, count) in the order of Status: a table's columns, each cell named by its status.
            "cells": [(status, counts.get(ws.pk, {}).get(status, 0)) for status in Status.values],
        }
        for ws in workspaces
    ]


# --- entries (the API's reads) ----------------------------------------------------------------

ENTRY_SORTS: dict[str, tuple[Any, ...]] = {
    "importance": ("-importance", "-id"),
    "recent": ("-created_at", "-id"),
    "retention": (stored_retention().desc(), "-id"),
}
# The sorts whose list repeats the condition of ``entry_by_importance`` (``on_index``), so that
# SQLite may read an index in the sort's order: importance reads that index; recent reads
# ``entry_latest_recent``, which SQLite chose only with that condition present (without it,
# it sorted all the workspace's entries). No index holds retention's order: adding the
# condition there made SQLite sort the index's rows, slower than today's plan.
ENTRY_SORTS_ON_INDEX = ("importance", "recent")


def _entry_rows(
    workspace: Workspace,
    *,
    status: str | None = None,
    entry_type: str | None = None,
    tier: str | None = None,
    tag: str | None = None,
    project: str | None = None,
    include_archived: bool = False,
    include_staged: bool = False,
) -> EntryQuerySet:
    """The rows of ``entry_list`` (unsorted)."""
    statuses = visible_statuses(
        include_archived=include_archived or status == Status.ARCHIVED,
        include_staged=include_staged or status == Status.STAGED,
    )
    qs = Entry.objects.of(workspace).filter(is_latest=True, status__in=statuses)
    if status:
        qs = qs.filter(status=status)
    if entry_type:
        qs = qs.filter(entry_type=entry_type)
    if tier:
        qs = qs.filter(tier=tier)
    if project is not None:
        qs = qs.filter(project=project)
    if tag:
        # EXISTS rather than a join: no duplicate rows, and the same SQL on SQLite and PostgreSQL.
        tagged = Entry.tags.through.objects.filter(
            entry_id=OuterRef("pk"), tag__workspace=workspace, tag__name=tag
        )
        qs = qs.filter(Exists(tagged))
    return qs


def entry_list(workspace: Workspace, *, sort: str = "importance", **filters: Any) -> QuerySet[Entry]:
    """Latest visible entries of the workspace, filtered and sorted (``filters``: status,
    entry_type, tier, tag, project, include_archived, include_staged). A page of them gets
    its tags with ``with_tag_names`` (or ``prefetch_related("tags")``): one query whatever
    its size. Asking for ``status=archived`` or ``status=staged`` implies including them.
    Count them with ``entry_list_counted``."""
    qs = _entry_rows(workspace, **filters)
    if sort in ENTRY_SORTS_ON_INDEX:  # every visible entry is in it: no row changes
        qs = qs.on_index("entry_by_importance")
    return qs.select_related("score").order_by(*ENTRY_SORTS[sort])


def entry_list_counted(workspace: Workspace, **filters: Any) -> QuerySet[Entry]:
    """The rows of ``entry_list`` with the same filters, to count: unsorted, with the
    condition of the partial index that holds them all (``entry_by_importance``)."""
    qs = _entry_rows(workspace, **filters)
    return qs.on_index("entry_by_importance")


def with_tag_names(entries: list[Entry]) -> list[Entry]:
    """Give each entry its ``tag_names`` (by name) in one statement written once per vendor
    (what Django's prefetch does, without Tag instances or compiling a query per page);
    returns ``entries``."""
    names: dict[int, list[str]] = {e.pk: [] for e in entries}
    if names:
        match, params = rawsql.in_values(list(names))
        with connection.cursor() as cursor:
            cursor.execute(_tag_names_sql(connection.vendor, match), params)
            for entry_id, name in cursor.fetchall():
                names[entry_id].append(name)
    for e in entries:
        e.__dict__["_tag_names"] = names[e.pk]
    return entries


@functools.lru_cache(maxsize=64)
def _tag_names_sql(vendor: str, match: str) -> str:
    through = Entry.tags.through
    entry_col, tag_col = rawsql.column(through, "entry"), rawsql.column(through, "tag")
    name = rawsql.column(Tag, "name")
    return (
        f"SELECT et.{entry_col}, t.{name} FROM {rawsql.table(through)} et"
        f" JOIN {rawsql.table(Tag)} t ON t.{rawsql.quote('id')} = et.{tag_col}"
        f" WHERE et.{entry_col} {match} ORDER BY t.{name}"
    )


@dataclass(frozen=True)
class LinkRow:
    id: int
    direction: str  # "out" or "in", seen from the entry
    type: str
    other_id: int
    created_at: datetime
    pruned_at: datetime | None


@dataclass(frozen=True)
class EntryDetail:
    """An entry with what its page needs; unknown attributes are read from the entry."""

    entry: Entry
    readers: int
    importance_breakdown: dict[str, Any]
    anchors: list[CodeAnchor]
    links: list[LinkRow]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.entry, name)


def _lineage(entry: Entry) -> int:
    return entry.lineage_id or entry.pk


def entry_detail(workspace: Workspace, entry_id: int, *, now: datetime) -> EntryDetail:
    """One entry (any version) with tags, anchors, links both ways, readers and the breakdown
    of its importance as of ``now``, in a constant number of queries. Tombstoned lineages are
    not found here (tombstones show only on their own endpoints)."""
    lineage_status = Entry.objects.filter(
        workspace=workspace, lineage_id=OuterRef("lineage_id"), is_latest=True
    ).values("status")[:1]
    entry = (
        Entry.objects.filter(workspace=workspace, pk=entry_id)
        .select_related("score")
        .annotate(lineage_status=Subquery(lineage_status))
        .prefetch_related(Prefetch("anchors", queryset=CodeAnchor.objects.order_by("pk")))
        .first()
    )
    # The annotation is not known to the type checker; read it through an untyped name.
    annotated: Any = entry
    if entry is None or Status.TOMBSTONED in (entry.status, annotated.lineage_status):
        raise NotFound(f"entry {entry_id} not found")
    with_tag_names([entry])
    anchors = list(entry.anchors.all())
    worst = scoring.worst_anchor(a.status for a in anchors)
    # Every link touching the entry, with the state of its other end: the list shows them
    # all, the score counts the live ones (as scoring_db.relationship_count_expr does in SQL).
    rows = list(
        Relationship.objects.filter(workspace=workspace)
        .filter(Q(from_entry_id=entry.pk) | Q(to_entry_id=entry.pk))
        .order_by("pk")
        .values(
            "pk",
            "type",
            "from_entry_id",
            "to_entry_id",
            "created_at",
            "pruned_at",
            "from_entry__is_latest",
            "from_entry__status",
            "to_entry__is_latest",
            "to_entry__status",
        )
    )

    def counted(row: Mapping[str, Any]) -> bool:
        other = "to_entry" if row["from_entry_id"] == entry.pk else "from_entry"
        return (
            row["pruned_at"] is None
            and row[f"{other}__is_latest"]
            and row[f"{other}__status"] in LISTED_STATUSES
        )

    live = [row for row in rows if counted(row)]
    relationship_count = len(live)
    causal_count = sum(1 for row in live if row["type"] in CAUSAL_TYPES)
    age_days = scoring.days_between(now.timestamp(), entry.created_at.timestamp())
    breakdown = scoring.importance_breakdown(
        impact_score=entry.impact_score,
        significance_type=entry.significance_type,
        relationship_count=relationship_count,
        causal_count=causal_count,
        age_days=age_days,
        trust_score=entry.trust_score,
        validation_status=entry.validation_status,
        anchor_status=str(worst),
    )
    inputs = {
        "relationship_count": relationship_count,
        "causal_count": causal_count,
        "age_days": age_days,
        "anchor_status": str(worst),
    }
    links = [
        LinkRow(
            id=row["pk"],
            direction="out" if row["from_entry_id"] == entry.pk else "in",
            type=row["type"],
            other_id=row["to_entry_id"] if row["from_entry_id"] == entry.pk else row["from_entry_id"],
            created_at=row["created_at"],
            pruned_at=row["pruned_at"],
        )
        for row in rows
    ]
    readers = EntryAccess.objects.filter(workspace=workspace, lineage_id=_lineage(entry)).count()
    return EntryDetail(
        entry=entry,
        readers=readers,
        importance_breakdown={**asdict(breakdown), **inputs},
        anchors=anchors,
        links=links,
    )


def entry_versions(workspace: Workspace, entry: Entry) -> QuerySet[Entry]:
    """Every version of the entry's lineage, oldest first (a page gets its tags with
    ``with_tag_names``). A tombstoned lineage is not found, as in ``entry_detail``: its
    content shows only on the tombstone's own pages and endpoints."""
    versions = Entry.objects.filter(workspace=workspace, lineage_id=_lineage(entry))
    if versions.filter(is_latest=True, status=Status.TOMBSTONED).exists():
        raise NotFound(f"entry {entry.pk} not found")
    return versions.order_by("created_at", "pk")


def entry_history(workspace: Workspace, entry: Entry) -> QuerySet[LifecycleEvent]:
    """The LifecycleEvents of every version of the entry's lineage, newest first."""
    versions = Entry.objects.filter(workspace=workspace, lineage_id=_lineage(entry)).values("pk")
    return LifecycleEvent.objects.filter(workspace=workspace, entry_ref__in=versions).order_by(
        "-created_at", "-pk"
    )


def open_tombstone(workspace: Workspace, entry: Entry) -> Tombstone | None:
    """The open (not restored, not purged) Tombstone of the entry's lineage, if any."""
    return (
        Tombstone.objects.filter(
            workspace=workspace,
            lineage_ref=_lineage(entry),
            restored_at__isnull=True,
            purged_at__isnull=True,
            entry__isnull=False,
        )
        .order_by("-pk")
        .first()
    )
