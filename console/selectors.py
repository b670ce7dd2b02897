"""Reads of the console pages: the dashboard, the entries list and the entry page.

Each page costs a constant number of queries whatever the number of entries, runs or events:
counts and histograms are grouped in SQL, lists are sliced in SQL and their related rows are
fetched in one query each. Every function is scoped to the workspace it is given.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import date, datetime, timedelta
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import (
    Count,
    F,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Cast, Coalesce, Floor, Greatest, Least, Substr, TruncMonth, TruncWeek
from django_q.models import Schedule

from maintenance.models import Proposal, ProposalStatus, RunKind
from maintenance.schedules import SCHEDULES
from maintenance.tasks import RunHistory, due_at, policy_of, run_history
from memory import scoring, selectors
from memory.errors import NotFound
from memory.models import CodeAnchor, Entry, EntryAccess, LifecycleEvent, Relationship, Tombstone, Workspace
from memory.models.choices import Status
from memory.policy_model import MaintenancePolicy
from memory.scoring_db import relationship_count_expr

ENTRIES_PER_PAGE = 50
EVENTS_PER_PAGE = 25
HISTOGRAM_MAX_BINS = 20
# Bin widths the importance histogram chooses from, finest first.
BIN_WIDTHS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
LOG_SCALE_RATIO = 20
# Versions and links of one entry are shown up to this many; the page says when there are more.
ENTRY_LIST_CAP = 100
# The growth chart counts by week for a history of up to half a year, by month beyond.
WEEKLY_UP_TO = timedelta(weeks=26)
DISPATCH_SCHEDULE = "maintenance.dispatch"


LABEL_CHARS = 90


def first_line(text: Any) -> str:
    """The first non-empty line of ``text``, stripped ("" when there is none)."""
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def entry_label(title: Any, text: Any = "") -> str:
    """What names an entry in a list or a heading: its title, else the first non-empty line of
    its content (or of an excerpt of it), cut to ``LABEL_CHARS`` characters; "(empty)" when
    both are blank. Imported memories often have no title: each is told apart by its first
    line rather than all reading "(untitled)"."""
    label = str(title or "").strip() or first_line(text)
    if not label:
        return "(empty)"
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1].rstrip() + "…"


# --- dashboard --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrowthPoint:
    period: date
    label: str
    created: int  # lineages created in the period
    total: int  # lineages created up to the end of the period


def growth(workspace: Workspace) -> tuple[str, list[GrowthPoint]]:
    """Memories created over the workspace's history, by week or by month (empty periods
    included), in two queries. A memory is counted once per lineage, at its first version;
    purged lineages are gone and not counted."""
    firsts = Entry.objects.filter(workspace=workspace, lineage_id=F("pk"))
    span = firsts.aggregate(first=Min("created_at"), last=Max("created_at"))
    if span["first"] is None:
        return "week", []
    unit = "week" if span["last"] - span["first"] <= WEEKLY_UP_TO else "month"
    trunc = TruncWeek("created_at") if unit == "week" else TruncMonth("created_at")
    rows = firsts.annotate(period=trunc).values("period").annotate(n=Count("pk")).order_by("period")
    created = {row["period"].date(): row["n"] for row in rows}
    if not created:
        return unit, []
    points: list[GrowthPoint] = []
    period, last, total = min(created), max(created), 0
    while period <= last:
        total += created.get(period, 0)
        label = f"{period:%Y-%m-%d}" if unit == "week" else f"{period:%Y-%m}"
        points.append(GrowthPoint(period=period, label=label, created=created.get(period, 0), total=total))
        period = _next_period(period, unit)
    return unit, points


def _next_period(day: date, unit: str) -> date:
    if unit == "week":
        return day + timedelta(days=7)
    return date(day.year + day.month // 12, day.month % 12 + 1, 1)


@dataclass(frozen=True)
class Histogram:
    """Live memories by stored importance in ``len(counts)`` bins of ``width`` from ``start``
    (the last bin also holds its upper edge)."""

    start: float
    width: float
    counts: list[int]

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def labels(self) -> list[str]:
        """Each bin by its start, with as many decimals as the bin width needs."""
        decimals = max(1, -math.floor(math.log10(self.width) + 1e-9))
        return [f"{self.start + i * self.width:.{decimals}f}" for i in range(len(self.counts))]

    @property
    def skewed(self) -> bool:
        """One bin holds at least ``LOG_SCALE_RATIO`` times the smallest non-empty one: the
        chart then counts on a log scale, or the small bins would not show at all."""
        filled = [n for n in self.counts if n]
        return len(filled) > 1 and max(filled) >= LOG_SCALE_RATIO * min(filled)


def _bins(low: float, high: float) -> tuple[float, float, int]:
    """(start, width, number of bins): the finest ``BIN_WIDTHS`` width that spans
    [low, high] in at most ``HISTOGRAM_MAX_BINS`` bins, starting at a multiple of it. Real
    workspaces keep most importances within a few hundredths: fixed tenths drew one bar."""
    for width in BIN_WIDTHS:
        start = math.floor(low / width + 1e-9) * width
        n = math.floor((high - start) / width + 1e-9) + 1
        n = max(1, min(n, math.ceil((1.0 - start) / width - 1e-9)))  # 1.0 closes the last bin
        if n <= HISTOGRAM_MAX_BINS:
            return round(start, 6), width, n
    return 0.0, 0.1, 10


def importance_histogram(workspace: Workspace) -> Histogram:
    """Live latest entries by stored importance, on bins fitted to the range they span (two
    queries: the range, then the counts grouped in SQL)."""
    # Scores are clamped to [0, 1]; the bounds also leave out a NaN written past the services
    # (PostgreSQL orders it above every number, and its bin would not fit an integer).
    live = Entry.objects.of(workspace).live().filter(importance__gte=0.0, importance__lte=1.0)
    span = live.aggregate(low=Min("importance"), high=Max("importance"))
    if span["low"] is None:
        return Histogram(0.0, 0.1, [])
    low = min(max(float(span["low"]), 0.0), 1.0)
    high = min(max(float(span["high"]), low), 1.0)
    start, width, n = _bins(low, high)
    binned = Least(
        Greatest(
            Cast(Floor((F("importance") - Value(start)) / Value(width) + Value(1e-9)), IntegerField()),
            Value(0),
        ),
        Value(n - 1),
    )
    rows = live.annotate(bin=binned).values("bin").annotate(n=Count("pk")).order_by("bin")
    counts = [0] * n
    for row in rows:
        counts[int(row["bin"])] += row["n"]
    return Histogram(start, width, counts)


@dataclass(frozen=True)
class NextRun:
    kind: str
    state: str  # running | due | scheduled | waiting
    due_at: datetime | None
    note: str


@dataclass(frozen=True)
class RunSchedule:
    """When the dispatcher (``maintenance.tasks``) will start the next runs."""

    full: NextRun
    decay: NextRun
    dispatch_every_minutes: int
    dispatch_next: datetime | None
    scheduler_behind: bool  # the dispatcher's next pass is long overdue: is the cluster up?
    proposes: bool = False  # the workspace's runs propose their changes (review mode propose)


def interval(seconds: int) -> str:
    """A policy's interval as a person says it: "45 s", "10 min", "1 h 30 min", "24 h"."""
    if seconds < 60 or seconds % 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def _dispatch_minutes() -> int:
    return next((s.minutes for s in SCHEDULES if s.name == DISPATCH_SCHEDULE), 2)


def next_runs(workspace: Workspace, *, now: datetime) -> RunSchedule:
    """The next scheduled full run and decay sweep, by the dispatcher's own rules and history
    (``maintenance.tasks.run_history`` and ``due_at``; one query). Either starts at the first
    dispatcher pass at or after that time."""
    row: Any = (
        Workspace.objects.filter(pk=workspace.pk)
        .select_related("policy")
        .annotate(
            **run_history(now),
            dispatch_next=Subquery(
                Schedule.objects.filter(name=DISPATCH_SCHEDULE).order_by("pk").values("next_run")[:1]
            ),
        )
        .get()
    )
    policy = policy_of(row)
    minutes = _dispatch_minutes()
    every = f"the dispatcher checks every {minutes} minutes"
    history = RunHistory.of(row)
    if history.full_running:
        full_next = NextRun(RunKind.FULL, "running", None, "a full run is in progress")
        decay_next = NextRun(RunKind.DECAY, "waiting", None, "waits for the full run, which decays too")
    else:
        full_due, decay_due = due_at(history, policy)
        full_note = (
            f"every {policy.maintenance_interval_hours} h after the last completed full run; {every}"
            if history.last_full_finished is not None
            else f"no full run has completed yet; {every}"
        )
        full_next = _next(RunKind.FULL, full_due, now, full_note)
        decay_note = (
            f"every {interval(policy.decay_interval_seconds)} after the last sweep or full run; {every}"
        )
        if full_next.state == "due":  # the dispatcher enqueues the full run alone: it sweeps too
            decay_next = NextRun(
                RunKind.DECAY, "due", full_due, "with the full run that is due, which decays too"
            )
        else:
            decay_next = _next(RunKind.DECAY, decay_due, now, decay_note)
    dispatch_next = row.dispatch_next
    return RunSchedule(
        full=full_next,
        decay=decay_next,
        dispatch_every_minutes=minutes,
        dispatch_next=dispatch_next,
        scheduler_behind=dispatch_next is not None and now - dispatch_next > timedelta(minutes=3 * minutes),
        proposes=policy.proposes,
    )


def _next(kind: str, due: datetime | None, now: datetime, note: str) -> NextRun:
    if due is None or due <= now:
        return NextRun(kind, "due", due, note)
    return NextRun(kind, "scheduled", due, note)


# --- entries list -----------------------------------------------------------------------------


def entry_page_list(
    workspace: Workspace,
    *,
    status: str | None = None,
    entry_type: str | None = None,
    tier: str | None = None,
    tag: str | None = None,
    project: str | None = None,
    q: str | None = None,
    sort: str = "importance",
) -> QuerySet[Entry]:
    """The API's entry list (``memory.selectors.entry_list``) over every listed status, plus a
    plain substring filter ``q`` on title and content (both databases, no index needed for an
    operator's occasional look-up; the API's ranked full-text search is ``/search``)."""
    entries = selectors.entry_list(
        workspace,
        status=status,
        entry_type=entry_type,
        tier=tier,
        tag=tag,
        project=project,
        include_archived=True,
        include_staged=True,
        sort=sort,
    )
    if q:
        entries = entries.filter(Q(title__icontains=q) | Q(content__icontains=q))
    # The list shows an excerpt: never load 50,000-character contents for a page of 50.
    return (
        entries.defer("content", "metadata")
        .annotate(excerpt=Substr("content", 1, 160))
        .prefetch_related("tags")
    )


def cold_threshold(workspace: Workspace) -> float:
    """The workspace's cold threshold: the decay pass tombstones an episodic memory whose
    retention is below it (what the pages explaining retention quote)."""
    return float(MaintenancePolicy.for_workspace(workspace).cold_threshold)


def paginate(queryset: QuerySet[Any], page: Any, per_page: int) -> Page[Any]:
    """A page of the list (two queries: count and rows); a bad or too large page number gives
    the nearest valid page instead of an error."""
    return Paginator(queryset, per_page).get_page(page)


# --- entry page -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkView:
    id: int
    direction: str  # "out" or "in", seen from the entry
    type: str
    other_id: int
    other_label: str
    other_status: str
    other_is_latest: bool
    created_at: datetime
    pruned_at: datetime | None


@dataclass(frozen=True)
class EntryPage:
    entry: Entry
    latest_id: int  # the lineage's latest version (the entry itself when it is the latest)
    readers: int
    breakdown: dict[str, Any]  # the API's importance_breakdown: components, multipliers, inputs
    anchors: list[CodeAnchor]
    tags: list[str]
    links: list[LinkView]
    links_more: bool
    versions: list[Entry]
    versions_more: bool
    tombstone: Tombstone | None
    history: Page[LifecycleEvent]
    held: bool  # an operator hold is in force: automation leaves the entry alone
    proposals: list[Any]  # open proposals of this entry, awaiting approval
    cold_threshold: float  # the policy's: what the page's note on retention quotes

    @property
    def is_old_version(self) -> bool:
        return self.latest_id != self.entry.pk


def entry_page(workspace: Workspace, entry_id: int, *, now: datetime, events_page: Any = 1) -> EntryPage:
    """One entry (any version, tombstoned ones too: the operator restores them here) with
    everything its page shows, in a constant number of queries. The importance breakdown is
    the one ``GET /entries/{id}`` returns (``memory.scoring.importance_breakdown`` as of
    ``now``)."""
    latest = Entry.objects.filter(
        workspace=workspace, lineage_id=OuterRef("lineage_id"), is_latest=True
    ).values("pk")[:1]
    readers = (
        EntryAccess.objects.filter(workspace=workspace, lineage_id=OuterRef("lineage_id"))
        .order_by()
        .values("lineage_id")
        .annotate(n=Count("pk"))
        .values("n")[:1]
    )
    found: Any = (
        Entry.objects.filter(workspace=workspace, pk=entry_id)
        .select_related("score")
        .annotate(
            live_links=relationship_count_expr(),
            live_causal=relationship_count_expr(causal_only=True),
            latest_id=Subquery(latest),
            readers=Coalesce(Subquery(readers), 0),
        )
        .prefetch_related("tags", Prefetch("anchors", queryset=CodeAnchor.objects.order_by("pk")))
        .first()
    )
    if found is None:
        raise NotFound(f"entry {entry_id} not found")
    entry: Entry = found
    anchors = list(entry.anchors.all())
    worst = scoring.worst_anchor(a.status for a in anchors)
    age_days = scoring.days_between(now.timestamp(), entry.created_at.timestamp())
    breakdown = scoring.importance_breakdown(
        impact_score=entry.impact_score,
        significance_type=entry.significance_type,
        relationship_count=int(found.live_links),
        causal_count=int(found.live_causal),
        age_days=age_days,
        trust_score=entry.trust_score,
        validation_status=entry.validation_status,
        anchor_status=str(worst),
    )
    links, links_more = _links(workspace, entry)
    versions, versions_more = _capped(
        Entry.objects.filter(workspace=workspace, lineage_id=entry.lineage_id or entry.pk)
        .order_by("-created_at", "-pk")
        .only("pk", "title", "status", "is_latest", "created_at", "content_hash")
    )
    latest_id = found.latest_id or entry.pk
    tombstoned = entry.status == Status.TOMBSTONED and entry.is_latest
    policy = MaintenancePolicy.for_workspace(workspace)
    return EntryPage(
        entry=entry,
        latest_id=latest_id,
        readers=int(found.readers),
        breakdown={
            **asdict(breakdown),
            "relationship_count": int(found.live_links),
            "causal_count": int(found.live_causal),
            "age_days": age_days,
            "anchor_status": str(worst),
        },
        anchors=anchors,
        tags=[t.name for t in entry.tags.all()],
        links=links,
        links_more=links_more,
        versions=versions,
        versions_more=versions_more,
        tombstone=selectors.open_tombstone(workspace, entry) if tombstoned else None,
        history=paginate(selectors.entry_history(workspace, entry), events_page, EVENTS_PER_PAGE),
        held=entry.held_at is not None and entry.hold_active(now=now, hold_days=policy.operator_hold_days),
        cold_threshold=policy.cold_threshold,
        proposals=list(
            Proposal.objects.filter(workspace=workspace, entry_ref=entry.pk, status=ProposalStatus.OPEN)
            .only("pk", "action", "reason", "why", "run_id", "entry_ref")
            .order_by("pk")
        ),
    )


def _capped(queryset: QuerySet[Any]) -> tuple[list[Any], bool]:
    rows = list(queryset[: ENTRY_LIST_CAP + 1])
    return rows[:ENTRY_LIST_CAP], len(rows) > ENTRY_LIST_CAP


def _links(workspace: Workspace, entry: Entry) -> tuple[list[LinkView], bool]:
    """Links in both directions with the other end's label and status, in one query."""
    rows, more = _capped(
        Relationship.objects.filter(workspace=workspace)
        .filter(Q(from_entry_id=entry.pk) | Q(to_entry_id=entry.pk))
        .annotate(
            from_excerpt=Substr("from_entry__content", 1, 160),
            to_excerpt=Substr("to_entry__content", 1, 160),
        )
        .order_by("pk")
        .values(
            "pk",
            "type",
            "from_entry_id",
            "to_entry_id",
            "created_at",
            "pruned_at",
            "from_entry__title",
            "from_entry__status",
            "from_entry__is_latest",
            "from_excerpt",
            "to_entry__title",
            "to_entry__status",
            "to_entry__is_latest",
            "to_excerpt",
        )
    )
    views = []
    for row in rows:
        side = "to" if row["from_entry_id"] == entry.pk else "from"
        views.append(
            LinkView(
                id=row["pk"],
                direction="out" if side == "to" else "in",
                type=row["type"],
                other_id=row[f"{side}_entry_id"],
                other_label=entry_label(row[f"{side}_entry__title"], row[f"{side}_excerpt"]),
                other_status=row[f"{side}_entry__status"],
                other_is_latest=row[f"{side}_entry__is_latest"],
                created_at=row["created_at"],
                pruned_at=row["pruned_at"],
            )
        )
    return views, more
