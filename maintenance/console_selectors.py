"""Reads behind the console's review queue and run pages (SPEC §6). Every function is scoped to
the workspace it is given, and each list is a queryset (or a list) the view pages through, so a
page costs the same number of queries whatever the number of rows.

The review queue has four tabs:

- ``hygiene``: the hygiene candidates (SPEC §4.4), filtered by recommendation or reason;
- ``automatic``: automatic archivals and tombstones that can still be reverted — the event is
  not reverted, its entry is the latest version, still in the status the event put it in, and
  no later event has touched it (otherwise a revert would skip it anyway);
- ``tombstones``: open tombstones (neither restored nor purged), the next purge first;
- ``disputes``: open disputes with both entries.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Substr

from maintenance import hygiene
from maintenance.models import Dispute, DisputeStatus, MaintenanceRun
from maintenance.runs import COUNT_KEYS
from maintenance.selectors import run_get, tombstone_list
from memory.models import Entry, LifecycleEvent, Status, Tombstone, Workspace

REVIEW_TABS = ("hygiene", "automatic", "tombstones", "disputes")
AUTOMATIC_TO = (Status.ARCHIVED, Status.TOMBSTONED)
EXCERPT_CHARS = 240
AFFECTED_ACTIONS = ("archived", "tombstoned", "purged")
MAX_ID = 2**63 - 1  # no database holds a larger id; SQLite refuses larger integers outright


def clean_ids(values: Iterable[Any]) -> tuple[list[int], list[str]]:
    """Form values as entry ids: positive integers a database can hold, deduplicated in order,
    and the values that are not such ids (reported back as skipped)."""
    good: dict[int, None] = {}
    bad: list[str] = []
    for value in values:
        text = str(value).strip()
        if text.isdigit() and 0 < int(text) <= MAX_ID:
            good.setdefault(int(text), None)
        else:
            bad.append(text)
    return list(good), bad


# --- hygiene ------------------------------------------------------------------------------


def hygiene_queue(
    workspace: Workspace, *, recommendation: str | None = None, reason: str | None = None
) -> tuple[int, list[hygiene.Candidate]]:
    """All candidates (their number, for the tab) and those matching the filters, best first.
    The scan reads entries in batches of 1,000: its queries grow per 1,000 entries, not per row."""
    found = hygiene.candidates(workspace)
    matching = [
        c
        for c in found
        if (not recommendation or c.recommendation == recommendation)
        and (not reason or any(r.code == reason for r in c.reasons))
    ]
    return len(found), matching


def hygiene_rows(candidates: Sequence[hygiene.Candidate]) -> list[dict[str, Any]]:
    """One page of candidates with what the table shows (one query)."""
    rows = {
        r["pk"]: r
        for r in Entry.objects.filter(pk__in=[c.id for c in candidates])
        .annotate(excerpt=Substr("content", 1, EXCERPT_CHARS))
        .values("pk", "title", "excerpt", "entry_type", "tier", "source")
    }
    return [
        {
            "id": c.id,
            "title": rows[c.id]["title"],
            "excerpt": rows[c.id]["excerpt"],
            "entry_type": rows[c.id]["entry_type"],
            "tier": rows[c.id]["tier"],
            "source": rows[c.id]["source"],
            "created_at": c.created_at,
            "access_count": c.access_count,
            "score": c.score,
            "reasons": [r.as_dict() for r in c.reasons],
            "recommendation": c.recommendation,
        }
        for c in candidates
        if c.id in rows  # purged between the scan and this read
    ]


def hygiene_reason_codes() -> list[str]:
    return [
        "incomplete_fragment",
        "truncated_or_unbalanced",
        "code_heavy",
        "implementation_residue",
        "exact_duplicate",
        "flagged_by_feedback",
        "legacy_import",
    ]


# --- automatic changes --------------------------------------------------------------------


def automatic_changes(
    workspace: Workspace, *, run_id: int | None = None, to_status: str | None = None
) -> QuerySet[LifecycleEvent]:
    """Automatic archivals and tombstones that a revert would still undo, newest run first,
    grouped by run (contiguous), oldest change first inside a run. An event belongs to the
    version it changed; after a content update the change lives on in the lineage's latest
    version, so the checks (and ``current_id``, the id to revert) look at that one."""
    lineage = OuterRef("entry__lineage_id")
    latest = Entry.objects.filter(workspace=workspace, lineage_id=lineage, is_latest=True)
    later = LifecycleEvent.objects.filter(workspace=workspace, entry__lineage_id=lineage).filter(
        Q(created_at__gt=OuterRef("created_at")) | Q(created_at=OuterRef("created_at"), pk__gt=OuterRef("pk"))
    )
    events = (
        LifecycleEvent.objects.filter(
            workspace=workspace,
            automatic=True,
            reverted_at__isnull=True,
            to_status__in=AUTOMATIC_TO,
            entry__isnull=False,
        )
        .filter(Exists(latest.filter(status=OuterRef("to_status"))))
        .exclude(Exists(later))
    )
    if run_id is not None:
        events = events.filter(run_id=run_id)
    if to_status in AUTOMATIC_TO:
        events = events.filter(to_status=to_status)
    return events.annotate(current_id=Subquery(latest.values("pk")[:1])).order_by(
        F("run_id").desc(nulls_last=True), "created_at", "pk"
    )


def automatic_rows(events: QuerySet[LifecycleEvent]) -> QuerySet[LifecycleEvent]:
    """What the table shows: the run (its header) and the entry's latest version, in one query."""
    lineage = OuterRef("entry__lineage_id")
    latest = Entry.objects.filter(lineage_id=lineage, is_latest=True)
    return (
        events.select_related("run")
        .defer("run__params", "run__affected", "run__result", "run__error")
        .annotate(
            title=Subquery(latest.values("title")[:1]),
            excerpt=Subquery(
                latest.annotate(excerpt=Substr("content", 1, EXCERPT_CHARS)).values("excerpt")[:1]
            ),
        )
    )


# --- tombstones ---------------------------------------------------------------------------


def open_tombstones(workspace: Workspace, *, reason: str | None = None) -> QuerySet[Tombstone]:
    """Open tombstones of live entries (not yet purged), the next purge first."""
    return tombstone_list(workspace, reason=reason or None).filter(entry__isnull=False)


def tombstone_rows(tombstones: QuerySet[Tombstone]) -> QuerySet[Tombstone]:
    return (
        tombstones.select_related("entry", "run")
        .annotate(excerpt=Substr("entry__content", 1, EXCERPT_CHARS))
        .defer("run__params", "run__affected", "run__result", "run__error", "entry__content")
    )


@dataclass(frozen=True)
class TombstoneRow:
    tombstone: Tombstone
    days_left: int  # whole days until purge_after, rounded up; 0 = due at the next run


def tombstone_countdown(tombstones: Iterable[Tombstone], now: datetime) -> list[TombstoneRow]:
    return [
        TombstoneRow(t, max(math.ceil((t.purge_after - now).total_seconds() / 86400), 0)) for t in tombstones
    ]


def tombstoned_entry_ids(workspace: Workspace, entry_ids: Sequence[int]) -> list[int]:
    """The requested entries of this workspace that have an open tombstone (one query)."""
    return sorted(
        open_tombstones(workspace).filter(entry_id__in=list(entry_ids)).values_list("entry_id", flat=True)
    )


# --- disputes -----------------------------------------------------------------------------


def dispute_queue(
    workspace: Workspace, *, status: str = DisputeStatus.OPEN, detected_by: str | None = None
) -> QuerySet[Dispute]:
    """Disputes with both entries in the same query, newest first."""
    disputes = Dispute.objects.filter(workspace=workspace)
    if status in DisputeStatus.values:
        disputes = disputes.filter(status=status)
    if detected_by in ("sweep", "write"):
        disputes = disputes.filter(detected_by=detected_by)
    return disputes.select_related("entry_a", "entry_b").order_by("-created_at", "-pk")


# --- counts of the tab bar ----------------------------------------------------------------


def review_counts(workspace: Workspace, *, known: Mapping[str, int] | None = None) -> dict[str, int]:
    """Tab → number of items, in tab order. ``known`` holds counts the caller already has (the
    hygiene scan is the expensive one; an unfiltered list's count is its tab's count)."""
    known = known or {}
    counters = {
        "hygiene": lambda: len(hygiene.candidates(workspace)),
        "automatic": lambda: automatic_changes(workspace).count(),
        "tombstones": lambda: open_tombstones(workspace).count(),
        "disputes": lambda: Dispute.objects.filter(workspace=workspace, status=DisputeStatus.OPEN).count(),
    }
    return {tab: known[tab] if tab in known else counters[tab]() for tab in REVIEW_TABS}


# --- runs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    run: MaintenanceRun
    duration: str


def duration(run: MaintenanceRun) -> str:
    if run.finished_at is None:
        return ""
    seconds = max((run.finished_at - run.started_at).total_seconds(), 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    return str(timedelta(seconds=round(seconds)))


def run_rows(runs: Iterable[MaintenanceRun]) -> list[RunRow]:
    return [RunRow(run, duration(run)) for run in runs]


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Affected:
    """One action's entries on one page: rows of {id, title, status, exists}."""

    action: str
    page: Page[int]
    rows: list[dict[str, Any]]


@dataclass(frozen=True)
class RunDetail:
    run: MaintenanceRun
    duration: str
    params: list[tuple[str, str]]
    counts: list[tuple[str, int]]
    affected: list[Affected]
    not_reverted: int  # archivals and tombstones of the run not undone (and not purged) yet
    reverted: int  # those already undone

    @property
    def can_revert(self) -> bool:
        """A real run that archived or tombstoned something."""
        return not self.run.dry_run and any(
            a.page.paginator.count for a in self.affected if a.action != "purged"
        )


def run_detail(
    workspace: Workspace, run_id: int, *, pages: Mapping[str, Any], per_page: int = 50
) -> RunDetail:
    """A run with its parameters, all counts, the affected entries by action (each action paged
    by ``pages[action]``; titles in one query) and how much of it is reverted. Four queries."""
    run = run_get(workspace, run_id)
    affected_ids = run.affected if isinstance(run.affected, dict) else {}
    paged = {
        action: Paginator(
            [i for i in affected_ids.get(action) or [] if isinstance(i, int)], per_page
        ).get_page(pages.get(action))
        for action in AFFECTED_ACTIONS
    }
    shown = {i for page in paged.values() for i in page.object_list}
    entries = {
        r["pk"]: r
        for r in Entry.objects.filter(workspace=workspace, pk__in=shown)
        .annotate(excerpt=Substr("content", 1, 80))
        .values("pk", "title", "excerpt", "status")
    }
    affected = [
        Affected(
            action,
            page,
            [
                {
                    "id": i,
                    "title": (entries[i]["title"] or entries[i]["excerpt"]) if i in entries else "",
                    "status": entries[i]["status"] if i in entries else "purged",
                    "exists": i in entries,
                }
                for i in page.object_list
            ],
        )
        for action, page in paged.items()
    ]
    state = LifecycleEvent.objects.filter(
        workspace=workspace, run=run, automatic=True, to_status__in=AUTOMATIC_TO
    ).aggregate(
        not_reverted=Count("pk", filter=Q(reverted_at__isnull=True, entry__isnull=False)),
        reverted=Count("pk", filter=Q(reverted_at__isnull=False)),
    )
    counts = run.counts if isinstance(run.counts, dict) else {}
    params = run.params if isinstance(run.params, dict) else {}
    return RunDetail(
        run=run,
        duration=duration(run),
        params=[(k, _shown(v)) for k, v in sorted(params.items())],
        counts=[(key, counts.get(key, 0)) for key in COUNT_KEYS],
        affected=affected,
        not_reverted=state["not_reverted"],
        reverted=state["reverted"],
    )
