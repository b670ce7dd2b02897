"""The hygiene queue: stored text verdicts, and the candidates counted, ranked and paged.

The text detectors' verdict and points are stored per entry (``HygieneAssessment``) and reused
while the entry's title, content hash and the residue patterns (with ``DETECTORS_VERSION``) stay
the ones it was made with. A run's plan never stores verdicts (``PlanVerdicts`` keeps them until
its transaction is over). The database adds the column reasons' points, filters, counts and
ranks (``scored_entries``): a page or the tab's count reads no entry it does not show.
"""

from __future__ import annotations

import functools
import itertools
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import IO, Any, NamedTuple

import orjson
from django.db.models import (
    Case,
    Exists,
    F,
    IntegerField,
    JSONField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, Substr
from django.utils import timezone

from maintenance import hygiene_rank
from maintenance.hygiene_text import (
    ARCHIVE_SCORE,
    CANDIDATE_SCORE,
    FEEDBACK_FLAGS,
    POINTS,
    Candidate,
    Pattern,
    Reason,
    column_reasons,
    compile_residue_patterns,
    patterns_key,
    score,
    text_reasons,
)
from maintenance.models import HygieneAssessment
from maintenance.plan_status import status_in
from memory.models import Entry, Workspace
from memory.models.choices import EXCERPT_CHARS, LIVE_STATUSES, Source, Status
from memory.policy import PolicyValues
from memory.policy_model import MaintenancePolicy

PREVIEW_EXCERPT_CHARS = 300  # the API preview's excerpt; listings show EXCERPT_CHARS
BATCH_SIZE = 1000


def read_policy(workspace: Workspace) -> tuple[PolicyValues, list[Pattern]]:
    """The workspace's policy and residue patterns, read fresh (one query)."""
    row = MaintenancePolicy.read(workspace)
    return row.values(), compile_residue_patterns(row.residue_patterns)


def not_kept(qs: QuerySet[Entry]) -> QuerySet[Entry]:
    """An operator's keep holds while the content is the one they kept."""
    return qs.exclude(review_kept_hash=F("content_hash"))


def eligible_entries(
    workspace: Workspace, policy: PolicyValues, now: datetime | None = None
) -> QuerySet[Entry]:
    """Entries the preview considers: active latest entries automation may touch (the one
    protection rule: an operator hold included), not kept."""
    qs = Entry.objects.filter(workspace=workspace, is_latest=True, status=Status.ACTIVE)
    return not_kept(
        qs.unprotected(
            now=now or timezone.now(), hold_days=policy.operator_hold_days, exclude_tags=policy.exclude_tags
        )
    )


# Per content hash, (created_at, id) of its oldest live latest entry, or None: what
# ``_oldest_live`` found so far for one caller's scan.
Oldest = dict[str, tuple[datetime, int] | None]


def _oldest_live(workspace: Workspace, hashes: set[str], known: Oldest | None = None) -> Oldest:
    """For each hash, (created_at, id) of its oldest live latest entry (one query), or None.
    ``known``: what earlier calls of the same scan found, read again for no hash (and filled)."""
    known = {} if known is None else known
    wanted = hashes - known.keys()
    known.update(dict.fromkeys(wanted))
    rows = Entry.objects.filter(
        status_in(LIVE_STATUSES), workspace=workspace, is_latest=True, content_hash__in=wanted
    ).values_list("content_hash", "created_at", "pk")
    for h, created, pk in rows:
        first = known[h]
        if first is None or (created, pk) < first:
            known[h] = (created, pk)
    return {h: known[h] for h in hashes}


_SCAN_FIELDS = ("pk", "content_hash", "source", "last_feedback", "access_count", "created_at")


def _text_reasons_of(rows: list[dict[str, Any]], patterns: Sequence[Pattern], *, store: bool) -> None:
    """Fill ``text_reasons`` of the rows that have no valid stored assessment: read their title
    and content (one query), run the text detectors, and store the verdicts (one upsert)."""
    missing = [r for r in rows if r["stored_reasons"] is None]
    if not missing:
        for r in rows:
            r["text_reasons"] = [Reason(**d) for d in r["stored_reasons"]]
        return
    texts = {
        pk: (title, content, h)
        for pk, title, content, h in Entry.objects.filter(pk__in=[r["pk"] for r in missing]).values_list(
            "pk", "title", "content", "content_hash"
        )
    }
    key = patterns_key(patterns)
    fresh: list[HygieneAssessment] = []
    for r in rows:
        if r["stored_reasons"] is not None:
            r["text_reasons"] = [Reason(**d) for d in r["stored_reasons"]]
            continue
        title, content, h = texts.get(r["pk"], ("", "", r["content_hash"]))
        r["text_reasons"] = text_reasons(title, content, patterns)
        if r["pk"] in texts:
            fresh.append(
                HygieneAssessment(
                    entry_id=r["pk"],
                    content_hash=h,
                    title=title,
                    patterns_key=key,
                    reasons=[x.as_dict() for x in r["text_reasons"]],
                    points=score(r["text_reasons"]),
                )
            )
    if store and fresh:
        _store(fresh)
    elif fresh and (kept := _plan_verdicts.get()) is not None:
        kept.add(fresh)


def _store(assessments: list[HygieneAssessment]) -> None:
    HygieneAssessment.objects.bulk_create(
        assessments,
        update_conflicts=True,
        unique_fields=["entry"],
        update_fields=["content_hash", "title", "patterns_key", "reasons", "points"],
    )


class PlanVerdicts:
    """The text verdicts a run's plan makes. The plan cannot store them (its writes are rolled
    back, and would hold their rows' locks until then), so they are spooled to a temporary file
    — memory stays flat at any size — and stored once its transaction is over: the apply, the
    next plan and the hygiene queue then read them instead of running the detectors again
    (most of the low-quality pass, in the plan and in the apply alike:
    bench/reports/maintenance.md, section "Cheaper reverts, verdicts made once and in the
    background"). A verdict names the title, content hash and patterns it was made with, so one
    stored late for an entry changed meanwhile is simply never read."""

    def __init__(self, spool: IO[bytes]) -> None:
        self._file = spool
        self.count = 0

    @contextmanager
    def kept(self) -> Iterator[None]:
        token = _plan_verdicts.set(self)
        try:
            yield
        finally:
            _plan_verdicts.reset(token)

    def add(self, assessments: list[HygieneAssessment]) -> None:
        for a in assessments:
            row = [a.entry_id, a.content_hash, a.title, a.patterns_key, a.reasons, a.points]
            self._file.write(orjson.dumps(row) + b"\n")
        self.count += len(assessments)

    def store(self, on_batch: Callable[[], None] = lambda: None) -> int:
        """Store the kept verdicts, BATCH_SIZE to a statement (each its own transaction).
        Returns how many were stored."""
        self._file.seek(0)
        batch: list[HygieneAssessment] = []
        for line in itertools.chain(self._file, [None]):
            if line is not None:
                entry_id, content_hash, title, key, reasons, points = orjson.loads(line)
                batch.append(
                    HygieneAssessment(
                        entry_id=entry_id,
                        content_hash=content_hash,
                        title=title,
                        patterns_key=key,
                        reasons=reasons,
                        points=points,
                    )
                )
            if batch and (line is None or len(batch) >= BATCH_SIZE):
                _store(batch)
                batch = []
                on_batch()
        return self.count


@contextmanager
def plan_verdicts() -> Iterator[PlanVerdicts]:
    """A ``PlanVerdicts`` over a temporary file, removed at the end."""
    with tempfile.TemporaryFile() as spool:
        yield PlanVerdicts(spool)


_plan_verdicts: ContextVar[PlanVerdicts | None] = ContextVar("plan_verdicts", default=None)


def _stored(patterns: Sequence[Pattern]) -> QuerySet[HygieneAssessment]:
    """The valid stored assessment of the outer entry: same title, content hash and patterns."""
    return HygieneAssessment.objects.filter(
        entry=OuterRef("pk"),
        content_hash=OuterRef("content_hash"),
        title=OuterRef("title"),
        patterns_key=patterns_key(patterns),
    )


def scan(
    workspace: Workspace,
    qs: QuerySet[Entry],
    patterns: Sequence[Pattern],
    *,
    batch_size: int = BATCH_SIZE,
    on_batch: Callable[[], None] = lambda: None,
    store: bool = True,
    oldest: Oldest | None = None,
) -> Iterator[Candidate]:
    """Assess every entry of ``qs`` in keyset batches; yields the candidates (score ≥
    CANDIDATE_SCORE). The text detectors run only for entries without a valid stored
    assessment (``HygieneAssessment``: same title, content hash and patterns), whose verdicts
    are then stored (``store``; not by a run's plan, whose writes are rolled back anyway and
    would hold the rows' locks until then). Queries per batch: two, plus two when some entry
    needs assessing. ``oldest``: the duplicates' oldest copies found by earlier scans of the
    same caller, where nothing changed meanwhile (``_oldest_live``)."""
    stored = _stored(patterns).values("reasons")[:1]
    last = 0
    while True:
        rows = list(
            qs.filter(pk__gt=last)
            .order_by("pk")
            .annotate(stored_reasons=Subquery(stored, output_field=JSONField()))
            .values(*_SCAN_FIELDS, "stored_reasons")[:batch_size]
        )
        if not rows:
            return
        last = rows[-1]["pk"]
        _text_reasons_of(rows, patterns, store=store)
        yield from (c for c in _candidates_of(workspace, rows, oldest) if c.score >= CANDIDATE_SCORE)
        on_batch()


def _assess_missing(
    workspace: Workspace,
    qs: QuerySet[Entry],
    patterns: Sequence[Pattern],
    *,
    until: Callable[[], bool] = lambda: False,
) -> tuple[int, bool]:
    """Assess and store the entries of ``qs`` that have no valid stored assessment (keyset
    batches, each stored at once; once every entry has one, this is one query that finds none).
    ``until`` is asked after every batch: True stops there. Returns (entries assessed, whether
    none is left)."""
    missing = qs.exclude(Exists(_stored(patterns)))
    last = assessed = 0
    while True:
        rows = [
            {**r, "stored_reasons": None}
            for r in missing.filter(pk__gt=last).order_by("pk").values(*_SCAN_FIELDS)[:BATCH_SIZE]
        ]
        if not rows:
            return assessed, True
        last = rows[-1]["pk"]
        _text_reasons_of(rows, patterns, store=True)
        assessed += len(rows)
        if until():
            return assessed, False


def assess_in_background(
    workspace: Workspace, *, until: Callable[[], bool] = lambda: False
) -> tuple[int, bool]:
    """What the worker's ``maintenance.hygiene_verdicts`` schedule does for one workspace: its
    active latest entries without a valid stored verdict — written since, through any door, or
    made with other residue patterns — are assessed and stored, a batch at a time (each batch a
    short transaction of its own). The hygiene queue and the low-quality pass then find them
    made instead of running the detectors in a request or inside a run's plan (on a large
    workspace the first visitor of the queue waited minutes for them:
    bench/reports/maintenance.md, section "Cheaper reverts, verdicts made once and in the
    background"). Returns (entries assessed, whether none is left)."""
    _, patterns = read_policy(workspace)
    active = Entry.objects.filter(workspace=workspace, is_latest=True, status=Status.ACTIVE)
    return _assess_missing(workspace, active, patterns, until=until)


def fold_rank(workspace: Workspace) -> dict[str, int]:
    """Fold the workspace's kept rank (``hygiene_rank.fold``) with its current patterns."""
    _, patterns = read_policy(workspace)
    return hygiene_rank.fold(workspace, patterns)


def scored_entries(workspace: Workspace, qs: QuerySet[Entry], patterns: Sequence[Pattern]) -> QuerySet[Entry]:
    """The entries of ``qs`` with their score (``hygiene_points``), computed by the database:
    the stored text points plus the column reasons (an older live copy, flagging feedback, an
    import) — the rule of ``assess`` and ``score``, read from the same POINTS (a parity test
    compares both). NULL for an entry without a valid stored assessment (``_assess_missing``
    makes them)."""
    stored = _stored(patterns)
    points = (
        Subquery(stored.values("points")[:1], output_field=IntegerField())
        + Case(When(_older_copy(workspace), then=Value(POINTS["exact_duplicate"])), default=Value(0))
        + Case(
            When(_COLUMN_RULES["flagged_by_feedback"], then=Value(POINTS["flagged_by_feedback"])),
            default=Value(0),
        )
        + Case(When(_COLUMN_RULES["legacy_import"], then=Value(POINTS["legacy_import"])), default=Value(0))
    )
    return qs.annotate(hygiene_points=points)


def may_archive(workspace: Workspace, qs: QuerySet[Entry], patterns: Sequence[Pattern]) -> QuerySet[Entry]:
    """The entries of ``qs`` whose score, computed by the database (``scored_entries``), reaches
    ARCHIVE_SCORE, and those without a valid stored assessment (the scan assesses them): what
    the low-quality pass reads into Python, instead of every entry it considers (440,000 at
    1,000,000 entries, to archive ~7,000). The score is compared once (NULL counts as reaching
    it): an OR of two comparisons would compute it twice for most rows."""
    at_least = Coalesce(F("hygiene_points"), Value(ARCHIVE_SCORE))
    return (
        scored_entries(workspace, qs, patterns)
        .alias(archive_floor=at_least)
        .filter(archive_floor__gte=ARCHIVE_SCORE)
    )


def _older_copy(workspace: Workspace) -> Q:
    """The outer entry has an older live latest copy (same content hash): ``exact_duplicate``."""
    return Q(
        Exists(
            Entry.objects.filter(
                status_in(LIVE_STATUSES),
                workspace=workspace,
                is_latest=True,
                content_hash=OuterRef("content_hash"),
            ).filter(
                Q(created_at__lt=OuterRef("created_at"))
                | Q(created_at=OuterRef("created_at"), pk__lt=OuterRef("pk"))
            )
        )
    )


# The column reasons read from the entry's own row (``column_reasons``), as conditions.
_COLUMN_RULES = {
    "flagged_by_feedback": Q(last_feedback__in=FEEDBACK_FLAGS),
    "legacy_import": Q(source=Source.IMPORT),
}


def _rank_filter(workspace: Workspace, recommendation: str | None, reason: str | None) -> Q:
    """The kept rank's rows (``HygieneRank``) matching the filters, as a condition on them: a
    recommendation from the points and the entry's reads, a column reason as the entry's
    condition, a text reason found in the stored verdict's reasons (JSON text; a code is a
    bare identifier, so ``"code": "<code>"`` appears in the text only as that key and value).
    A row still to assess (NULL points) matches whatever the filters: it makes the counts
    tell, and is assessed before the page is read again."""
    entry = Entry.objects.filter(pk=OuterRef("entry_id"))
    wanted = Q()
    if recommendation in ("archive", "review"):
        archive = Q(points__gte=ARCHIVE_SCORE) & Q(Exists(entry.filter(access_count=0)))
        wanted &= archive if recommendation == "archive" else ~archive
    if reason == "exact_duplicate":
        wanted &= Q(Exists(entry.filter(_older_copy(workspace))))
    elif reason in _COLUMN_RULES:
        wanted &= Q(Exists(entry.filter(_COLUMN_RULES[reason])))
    elif reason:
        text = HygieneAssessment.objects.annotate(stored_text=Cast("reasons", TextField()))
        code = f'"code": "{reason}"'
        wanted &= Q(Exists(text.filter(entry_id=OuterRef("entry_id"), stored_text__contains=code)))
    return wanted | Q(points__isnull=True)


def _candidates_of(
    workspace: Workspace, rows: list[dict[str, Any]], known: Oldest | None = None
) -> list[Candidate]:
    """Each row as a Candidate (their order kept): its ``text_reasons`` and the column reasons,
    the duplicate's older id found for these rows alone (one query; ``known``: see
    ``_oldest_live``). The caller filters."""
    oldest = _oldest_live(workspace, {r["content_hash"] for r in rows}, known)
    found = []
    for r in rows:
        first = oldest.get(r["content_hash"])
        older = first[1] if first and first < (r["created_at"], r["pk"]) else None
        reasons = [
            *r["text_reasons"],
            *column_reasons(source=r["source"], last_feedback=r["last_feedback"], duplicate_of=older),
        ]
        found.append(Candidate(r["pk"], r["created_at"], r["access_count"], tuple(reasons)))
    return found


class _Queue(NamedTuple):
    rows: QuerySet[Entry]  # the candidates, best first, after the entries still to assess,
    # with their stored text reasons (``stored_reasons``)
    assess: Callable[[], object]  # assesses those (their points are NULL until then)


def _queue(workspace: Workspace) -> _Queue:
    """The hygiene queue as one statement: candidates best first (score desc, created_at, id),
    preceded by the eligible entries without a valid stored assessment (NULL points, NULLS
    FIRST). In the steady state there are none and one pass over the entries answers; when
    there are, the caller assesses them and asks again."""
    policy, patterns = read_policy(workspace)
    eligible = eligible_entries(workspace, policy)
    scored = scored_entries(workspace, eligible, patterns)
    ranked = scored.filter(Q(hygiene_points__gte=CANDIDATE_SCORE) | Q(hygiene_points__isnull=True)).order_by(
        F("hygiene_points").desc(nulls_first=True), "created_at", "pk"
    )
    reasons = Subquery(_stored(patterns).values("reasons")[:1], output_field=JSONField())
    return _Queue(
        ranked.annotate(stored_reasons=reasons), lambda: _assess_missing(workspace, eligible, patterns)
    )


_ROW = (*_SCAN_FIELDS, "stored_reasons", "hygiene_points")


def _listed(workspace: Workspace, rows: list[dict[str, Any]]) -> list[Candidate]:
    """Candidates of rows of the queue (scored, so their stored reasons are there), in order,
    BATCH_SIZE rows to a query for the duplicates' older ids."""
    found: list[Candidate] = []
    for start in range(0, len(rows), BATCH_SIZE):
        chunk = rows[start : start + BATCH_SIZE]
        for r in chunk:
            r["text_reasons"] = [Reason(**d) for d in r["stored_reasons"]]
        found += _candidates_of(workspace, chunk)
    return found


def candidates(workspace: Workspace) -> list[Candidate]:
    """Every hygiene candidate of the workspace, best first: score desc, created_at, id."""
    queue = _queue(workspace)
    rows = queue.rows.values(*_ROW).iterator(chunk_size=BATCH_SIZE)
    first = next(rows, None)
    if first is not None and first["hygiene_points"] is None:  # entries to assess come first
        queue.assess()
        rows = queue.rows.values(*_ROW).iterator(chunk_size=BATCH_SIZE)
        first = next(rows, None)
    # A NULL left now is an entry changed while it was assessed: listed next time.
    ahead = [first] if first is not None else []
    return _listed(workspace, [r for r in itertools.chain(ahead, rows) if r["hygiene_points"] is not None])


def _rank_ready(
    workspace: Workspace, policy: PolicyValues, patterns: Sequence[Pattern], now: datetime
) -> None:
    """Assess the queue's entries that have no valid stored verdict yet (``to_assess``: their
    rank rows) and fold those verdicts into the kept rank."""
    missing = hygiene_rank.to_assess(workspace, policy, now).values("entry_id")
    _assess_missing(workspace, Entry.objects.filter(pk__in=missing), patterns)
    hygiene_rank.fold(workspace, patterns)


def count(workspace: Workspace, *, cap: int | None = None) -> int:
    """How many hygiene candidates the workspace has (the review tab's count), read from the
    kept rank (``hygiene_rank``) once it is folded. With ``cap``, more than ``cap`` candidates
    already assessed answer ``cap + 1`` (``memory.capped``) before any entry is assessed;
    fewer are counted exactly, entries still to assess assessed first."""
    policy, patterns = read_policy(workspace)
    now = timezone.now()
    hygiene_rank.fold(workspace, patterns)
    for attempt in range(2):
        assessed, missing = hygiene_rank.counted(workspace, policy, now, cap=cap)
        if (cap is not None and assessed > cap) or not missing or attempt:
            return assessed
        _rank_ready(workspace, policy, patterns, now)
    return assessed


def _page_rows(ranked: list[tuple[int, int | None]], patterns: Sequence[Pattern]) -> list[dict[str, Any]]:
    """The rows ``_listed`` reads, for the page's ids in their order, with their stored text
    reasons (two small queries); an entry changed since it was ranked is left out."""
    ids = [pk for pk, points in ranked if points is not None]
    rows = {r["pk"]: r for r in Entry.objects.filter(pk__in=ids).values(*_SCAN_FIELDS, "title")}
    stored = {
        a.pk: a
        for a in HygieneAssessment.objects.filter(pk__in=ids, patterns_key=patterns_key(patterns)).only(
            "content_hash", "title", "reasons"
        )
    }
    out = []
    for pk in ids:
        row, made = rows.get(pk), stored.get(pk)
        if (
            row is None
            or made is None
            or (made.content_hash, made.title) != (row["content_hash"], row["title"])
        ):
            continue
        out.append({**row, "stored_reasons": made.reasons})
    return out


def page(
    workspace: Workspace,
    *,
    limit: int,
    offset: int = 0,
    recommendation: str | None = None,
    reason: str | None = None,
) -> tuple[int, list[Candidate]]:
    """How many candidates match the filters (``recommendation`` archive/review, a
    ``reason`` code), and the page ``offset``..``offset + limit`` of them, best first, read
    from the kept rank (``hygiene_rank``) once it is folded: the database filters its rows,
    counts and ranks them in one statement, and only the page's rows come back. Entries
    still to assess are assessed first (then the statement runs again)."""
    start, end = max(offset, 0), max(offset, 0) + max(limit, 0)
    policy, patterns = read_policy(workspace)
    now = timezone.now()
    hygiene_rank.fold(workspace, patterns)
    where = _rank_filter(workspace, recommendation, reason) if recommendation or reason else None
    read = functools.partial(hygiene_rank.ranked_page, workspace, policy, now, where=where)
    for attempt in range(2):
        ranked, matching, listed = read(start=start, end=end)
        if not ranked:  # a page past the last candidate (or an empty one): counts from the first
            _, matching, listed = read(start=0, end=1)
        if matching == listed or attempt:
            break
        # Entries to assess come first (NULL points): assessed and folded, then read again.
        _rank_ready(workspace, policy, patterns, now)
    return listed, _listed(workspace, _page_rows(ranked, patterns))


def candidate_rows(
    candidates: Sequence[Candidate], *, excerpt_chars: int = EXCERPT_CHARS
) -> list[dict[str, Any]]:
    """A page of candidates with what a listing shows (one query): the console's table, the
    command's, and the API's preview (whose excerpt is longer)."""
    rows = {
        r["pk"]: r
        for r in Entry.objects.filter(pk__in=[c.id for c in candidates])
        .annotate(excerpt=Substr("content", 1, excerpt_chars))
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


def preview(workspace: Workspace, *, limit: int = 50, offset: int = 0) -> dict[str, Any]:
    """The hygiene queue: ``count`` candidates in all, and one page of them (``page``), each
    as the API shows it (the excerpt as ``content_excerpt``)."""
    total, page_ = page(workspace, limit=limit, offset=offset)
    rows = candidate_rows(page_, excerpt_chars=PREVIEW_EXCERPT_CHARS)
    return {
        "count": total,
        "candidates": [
            {("content_excerpt" if k == "excerpt" else k): v for k, v in r.items() if k != "tier"}
            for r in rows
        ],
    }
