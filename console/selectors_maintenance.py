"""Reads behind the console's review queue and run pages. Every function is scoped to
the workspace it is given, and each list is a queryset (or a list) the view pages through, so a
page costs the same number of queries whatever the number of rows.

The review queue has five tabs:

- ``pending``: the open proposal set, grouped by reason in run order — first,
  and the default, while it is not empty;
- ``hygiene``: the hygiene candidates, filtered by recommendation or reason;
- ``automatic``: automatic archivals and tombstones that can still be reverted — the event is
  not reverted, its entry is the latest version, still in the status the event put it in, and
  no later event has touched it (otherwise a revert would skip it anyway);
- ``tombstones``: open tombstones (neither restored nor purged), the next purge first;
- ``disputes``: open disputes with both entries.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Substr
from django.utils import timezone

from console.selectors import entry_label
from maintenance import hygiene, hygiene_text, proposals
from maintenance.models import Dispute, DisputeStatus, MaintenanceRun, Proposal, ProposalStatus, RunStatus
from maintenance.run_results import COUNT_KEYS, METRICS, PROPOSING, ROWS_KEY
from maintenance.selectors import (
    EVENT_STATUS_OF,
    AffectedIds,
    changed_entries,
    run_get,
    tombstone_list,
)
from memory import capped, holds
from memory.models import Entry, LifecycleEvent, Tombstone, Workspace
from memory.models.choices import EXCERPT_CHARS, ID_MAX, Status
from memory.models.entries import held
from memory.policy_model import MaintenancePolicy

REVIEW_TABS = ("pending", "hygiene", "automatic", "tombstones", "disputes")
AUTOMATIC_TO = (Status.ARCHIVED, Status.TOMBSTONED)
AFFECTED_ACTIONS = ("archived", "tombstoned", "purged")


def clean_ids(values: Iterable[Any]) -> tuple[list[int], list[str]]:
    """Form values as entry ids: positive integers a database can hold, deduplicated in order,
    and the values that are not such ids (reported back as skipped)."""
    good: dict[int, None] = {}
    bad: list[str] = []
    for value in values:
        text = str(value).strip()
        if text.isdigit() and 0 < int(text) <= ID_MAX:
            good.setdefault(int(text), None)
        else:
            bad.append(text)
    return list(good), bad


# --- pending approval ---------------------------------------------------------------------


def pending_proposals(workspace: Workspace, *, reason: str | None = None) -> QuerySet[Proposal]:
    """The open proposal set (``maintenance.proposals.open_set``) in the order the page shows
    it: by reason in run order, then by entry; each row with its run, and the entry's title,
    excerpt and hold in the same query."""
    order = Case(
        *(When(reason=key, then=Value(i)) for i, key in enumerate(proposals.ACTIONS)),
        default=Value(len(proposals.ACTIONS)),
        output_field=IntegerField(),
    )
    return (
        proposals.open_set(workspace, reason=reason or None)
        .select_related("run", "entry")
        .defer(
            "run__params",
            "run__affected",
            "run__result",
            "run__error",
            "entry__content",
            "entry__metadata",
        )
        .annotate(run_order=order, excerpt=Substr("entry__content", 1, EXCERPT_CHARS))
        .order_by("run_order", "entry_ref")
    )


def pending_groups(workspace: Workspace) -> list[dict[str, Any]]:
    """The open set by reason, in run order: [{reason, label, action, count}] (one query)."""
    return proposals.counts_by_reason(workspace)


def pending_sections(rows: Iterable[Proposal], groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One page of proposals cut into its reason groups: [{reason, label, action, count, rows}]
    (``count``: the whole reason's open proposals, not only this page's)."""
    by_reason = {g["reason"]: g for g in groups}
    sections: list[dict[str, Any]] = []
    for row in rows:
        if not sections or sections[-1]["reason"] != row.reason:
            group = by_reason.get(row.reason) or {
                "reason": row.reason,
                "label": proposals.REASON_LABELS.get(row.reason, row.reason),
                "action": row.action,
                "count": 0,
            }
            sections.append({**group, "rows": []})
        sections[-1]["rows"].append(row)
    return sections


def pending_totals(groups: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """{"all", "archive", "tombstone"}: the open proposals and how many of each action."""
    totals = {"all": 0, "archive": 0, "tombstone": 0}
    for group in groups:
        totals["all"] += group["count"]
        totals[group["action"]] += group["count"]
    return totals


# --- hygiene ------------------------------------------------------------------------------


class HygieneQueue(Sequence[hygiene_text.Candidate]):
    """The hygiene candidates matching the filters, best first, for a Paginator: its length is
    their number, and a slice reads that page from the database (``hygiene.page``: filtered,
    counted and ranked there; only the page's rows come back). The page asked for first is
    read at once; the Paginator asks for it again (or for the last one) without a second
    statement unless the number was past the end."""

    def __init__(
        self,
        workspace: Workspace,
        *,
        recommendation: str | None = None,
        reason: str | None = None,
        offset: int = 0,
        limit: int = 25,
    ) -> None:
        self._read = functools.partial(hygiene.page, workspace, recommendation=recommendation, reason=reason)
        self.offset = max(offset, 0)
        self.total, self.rows = self._read(limit=limit, offset=self.offset)

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("the hygiene queue is read a page at a time")
        start, stop, _ = index.indices(self.total)
        if stop <= start:
            return []
        if start == self.offset and stop - start <= len(self.rows):
            return self.rows[: stop - start]
        return self._read(limit=stop - start, offset=start)[1]


def hygiene_queue(
    workspace: Workspace,
    *,
    recommendation: str | None = None,
    reason: str | None = None,
    page: Any = None,
    per_page: int = 25,
) -> Page:
    """The page ``page`` (a number; anything else or out of range: as ``Paginator.get_page``)
    of the candidates matching the filters."""
    number = 1
    if isinstance(page, str) and page.isascii() and page.isdigit() and len(page) < 10:
        number = max(int(page), 1)
    queue = HygieneQueue(
        workspace,
        recommendation=recommendation,
        reason=reason,
        offset=(number - 1) * per_page,
        limit=per_page,
    )
    return Paginator(queue, per_page).get_page(number)


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
    later = (
        LifecycleEvent.objects.filter(workspace=workspace, entry__lineage_id=lineage)
        .filter(
            Q(created_at__gt=OuterRef("created_at"))
            | Q(created_at=OuterRef("created_at"), pk__gt=OuterRef("pk"))
        )
        .exclude(reason__in=holds.EVENT_REASONS)  # a hold or release changes no status
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


def hold_days(workspace: Workspace) -> int:
    """The workspace's ``operator_hold_days`` (0: a hold lasts until released)."""
    return MaintenancePolicy.for_workspace(workspace).operator_hold_days


def automatic_rows(
    events: QuerySet[LifecycleEvent], *, now: datetime | None = None, hold_days: int = 0
) -> QuerySet[LifecycleEvent]:
    """What the table shows: the run (its header) and the entry's latest version with its
    operator hold (``held_by``, ``held_at``, ``hold_reason``; empty when not held), in one query."""
    lineage = OuterRef("entry__lineage_id")
    latest = Entry.objects.filter(lineage_id=lineage, is_latest=True)
    holding = latest.filter(held(now=now or timezone.now(), hold_days=hold_days))
    return (
        events.select_related("run")
        .defer("run__params", "run__affected", "run__result", "run__error")
        .annotate(
            title=Subquery(latest.values("title")[:1]),
            excerpt=Subquery(
                latest.annotate(excerpt=Substr("content", 1, EXCERPT_CHARS)).values("excerpt")[:1]
            ),
            held_by=Subquery(holding.values("held_by")[:1]),
            held_at=Subquery(holding.values("held_at")[:1]),
            hold_reason=Subquery(holding.values("hold_reason")[:1]),
        )
    )


# --- tombstones ---------------------------------------------------------------------------


def open_tombstones(workspace: Workspace, *, reason: str | None = None) -> QuerySet[Tombstone]:
    """Open tombstones of live entries (not yet purged), the next purge first."""
    return tombstone_list(workspace, reason=reason or None).filter(entry__isnull=False)


def tombstone_rows(
    tombstones: QuerySet[Tombstone], *, now: datetime | None = None, hold_days: int = 0
) -> QuerySet[Tombstone]:
    """The rows with the entry (``held``: its operator hold is in force) and the run."""
    holding = Entry.objects.filter(pk=OuterRef("entry_id")).filter(
        held(now=now or timezone.now(), hold_days=hold_days)
    )
    return (
        tombstones.select_related("entry", "run")
        .annotate(excerpt=Substr("entry__content", 1, EXCERPT_CHARS), held=Exists(holding))
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


def open_review(workspace: Workspace) -> dict[str, QuerySet[Any]]:
    """The open review work of the tabs a count needs no scoring for, by tab: open proposals
    (``pending``), automatic changes a revert would undo, open tombstones, open disputes. The
    review page's tab counts and the header's live counts both count these."""
    return {
        "pending": proposals.open_proposals(workspace),
        "automatic": automatic_changes(workspace),
        "tombstones": open_tombstones(workspace),
        "disputes": Dispute.objects.filter(workspace=workspace, status=DisputeStatus.OPEN),
    }


def review_counts(workspace: Workspace, *, known: Mapping[str, int] | None = None) -> dict[str, int]:
    """Tab → number of items, in tab order, each capped at ``memory.capped.CAP`` + 1 (pages
    show "1,000+"): the page costs the same at a million entries as at a thousand. ``known``
    holds counts the caller already has (an unfiltered list's count is its tab's count)."""
    known = known or {}
    lists = open_review(workspace)
    counted = {**capped.capped_counts({tab: qs for tab, qs in lists.items() if tab not in known}), **known}
    if "hygiene" not in counted:
        counted["hygiene"] = hygiene.count(workspace, cap=capped.CAP)
    found = {tab: counted[tab] for tab in REVIEW_TABS}
    # Pending approval leads while it has rows; an empty one goes last, out of the way.
    if not found["pending"]:
        found["pending"] = found.pop("pending")
    return found


def default_tab(workspace: Workspace) -> str:
    """Pending approval while the open proposal set is not empty, else hygiene."""
    return "pending" if proposals.open_count(workspace) else "hygiene"


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


# Count keys a propose-mode run reports for changes it proposed instead of making.
PROPOSED_KEYS = (*PROPOSING, "summaries_created")


@dataclass(frozen=True)
class RunCounts:
    """A run's counts as pages show them: the changes (``(key, n, proposed)``: ``proposed``
    when the run only proposed it) apart from the measurements (``METRICS``)."""

    changes: list[tuple[str, int, bool]]
    metrics: list[tuple[str, int]]


def count_of(counts: Any, key: str) -> int:
    """One count of a run's stored counts as a number (``reclaimed_rows``, a mapping by kind of
    row, counts its total); 0 when absent."""
    value = counts.get(key) if isinstance(counts, dict) else None
    if isinstance(value, dict):
        return sum(int(n or 0) for n in value.values() if isinstance(n, int | float))
    return int(value or 0) if isinstance(value, int | float) else 0


def run_counts(run: MaintenanceRun, *, all_keys: bool = False) -> RunCounts:
    """The counts of ``run`` in ``COUNT_KEYS`` order; only the non-zero ones unless ``all_keys``."""
    counts = {key: count_of(run.counts, key) for key in COUNT_KEYS}
    proposed = run.status == RunStatus.PROPOSED
    changes = [
        (key, counts[key], proposed and key in PROPOSED_KEYS)
        for key in COUNT_KEYS
        if key not in METRICS and (all_keys or counts[key])
    ]
    metrics = [(key, int(counts.get(key) or 0)) for key in METRICS if all_keys or counts.get(key)]
    return RunCounts(changes=changes, metrics=metrics)


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
    total: int  # the true count (a dry run's record lists only the first AFFECTED_KEPT)
    complete: bool


@dataclass(frozen=True)
class RunDetail:
    run: MaintenanceRun
    duration: str
    params: list[tuple[str, str]]
    counts: RunCounts
    affected: list[Affected]
    not_reverted: int  # archivals and tombstones of the run not undone (and not purged) yet
    reverted: int  # those already undone
    # Of those not undone, the ones a revert would still undo (``automatic_changes`` of this
    # run): the number the Automatic changes tab and the header count for it.
    undoable: int
    proposed: dict[str, int]  # a proposed run: {"archive": n, "tombstone": n} it proposed
    awaiting: dict[str, int]  # … and of those, still open (awaiting approval), by action
    reclaimed_rows: list[tuple[str, int]]  # bookkeeping rows the reclaim pass removed, by kind

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
    by ``pages[action]``; titles in one query), how much of it is reverted and, for a proposed
    run, how many of its proposals still await approval. Five queries, and for a real run one
    more per action with entries (a page of its events)."""
    run = run_get(workspace, run_id)
    # A real run's lists are its LifecycleEvents (counted below with the reverts, each page
    # one query); a dry run's come from its record (``AffectedIds``).
    # One query: how much of the run is reverted, and how many entries each action has.
    undoable = Q(to_status__in=AUTOMATIC_TO)
    state = LifecycleEvent.objects.filter(
        workspace=workspace, run=run, automatic=True, to_status__in=list(EVENT_STATUS_OF.values())
    ).aggregate(
        not_reverted=Count("pk", filter=undoable & Q(reverted_at__isnull=True, entry__isnull=False)),
        reverted=Count("pk", filter=undoable & Q(reverted_at__isnull=False)),
        **{action: Count("pk", filter=Q(to_status=status)) for action, status in EVENT_STATUS_OF.items()},
    )
    totals = {action: state[action] for action in EVENT_STATUS_OF} if changed_entries(run) else {}
    lists = {action: AffectedIds(run, action, totals.get(action)) for action in AFFECTED_ACTIONS}
    paged = {action: Paginator(ids, per_page).get_page(pages.get(action)) for action, ids in lists.items()}
    shown = {i for page in paged.values() for i in page.object_list}
    entries = {
        r["pk"]: r
        for r in Entry.objects.filter(workspace=workspace, pk__in=shown)
        .annotate(excerpt=Substr("content", 1, 160))
        .values("pk", "title", "excerpt", "status")
    }
    affected = [
        Affected(
            action,
            page,
            [
                {
                    "id": i,
                    "title": entry_label(entries[i]["title"], entries[i]["excerpt"]) if i in entries else "",
                    "status": entries[i]["status"] if i in entries else "purged",
                    "exists": i in entries,
                }
                for i in page.object_list
            ],
            lists[action].total,
            lists[action].complete,
        )
        for action, page in paged.items()
    ]
    params = run.params if isinstance(run.params, dict) else {}
    result = run.result if isinstance(run.result, dict) else {}
    found = result.get("proposed")
    proposed: dict[str, Any] = found if isinstance(found, dict) else {}
    awaiting = dict.fromkeys(("archive", "tombstone"), 0)
    if run.status == RunStatus.PROPOSED:
        awaiting.update(
            Proposal.objects.filter(workspace=workspace, run=run, status=ProposalStatus.OPEN)
            .values("action")
            .annotate(n=Count("pk"))
            .values_list("action", "n")
        )
    return RunDetail(
        run=run,
        duration=duration(run),
        params=[(k, _shown(v)) for k, v in sorted(params.items())],
        counts=run_counts(run, all_keys=True),
        affected=affected,
        not_reverted=state["not_reverted"],
        reverted=state["reverted"],
        undoable=automatic_changes(workspace, run_id=run.pk).count() if state["not_reverted"] else 0,
        proposed={
            "archive": int(proposed.get("archive") or 0),
            "tombstone": int(proposed.get("tombstone") or 0),
        },
        awaiting=awaiting,
        reclaimed_rows=[
            (str(kind), int(n))
            for kind, n in ((run.counts or {}).get(ROWS_KEY) or {}).items()
            if isinstance(n, int) and n
        ]
        if isinstance(run.counts, dict) and isinstance(run.counts.get(ROWS_KEY), dict)
        else [],
    )
