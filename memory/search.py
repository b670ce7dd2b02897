"""Full-text search over a workspace's memories (``GET /search``), one behaviour on
PostgreSQL and SQLite.

Results are the latest versions with status active or stale (plus archived when asked for),
never staged or tombstoned, of one workspace; ranked by text rank (title weighs more than
content), then importance, then newest id. Snippets are plain text from the content with the
matched words between ``«`` and ``»``; clients escape them like any other text. Pages of one
query are slices of one order, whatever the page size: a broad query (``broad_threshold``)
ranks only its ``RANK_CAP`` most important matches, then lists the rest by importance,
unranked, and says so (``ranked``; on PostgreSQL ``count`` is then an estimate). The contract
is in docs/api.md ("Search"); the costs in bench/reports/api.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.utils.dateparse import parse_datetime

from memory.errors import InvalidInput
from memory.models import Entry, Workspace
from memory.models.choices import OFFSET_MAX, Status
from memory.search_query import ParsedQuery, parse_query
from memory.selectors import bounded_count

Q_MAX = 500  # characters
LIMIT_MAX = 500  # the bounds of every list page (api.schemas.PAGE_MAX, OFFSET_MAX)
MARK_START = "«"
MARK_END = "»"
SNIPPET_WORDS = 24  # words around the first match, on both backends
TITLE_WEIGHT = 10.0  # SQLite bm25 column weights; PostgreSQL weighs title A (1.0), content B (0.4)
CONTENT_WEIGHT = 5.0
RANK_CAP = 100  # a broad query ranks this many of its most important matches
BROAD_MIN = 2_000  # a query with at most this many matches is always ranked exactly
WALK_RATIO = 2  # ranking a match costs about twice walking past an entry (PostgreSQL, measured)


@dataclass(frozen=True)
class SearchHit:
    id: int
    title: str
    snippet: str
    rank: float | None  # higher is better, within one result; None: not ranked (see RANK_CAP)
    importance: float
    status: str
    entry_type: str
    created_at: datetime


@dataclass(frozen=True)
class SearchResult:
    count: int  # all matches, of which ``hits`` are the best ``limit``
    hits: list[SearchHit]
    count_exact: bool = True  # False: ``count`` is PostgreSQL's estimate (a broad query)
    ranked: int | None = None  # matches that were ranked (``count`` when all were)

    def __post_init__(self) -> None:
        if self.ranked is None:
            object.__setattr__(self, "ranked", self.count)


def broad_threshold(visible: int) -> int:
    """More matches than this make a query broad: sqrt(RANK_CAP x N / WALK_RATIO) of the
    workspace's N visible entries, at least BROAD_MIN. Ranking costs time per match (each needs
    its table row), so a broad query ranks only its RANK_CAP most important matches, found by
    walking the entries in importance order (an index scan; broad matches are dense) until
    RANK_CAP of them match; a narrower query ranks every match exactly. The threshold balances
    the two ways, so either costs about as much as ranking the threshold's matches.
    PostgreSQL decides from the planner's estimate (from the tsvector statistics), checked once
    per query by a bounded walk and cached with it, so every page of a query takes the same
    way; SQLite counts its matches exactly."""
    return max(BROAD_MIN, math.isqrt(RANK_CAP * max(visible, 0) // WALK_RATIO))


def search(
    workspace: Workspace,
    q: str,
    *,
    limit: int = 20,
    offset: int = 0,
    include_archived: bool = False,
) -> SearchResult:
    """The best latest entries of ``workspace`` matching ``q``, ``limit`` of them from
    ``offset`` on, with the total count (an estimate for a broad query on PostgreSQL, see
    ``broad_threshold``). Pages are slices of one order: a broad query's RANK_CAP ranked matches
    first, then its further matches by importance.

    One SQL statement for most searches, at most five (the planner's estimate, the visible
    count and whether a query is broad are cached; a broad estimate that finds too few
    matches ranks them all after all). An empty or too long ``q`` or an out-of-range ``limit``
    or ``offset`` is InvalidInput; a ``q`` of only stop words or punctuation finds nothing.
    """
    if not isinstance(q, str) or not q.strip():
        raise InvalidInput("q: must not be empty")
    if len(q) > Q_MAX:
        raise InvalidInput(f"q: {len(q)} characters, at most {Q_MAX} allowed")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIMIT_MAX:
        raise InvalidInput(f"limit: must be between 1 and {LIMIT_MAX}")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= OFFSET_MAX:
        raise InvalidInput(f"offset: must be between 0 and {OFFSET_MAX}")
    parsed = parse_query(q)
    if not parsed.groups:
        return SearchResult(count=0, hits=[])

    statuses = [Status.ACTIVE.value, Status.STALE.value]
    if include_archived:
        statuses.append(Status.ARCHIVED.value)
    if connection.vendor == "postgresql":
        found = _search_postgresql(workspace.pk, parsed, statuses, limit, offset)
    elif connection.vendor == "sqlite":
        found = _search_sqlite(workspace.pk, parsed, statuses, limit, offset)
    else:  # pragma: no cover - only the two supported databases have an index
        raise NotImplementedError(f"search is not available on {connection.vendor}")

    hits = [
        SearchHit(
            id=row[0],
            title=row[1],
            snippet=" ".join((row[2] or "").split()),
            rank=None if row[3] is None else float(row[3]),
            importance=float(row[4]),
            status=row[5],
            entry_type=row[6],
            created_at=_datetime(row[7]),
        )
        for row in found.rows
    ]
    return SearchResult(count=found.count, hits=hits, count_exact=found.count_exact, ranked=found.ranked)


@dataclass(frozen=True)
class _Found:
    rows: list[Any]  # id, title, snippet, rank, importance, status, entry_type, created_at
    count: int
    ranked: int
    count_exact: bool = True


def _visible(workspace_id: int, statuses: list[str]) -> int:
    """The workspace's latest entries a search may return (exact up to 10,000, then cached)."""
    rows = Entry.objects.filter(workspace_id=workspace_id, is_latest=True, status__in=statuses)
    return bounded_count(
        rows.on_index("entry_by_importance").order_by(), key=f"search-visible:{workspace_id}:{statuses!r}"
    )


# ts_headline reads HTML tags as markup and leaves them out of the snippet; a zero-width space
# after every "<" stops that (SQLite's snippet keeps them) and is taken out again afterwards.
# The headline is computed for the returned rows only, not for every match.
_ZWSP = "\u200b"
# The page's rows hang off a one-row summary (LEFT JOIN), so the total comes back with an
# empty page too: a page past the last match still says how many there are.
_POSTGRESQL_HEADLINE = """
SELECT e.id, e.title,
       replace(
           ts_headline('english', replace(e.content, '<', '<' || %(zwsp)s),
                       websearch_to_tsquery('english', %(q)s), %(headline)s),
           %(zwsp)s, ''),
       r.score, e.importance, e.status, e.entry_type, e.created_at, s.total
FROM (SELECT count(*) AS total FROM {counted}) s
LEFT JOIN ranked r ON true
LEFT JOIN memory_entry e ON e.id = r.id
ORDER BY r.top DESC, r.score DESC, r.importance DESC, r.id DESC
"""
# querytree() is 'T' for a query that only excludes: a guard should PostgreSQL's parser drop
# a word this module kept, since such a query would match everything without the excluded word.
_POSTGRESQL_MATCHES = """
    FROM memory_entry e, websearch_to_tsquery('english', %(q)s) AS query
    WHERE e.search_vector @@ query
      AND querytree(query) <> 'T'
      AND e.workspace_id = %(workspace)s
      AND e.is_latest
      AND e.status = ANY(%(statuses)s)
"""
# The ranks are computed first (a materialized CTE of narrow rows, not every match's tsvector),
# then sorted and counted.
_POSTGRESQL_SQL = (
    """
WITH matches AS MATERIALIZED (
    SELECT e.id, ts_rank_cd(e.search_vector, query) AS score, e.importance"""
    + _POSTGRESQL_MATCHES
    + """
),
ranked AS (
    SELECT id, score, importance, true AS top
    FROM matches
    ORDER BY score DESC, importance DESC, id DESC
    LIMIT %(limit)s OFFSET %(offset)s
)"""
    + _POSTGRESQL_HEADLINE.format(counted="matches")
)
# The workspace's visible entries in importance order, at most %(walk)s of them (NULL: all).
# No covering index can make this walk index-only: it would have to carry the tsvector, and a
# long entry's tsvector exceeds a btree row's 2,704 bytes.
_POSTGRESQL_WALK = """
    SELECT e.id, e.search_vector, e.importance
    FROM memory_entry e
    WHERE e.workspace_id = %(workspace)s AND e.is_latest AND e.status = ANY(%(statuses)s)
    ORDER BY e.importance DESC, e.id DESC
    LIMIT %(walk)s
"""
# Whether a query is broad: do %(cap)s of its matches lie within the first %(walk)s entries?
_POSTGRESQL_BROAD_CHECK = (
    """
SELECT count(*) FROM (
    SELECT 1
    FROM ("""
    + _POSTGRESQL_WALK
    + """) w, websearch_to_tsquery('english', %(q)s) AS query
    WHERE w.search_vector @@ query AND querytree(query) <> 'T'
    LIMIT %(cap)s
) found"""
)
# A broad query's page: walk for its first %(depth)s matches (the page's end, at least
# %(cap)s); the first %(cap)s of them ("top") are ranked by text, the rest follow by importance
# (not ranked: no score).
_POSTGRESQL_BROAD_SQL = (
    """
WITH walked AS ("""
    + _POSTGRESQL_WALK
    + """),
candidates AS MATERIALIZED (
    SELECT w.id, w.importance, w.search_vector
    FROM walked w, websearch_to_tsquery('english', %(q)s) AS query
    WHERE w.search_vector @@ query AND querytree(query) <> 'T'
    ORDER BY w.importance DESC, w.id DESC
    LIMIT %(depth)s
),
numbered AS (
    SELECT c.id, c.importance, c.search_vector,
           row_number() OVER (ORDER BY c.importance DESC, c.id DESC) <= %(cap)s AS top
    FROM candidates c
),
ranked AS (
    SELECT n.id, n.importance, n.top,
           CASE WHEN n.top THEN ts_rank_cd(n.search_vector, query) END AS score
    FROM numbered n, websearch_to_tsquery('english', %(q)s) AS query
    ORDER BY top DESC, score DESC, importance DESC, id DESC
    LIMIT %(limit)s OFFSET %(offset)s
)"""
    + _POSTGRESQL_HEADLINE.format(counted="candidates")
)


ESTIMATE_CACHE_SECONDS = 300  # the planner's statistics change only when the table is analysed


def _cache_key(kind: str, params: dict[str, Any]) -> str:
    words = json.dumps([params["workspace"], params["statuses"], params["q"]])
    return f"search-{kind}:" + hashlib.sha256(words.encode()).hexdigest()


def _estimate(cursor: Any, params: dict[str, Any]) -> int:
    """The planner's estimate of a query's matches, kept for ESTIMATE_CACHE_SECONDS per
    workspace, statuses and query: planning the EXPLAIN cost ~1 ms of every search. The
    estimate picks how to rank and is the ``count`` a broad query reports (flagged as an
    estimate); one up to 5 minutes old serves both."""
    key = _cache_key("estimate", params)
    cached = cache.get(key)
    if cached is not None:
        return int(cached)
    cursor.execute("EXPLAIN (FORMAT JSON) SELECT 1" + _POSTGRESQL_MATCHES, params)
    plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    estimate = int(plan[0]["Plan"]["Plan Rows"])
    cache.set(key, estimate, ESTIMATE_CACHE_SECONDS)
    return estimate


def _search_postgresql(
    workspace_id: int, parsed: ParsedQuery, statuses: list[str], limit: int, offset: int
) -> _Found:
    params: dict[str, Any] = {
        "q": parsed.websearch(),
        "workspace": workspace_id,
        "statuses": statuses,
        "limit": limit,
        "offset": offset,
        "cap": RANK_CAP,
        "zwsp": _ZWSP,
        "headline": (
            f'StartSel="{MARK_START}", StopSel="{MARK_END}", '
            f"MaxWords={SNIPPET_WORDS}, MinWords={SNIPPET_WORDS // 3}"
        ),
    }
    with connection.cursor() as cursor:
        # EXPLAIN plans with the values given (bound client-side into the text, or as
        # parameters with DB_PREPARED), so the planner sees the query's words and estimates
        # its matches from the tsvector statistics.
        estimate = _estimate(cursor, params)
        if estimate > BROAD_MIN:
            visible = _visible(workspace_id, statuses)
            # The table's statistics are shared by every workspace: a small workspace's
            # estimate can exceed the entries it has.
            estimate = min(estimate, visible)
            if estimate > broad_threshold(visible):
                found = _search_broad(cursor, params, estimate, visible)
                if found is not None:
                    return found
        cursor.execute(_POSTGRESQL_SQL, params)
        rows = cursor.fetchall()
    total = rows[0][8]
    rows = [row for row in rows if row[0] is not None]  # the summary row of an empty page
    return _Found(rows=rows, count=total, ranked=total)


def _search_broad(cursor: Any, params: dict[str, Any], estimate: int, visible: int) -> _Found | None:
    """A page of a query the estimate calls broad, or None if it is not broad after all.

    Whether it is, is decided once per query (cached like the estimate), not per page, so
    that every page is a slice of one order: broad if RANK_CAP matches lie within
    4 x RANK_CAP x visible / estimate entries of the importance walk (four times as far as
    the estimate says they should). A page then walks as far as its end needs."""
    depth = max(RANK_CAP, params["offset"] + params["limit"])
    bound = min(visible, math.ceil(4 * RANK_CAP * visible / estimate))
    key = _cache_key("broad", params)
    broad = cache.get(key)
    if broad is None and depth > RANK_CAP:
        cursor.execute(_POSTGRESQL_BROAD_CHECK, {**params, "walk": bound})
        broad = cursor.fetchone()[0] >= RANK_CAP
        cache.set(key, broad, ESTIMATE_CACHE_SECONDS)
    if broad is False:
        return None
    # The first page's walk is bounded (it decides, if nothing has yet); a deeper page walks
    # on until it has its matches or the workspace ends.
    walk = bound if depth == RANK_CAP else None
    cursor.execute(_POSTGRESQL_BROAD_SQL, {**params, "walk": walk, "depth": depth})
    rows = cursor.fetchall()
    found = rows[0][8]
    rows = [row for row in rows if row[0] is not None]
    if found < RANK_CAP:  # not within the bound (or no longer, the data having changed)
        cache.set(key, False, ESTIMATE_CACHE_SECONDS)
        return None
    if broad is None:  # the first page decided
        cache.set(key, True, ESTIMATE_CACHE_SECONDS)
    if walk is None and found < depth:  # walked the whole workspace: every match counted
        return _Found(rows=rows, count=found, ranked=RANK_CAP)
    return _Found(rows=rows, count=max(estimate, found), ranked=RANK_CAP, count_exact=False)


# bm25() is lower for better matches, hence the minus: "rank" is higher-is-better everywhere.
# FTS5's auxiliary functions only work in the query that does the MATCH and not under a window
# function, so the matches are ranked first and the snippet is made in a second MATCH limited
# to the returned rowids: for the returned rows only, not for every match. CROSS JOIN fixes
# SQLite's join order: left to right, the index first (the planner otherwise may walk the
# workspace's entries and run the full-text query once per entry). Each match's filter columns
# come from the covering index SQLITE_COVER_INDEX, not from its wide row (half the time of a
# broad query at 100,000 entries; the planner takes the table's own key unless told). A broad
# query (more matches than the threshold) ranks only its most important RANK_CAP matches
# ("top"; the rest follow by importance) and needs only as many as the page reaches (LIMIT -1:
# all). bm25 is computed in a second pass over the full-text matches for the top candidates
# only ("+rowid": a test per row, not a lookup per candidate, which re-runs the query each
# time): at 13,900 matches bm25 over all of them cost more than the rest of the query.
_SQLITE_MATCHES = """
WITH matches AS MATERIALIZED (
    SELECT e.id, e.importance
    FROM memory_entry_fts CROSS JOIN memory_entry e INDEXED BY entry_search_cover
      ON e.id = memory_entry_fts.rowid
    WHERE memory_entry_fts MATCH %(match)s
      AND e.workspace_id = %(workspace)s
      AND e.is_latest
      AND e.status IN ({statuses})
)"""
# All matches (n) and how many of them are ranked (cap): all, or RANK_CAP of a broad query.
_SQLITE_TOTAL = """,
total AS MATERIALIZED (
    SELECT count(*) AS n, CASE WHEN count(*) > %(threshold)s THEN %(cap)s ELSE count(*) END AS cap
    FROM matches
)"""
_SQLITE_SQL = (
    _SQLITE_MATCHES
    + _SQLITE_TOTAL
    + """,
candidates AS MATERIALIZED (
    SELECT id, importance,
           row_number() OVER (ORDER BY importance DESC, id DESC) <= (SELECT cap FROM total) AS top
    FROM matches
    ORDER BY importance DESC, id DESC
    LIMIT CASE WHEN (SELECT n FROM total) > %(threshold)s THEN %(depth)s ELSE -1 END
),
scores AS MATERIALIZED (
    SELECT rowid AS id, -bm25(memory_entry_fts, %(title_weight)s, %(content_weight)s) AS score
    FROM memory_entry_fts
    WHERE memory_entry_fts MATCH %(match)s AND +rowid IN (SELECT id FROM candidates WHERE top)
),
ranked AS MATERIALIZED (
    SELECT c.id, s.score, c.importance, c.top, (SELECT n FROM total) AS total,
           min((SELECT n FROM total), (SELECT cap FROM total)) AS ranked
    FROM candidates c LEFT JOIN scores s ON s.id = c.id
    ORDER BY c.top DESC, s.score DESC, c.importance DESC, c.id DESC
    LIMIT %(limit)s OFFSET %(offset)s
)
SELECT e.id, e.title,
       snippet(memory_entry_fts, 1, %(start)s, %(end)s, '', %(words)s),
       r.score, e.importance, e.status, e.entry_type, e.created_at, r.total, r.ranked
FROM ranked r
CROSS JOIN memory_entry_fts ON memory_entry_fts.rowid = r.id
CROSS JOIN memory_entry e ON e.id = r.id
WHERE memory_entry_fts MATCH %(match)s
ORDER BY r.top DESC, r.score DESC, r.importance DESC, r.id DESC
"""
)
_SQLITE_COUNT_SQL = _SQLITE_MATCHES + _SQLITE_TOTAL + "\nSELECT n, min(n, cap) FROM total"


def _search_sqlite(
    workspace_id: int, parsed: ParsedQuery, statuses: list[str], limit: int, offset: int
) -> _Found:
    names = [f"status{i}" for i in range(len(statuses))]
    in_statuses = ", ".join(f"%({name})s" for name in names)
    params: dict[str, Any] = {
        "title_weight": TITLE_WEIGHT,
        "content_weight": CONTENT_WEIGHT,
        "match": parsed.fts5(),
        "workspace": workspace_id,
        **dict(zip(names, statuses, strict=True)),
        "threshold": broad_threshold(_visible(workspace_id, statuses)),
        "cap": RANK_CAP,
        "depth": max(RANK_CAP, offset + limit),
        "limit": limit,
        "offset": offset,
        "start": MARK_START,
        "end": MARK_END,
        "words": SNIPPET_WORDS,
    }
    with connection.cursor() as cursor:
        cursor.execute(_SQLITE_SQL.format(statuses=in_statuses), params)
        rows = cursor.fetchall()
        if not rows and offset:  # a page past the last match: count them apart
            cursor.execute(_SQLITE_COUNT_SQL.format(statuses=in_statuses), params)
            count, ranked = cursor.fetchone()
            return _Found(rows=[], count=count, ranked=ranked)
    if not rows:
        return _Found(rows=[], count=0, ranked=0)
    return _Found(rows=rows, count=rows[0][8], ranked=rows[0][9])


def _datetime(value: Any) -> datetime:
    """What the ORM would make of a raw column: SQLite stores naive UTC (as text, or parsed
    into a naive datetime by Django's converters); PostgreSQL returns an aware datetime."""
    parsed = value if isinstance(value, datetime) else parse_datetime(value)
    if parsed is None:  # pragma: no cover - Django always writes ISO text
        raise ValueError(f"not a datetime: {value!r}")
    if settings.USE_TZ and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed
