"""Full-text search (GET /search): the same behaviour on SQLite (FTS5) and PostgreSQL
(tsvector): words, stems, phrases, exclusions and OR; text rank before importance; latest live
entries of one workspace only; an index that follows every write path, raw SQL included; no
input that raises."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory import accounts, entry_changes, new_entries
from memory import search as search_module
from memory.errors import InvalidInput
from memory.journal_import import SAMPLE_PATH, import_journal
from memory.models import Entry, Workspace
from memory.models.choices import Status
from memory.search import MARK_END, MARK_START, search
from memory.search_index import ensure_sqlite_index
from memory.search_query import parse_query

pytestmark = pytest.mark.django_db


def _entry(workspace: Workspace, content: str, title: str = "", **fields) -> Entry:
    return new_entries.entry_create(workspace=workspace, content=content, title=title, **fields)


def _ids(workspace: Workspace, q: str, **kwargs) -> list[int]:
    return [hit.id for hit in search(workspace, q, **kwargs).hits]


# --- matching -------------------------------------------------------------------------------


def test_it_finds_an_entry_by_a_word_of_its_content(workspace):
    found = _entry(workspace, "The deploy script restarts the queue workers")
    _entry(workspace, "Nothing to see here")

    assert _ids(workspace, "workers") == [found.pk]
    assert _ids(workspace, "WORKERS") == [found.pk]


def test_it_finds_a_word_by_its_stem_in_both_directions(workspace):
    cache = _entry(workspace, "We cache the rendered template")
    caching = _entry(workspace, "Caching made the page fast")

    assert set(_ids(workspace, "caching")) == {cache.pk, caching.pk}
    assert set(_ids(workspace, "cache")) == {cache.pk, caching.pk}


def test_all_words_must_be_present(workspace):
    both = _entry(workspace, "redis holds the session store")
    _entry(workspace, "redis holds the rate limits")

    assert _ids(workspace, "redis session") == [both.pk]


def test_a_quoted_phrase_needs_its_words_together_and_in_order(workspace):
    phrase = _entry(workspace, "Use the connection pool for every request")
    _entry(workspace, "The pool of workers keeps a connection each")

    assert _ids(workspace, '"connection pool"') == [phrase.pk]


def test_a_dashed_word_excludes_the_entries_that_contain_it(workspace):
    kept = _entry(workspace, "Migrations run on deploy")
    _entry(workspace, "Migrations run on deploy, except on sqlite")

    assert _ids(workspace, "migrations -sqlite") == [kept.pk]
    assert _ids(workspace, 'migrations -"except on sqlite"') == [kept.pk]


def test_or_finds_entries_with_either_word(workspace):
    postgres = _entry(workspace, "postgres needs a GIN index")
    sqlite = _entry(workspace, "sqlite needs an FTS5 table")
    _entry(workspace, "mysql is not supported")

    assert set(_ids(workspace, "postgres or sqlite")) == {postgres.pk, sqlite.pk}
    assert set(_ids(workspace, "postgres OR sqlite")) == {postgres.pk, sqlite.pk}


def test_and_binds_tighter_than_or(workspace):
    a = _entry(workspace, "alpha bravo")
    c = _entry(workspace, "charlie")
    _entry(workspace, "alpha delta")

    assert set(_ids(workspace, "alpha bravo or charlie")) == {a.pk, c.pk}


def test_a_query_of_only_stop_words_or_punctuation_finds_nothing(workspace):
    _entry(workspace, "The one and only thing that is there")

    for q in ["the", "and or not", "!!! ??? ...", '"the a"', "-", "don't"]:
        assert search(workspace, q).hits == [], q
        assert search(workspace, q).count == 0, q


def test_a_query_that_only_excludes_finds_nothing(workspace):
    _entry(workspace, "An entry without the word")

    assert _ids(workspace, "-redis") == []
    assert _ids(workspace, "entry or -redis") == _ids(workspace, "entry")


# --- ranking --------------------------------------------------------------------------------


def test_a_title_hit_outranks_a_body_only_hit(workspace):
    body = _entry(workspace, "Notes about throttling the importer", title="Importer notes")
    title = _entry(workspace, "Notes about the importer", title="Throttling")
    Entry.objects.filter(pk=body.pk).update(importance=1.0)
    Entry.objects.filter(pk=title.pk).update(importance=0.0)

    hits = search(workspace, "throttling").hits

    assert [h.id for h in hits] == [title.pk, body.pk]
    assert hits[0].rank > hits[1].rank > 0


def test_equal_text_rank_puts_higher_importance_first(workspace):
    low = _entry(workspace, "Rotate the signing keys yearly", title="Keys")
    high = _entry(workspace, "Rotate the signing keys yearly", title="Keys")
    middle = _entry(workspace, "Rotate the signing keys yearly", title="Keys")
    Entry.objects.filter(pk=low.pk).update(importance=0.1)
    Entry.objects.filter(pk=high.pk).update(importance=0.9)
    Entry.objects.filter(pk=middle.pk).update(importance=0.5)

    assert _ids(workspace, "signing keys") == [high.pk, middle.pk, low.pk]


def test_limit_caps_the_hits_and_count_tells_all_matches(workspace):
    for n in range(5):
        _entry(workspace, f"Batch note number {n} about retries")

    result = search(workspace, "retries", limit=2)

    assert result.count == 5
    assert len(result.hits) == 2


def _bulk(workspace: Workspace, texts: list[tuple[str, float]]) -> list[Entry]:
    """Entries with the given content and importance, then fresh planner statistics."""
    made = [_entry(workspace, text) for text, _ in texts]
    for entry, (_, importance) in zip(made, texts, strict=True):
        Entry.objects.filter(pk=entry.pk).update(importance=importance)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE memory_entry")
    return made


@pytest.fixture
def small_bounds(monkeypatch):
    """A broad query from 10 matches on, ranking its 4 most important ones."""
    monkeypatch.setattr(search_module, "BROAD_MIN", 10)
    monkeypatch.setattr(search_module, "RANK_CAP", 4)


def test_a_broad_query_ranks_only_its_most_important_matches(workspace, small_bounds):
    # 30 matches: above max(BROAD_MIN, isqrt(4 x 30)) = 10. The best text match is among the
    # least important; the four most important matches are the ones ranked.
    texts = [(f"Retry note {n} about the queue", 0.1 + n / 100) for n in range(29)]
    weak_but_best = ("Retry retry retry: the retry queue retry", 0.01)
    made = _bulk(workspace, [*texts, weak_but_best])
    most_important = {e.pk for e in made[25:29]}

    result = search(workspace, "retry", limit=10)

    assert result.ranked == 4
    assert {h.id for h in result.hits[:4]} == most_important
    # Past the ranked ones the page goes on with the further matches, by importance.
    assert [h.id for h in result.hits[4:]] == [e.pk for e in reversed(made[19:25])]
    assert made[-1].pk not in {h.id for h in result.hits}
    if connection.vendor == "postgresql":  # the planner's estimate, flagged as one
        assert result.count_exact is False
        assert 10 < result.count <= 60
    else:  # SQLite counts its matches
        assert (result.count, result.count_exact) == (30, True)


def test_a_narrow_query_ranks_every_match(workspace, small_bounds):
    made = _bulk(workspace, [(f"Retry note {n} about the queue", 0.5) for n in range(8)])
    best = _entry(workspace, "Retry retry retry: the retry queue retry")

    result = search(workspace, "retry", limit=3)

    assert (result.count, result.count_exact, result.ranked) == (9, True, 9)
    assert result.hits[0].id == best.pk
    assert len(made) == 8


def test_a_broad_estimate_that_finds_too_few_matches_ranks_them_all(workspace, small_bounds):
    # Each word alone matches half the entries, both together only two: PostgreSQL estimates
    # the AND from the words' frequencies (about 30), walks for candidates, finds fewer than
    # RANK_CAP and falls back to the exact ranking.
    texts = [(f"alpha note {n}", 0.5) for n in range(60)] + [(f"beta note {n}", 0.5) for n in range(60)]
    _bulk(workspace, [*texts, ("alpha beta one", 0.2), ("alpha beta two", 0.3)])

    with CaptureQueriesContext(connection) as queries:
        result = search(workspace, "alpha beta")

    assert (result.count, result.count_exact, result.ranked) == (2, True, 2)
    if connection.vendor == "postgresql":
        walks = [q for q in queries.captured_queries if "ORDER BY e.importance DESC, e.id DESC" in q["sql"]]
        assert len(walks) == 1  # tried the walk once, then ranked exactly


def _pages(workspace: Workspace, q: str, size: int, total: int) -> list[int]:
    ids: list[int] = []
    for offset in range(0, total, size):
        ids += [h.id for h in search(workspace, q, limit=size, offset=offset).hits]
    return ids


def test_pages_of_a_narrow_query_are_slices_of_one_ranking(workspace, small_bounds):
    _bulk(workspace, [("retry " * (1 + n % 4) + f"note {n}", n / 10) for n in range(9)])

    whole = search(workspace, "retry", limit=9)
    paged = _pages(workspace, "retry", size=2, total=9)

    assert paged == [h.id for h in whole.hits] and len(set(paged)) == 9
    page = search(workspace, "retry", limit=2, offset=8)
    assert (len(page.hits), page.count, page.ranked) == (1, 9, 9)


def test_pages_of_a_broad_query_are_slices_of_one_order(workspace, small_bounds):
    # 30 matches, 4 ranked: pages first give those four by text rank, then the other 26 by
    # importance; every match once, whatever the page size.
    made = _bulk(workspace, [("retry " * (1 + n % 3) + f"note {n}", 0.1 + n / 100) for n in range(30)])
    by_importance = [e.pk for e in reversed(made)]

    for size in (3, 4, 7):
        paged = _pages(workspace, "retry", size=size, total=30)
        assert sorted(paged[:4]) == sorted(by_importance[:4]), size
        assert paged[4:] == by_importance[4:], size
    last = search(workspace, "retry", limit=7, offset=28)  # the walk reached the end: exact
    assert (len(last.hits), last.count, last.count_exact, last.ranked) == (2, 30, True, 4)
    first = search(workspace, "retry", limit=4)
    assert [h.id for h in first.hits] == _pages(workspace, "retry", size=1, total=4)
    ranks = [h.rank for h in first.hits]
    assert ranks == sorted(ranks, reverse=True) and ranks[0] > ranks[-1]


def test_a_broad_querys_matches_past_the_ranked_ones_have_no_rank(workspace, small_bounds):
    _bulk(workspace, [(f"retry note {n}", 0.1 + n / 100) for n in range(30)])

    hits = search(workspace, "retry", limit=8).hits

    assert all(h.rank is not None for h in hits[:4]) and all(h.rank is None for h in hits[4:])
    body = _client(workspace).get("/api/v1/search", {"q": "retry", "limit": 8}).json()
    assert [item["rank"] is None for item in body["items"]] == [False] * 4 + [True] * 4


def _spread(workspace: Workspace, matching: Callable[[int], bool]) -> None:
    """300 entries by falling importance; those ``matching`` their position mention retry."""
    _bulk(
        workspace,
        [
            (("retry " * (1 + n % 5) if matching(n) else "other ") + f"note {n}", 1.0 - n / 1000)
            for n in range(300)
        ],
    )


@pytest.mark.parametrize(
    "matching",
    [
        lambda n: n < 8 or n >= 288,  # a few important matches, the rest far down the walk
        lambda n: 100 <= n < 120,  # every match far down: not broad after all
        lambda n: n % 15 == 0,  # spread evenly
    ],
    ids=["important-and-far", "all-far", "even"],
)
def test_pages_are_one_order_whatever_the_estimate_says(workspace, small_bounds, monkeypatch, matching):
    # PostgreSQL decides broad or exact once per query, not per page: with an estimate of 60
    # of 300 entries the walk is bounded to 4 x 4 x 300 / 60 = 80 entries for the decision.
    _spread(workspace, matching)
    monkeypatch.setattr(search_module, "_estimate", lambda cursor, params: 60)
    total = sum(1 for n in range(300) if matching(n))

    whole = [h.id for h in search(workspace, "retry", limit=100).hits]
    for size in (4, 7):
        cache.clear()  # each page size decides afresh: a deep page first, too
        pages = [
            h.id for o in range(0, total, size) for h in search(workspace, "retry", limit=size, offset=o).hits
        ]
        assert pages == whole, size
    assert len(whole) == total
    assert [h.id for h in search(workspace, "retry", limit=4).hits] == whole[:4]


@pytest.mark.parametrize("many", [False, True], ids=["narrow", "broad"])
def test_a_page_past_the_last_match_is_empty_and_still_counts(workspace, small_bounds, many):
    _bulk(workspace, [(f"retry note {n}", n / 100) for n in range(30 if many else 5)])

    page = search(workspace, "retry", limit=5, offset=40)

    assert page.hits == []
    assert page.count == (30 if many else 5) and page.count_exact
    assert page.ranked == (4 if many else 5)
    body = _client(workspace).get("/api/v1/search", {"q": "retry", "offset": 40}).json()
    assert body["items"] == [] and body["count"] == page.count


def test_the_endpoint_says_when_the_count_is_an_estimate(workspace, small_bounds):
    _bulk(workspace, [(f"Retry note {n} about the queue", 0.1 + n / 100) for n in range(30)])

    body = _client(workspace).get("/api/v1/search", {"q": "retry", "limit": 2}).json()

    assert body["ranked"] == 4 and (body["limit"], body["offset"]) == (2, 0)
    assert len(body["items"]) == 2
    assert body["count_exact"] is (connection.vendor != "postgresql")


# --- what is visible ------------------------------------------------------------------------


def test_archived_entries_are_hidden_unless_asked_for(workspace):
    entry = _entry(workspace, "An old decision about logging")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status=Status.ARCHIVED, reason="manual"
    )

    assert _ids(workspace, "logging") == []
    hits = search(workspace, "logging", include_archived=True).hits
    assert [h.id for h in hits] == [entry.pk]
    assert hits[0].status == Status.ARCHIVED


def test_stale_entries_are_found(workspace):
    entry = _entry(workspace, "A stale note about webhooks")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status=Status.STALE, reason="manual"
    )

    assert _ids(workspace, "webhooks") == [entry.pk]


def test_staged_and_tombstoned_entries_are_never_found(workspace):
    _entry(workspace, "A staged trace about pagination", staged_class="evidence")
    gone = _entry(workspace, "A deleted note about pagination")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)

    assert _ids(workspace, "pagination") == []
    assert _ids(workspace, "pagination", include_archived=True) == []


def test_old_versions_are_never_found(workspace):
    first = _entry(workspace, "Timeouts are thirty seconds")
    result = entry_changes.entry_update(
        workspace=workspace, entry_id=first.pk, content="Timeouts are ninety seconds"
    )

    assert _ids(workspace, "thirty") == []
    assert _ids(workspace, "ninety") == [result.entry.pk]
    assert _ids(workspace, "timeouts") == [result.entry.pk]


def test_another_workspaces_entries_are_never_found(workspace, other_workspace):
    ours = _entry(workspace, "Our secret about billing")
    _entry(other_workspace, "Their secret about billing")

    assert _ids(workspace, "billing") == [ours.pk]


# --- the hit --------------------------------------------------------------------------------


def test_the_hit_carries_a_snippet_with_the_matched_words_marked(workspace):
    words = " ".join(f"filler{n}" for n in range(60))
    entry = _entry(workspace, f"{words} the scheduler <b>drifts</b> after midnight {words}", title="Cron")

    (hit,) = search(workspace, "scheduler drifting").hits

    assert hit.id == entry.pk
    assert hit.title == "Cron"
    assert f"{MARK_START}scheduler{MARK_END}" in hit.snippet
    assert f"{MARK_START}drifts{MARK_END}" in hit.snippet
    assert "<b>" in hit.snippet  # plain text: markup in the content is kept, never interpreted
    assert len(hit.snippet.split()) < 40
    assert "\n" not in hit.snippet
    assert hit.status == Status.ACTIVE
    assert hit.entry_type == entry.entry_type
    assert hit.created_at == entry.created_at
    assert hit.importance == pytest.approx(entry.importance)


# --- the index follows every write path -----------------------------------------------------


def test_the_index_follows_set_based_updates(workspace):
    entry = _entry(workspace, "Original wording")
    Entry.objects.filter(pk=entry.pk).update(content="Rewritten by a sweep", title="Sweeper")

    assert _ids(workspace, "original") == []
    assert _ids(workspace, "rewritten") == [entry.pk]
    assert _ids(workspace, "sweeper") == [entry.pk]


def test_the_index_follows_raw_inserts_of_an_import(workspace):
    counts = import_journal(workspace=workspace, path=SAMPLE_PATH)
    assert counts.created == 300

    result = search(workspace, "setuptools")

    assert result.count == 3
    assert all("setuptools" in Entry.objects.get(pk=h.id).content.lower() for h in result.hits)


def test_the_index_forgets_deleted_rows(workspace):
    entry = _entry(workspace, "Purged lineages vanish")
    Entry.objects.filter(pk=entry.pk).delete()

    assert _ids(workspace, "lineages") == []
    # A new row that takes the freed id (SQLite reuses it) is found by its own words only.
    _entry(workspace, "Something else entirely")
    assert _ids(workspace, "lineages") == []


# --- input that must never raise ------------------------------------------------------------

NASTY = [
    '"',
    '"""',
    'unbalanced "quote',
    "unbalanced quote\"'",
    "(cache",
    "cache)",
    "(a OR b) AND NOT c",
    "cache*",
    "*",
    "title:cache",
    "content : cache",
    "^cache",
    "NEAR(cache redis, 2)",
    "cache NEAR redis",
    "AND",
    "OR",
    "NOT",
    "cache AND",
    "OR cache OR",
    "- -- ---",
    "-(cache)",
    "cache -",
    "\\",
    '\\"',
    "'; DROP TABLE memory_entry; --",
    "%s %(q)s ?",
    "{}[]<>|&!~@#$%^&*()+=",
    "caché ÜBER naïve",
    "数据库 缓存",
    "emoji 🎉 cache",
    "nul\x00byte cache",
    "lone \ud800 surrogate",
    "config/settings.py",
    "3.5 v2.0 foo-bar snake_case",
]


@pytest.mark.parametrize("q", NASTY)
def test_fts_syntax_characters_in_the_query_never_raise(workspace, q):
    _entry(workspace, "A cache in front of redis (see config/settings.py)")

    result = search(workspace, q, include_archived=True)

    assert result.count >= len(result.hits) >= 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=st.text(min_size=1, max_size=80).filter(lambda s: s.strip()))
def test_any_text_as_a_query_never_raises(workspace, q):
    search(workspace, q)


def test_an_empty_or_too_long_query_or_a_bad_limit_is_invalid(workspace):
    for q in ["", "   ", "\n\t"]:
        with pytest.raises(InvalidInput):
            search(workspace, q)
    with pytest.raises(InvalidInput):
        search(workspace, "x" * 501)
    search(workspace, "x" * 500)
    for limit in [0, 501, -1, True]:
        with pytest.raises(InvalidInput):
            search(workspace, "x", limit=limit)
    for offset in [-1, 10**9 + 1, 1.5, False]:
        with pytest.raises(InvalidInput):
            search(workspace, "x", offset=offset)
    search(workspace, "x", limit=500, offset=10**9)


def test_every_term_reaches_the_database_quoted():
    parsed = parse_query('alpha -bravo* "charlie (delta" or NEAR:echo the')

    assert parsed.fts5() == '(("alpha" AND "charlie delta") NOT "bravo") OR (("near echo"))'
    assert parsed.websearch() == '"alpha" -"bravo*" "charlie (delta" or "NEAR:echo"'


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite triggers")
def test_ensure_sqlite_index_restores_triggers_a_table_rebuild_dropped(workspace):
    entry = _entry(workspace, "Before the rebuild")
    assert ensure_sqlite_index() is False
    with connection.cursor() as cursor:
        for name in ("memory_entry_fts_ai", "memory_entry_fts_au"):
            cursor.execute(f"DROP TRIGGER {name}")
    Entry.objects.filter(pk=entry.pk).update(content="After the rebuild")  # missed by the index

    assert ensure_sqlite_index() is True

    assert _ids(workspace, "after rebuild") == [entry.pk]
    assert _ids(workspace, "before") == []
    assert ensure_sqlite_index() is False


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's covering index")
def test_a_broad_query_reads_its_matches_from_the_covering_index_a_rebuild_gets_back(workspace, small_bounds):
    ids = [_entry(workspace, f"cover note {i}").pk for i in range(12)]
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX entry_search_cover")  # as a table rebuild would
    assert ensure_sqlite_index() is True
    assert ensure_sqlite_index() is False
    with CaptureQueriesContext(connection) as queries:
        assert sorted(_ids(workspace, "cover note")) == sorted(ids)
    (statement,) = [q["sql"] for q in queries.captured_queries if "memory_entry_fts" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + statement)
        plan = " | ".join(row[3] for row in cursor.fetchall())
    assert "USING COVERING INDEX entry_search_cover" in plan, plan


# --- the API --------------------------------------------------------------------------------


def _client(workspace: Workspace) -> Client:
    _, raw = accounts.api_key_create(workspace=workspace, name="bot", role="agent")
    return Client(headers={"Authorization": f"Bearer {raw}"})


def test_the_endpoint_returns_count_and_ranked_items(workspace):
    title = _entry(workspace, "How we shard the queue", title="Sharding")
    body = _entry(workspace, "Sharding notes for the queue")

    response = _client(workspace).get("/api/v1/search", {"q": "sharding", "limit": 5})

    assert response.status_code == 200, response.content
    data = response.json()
    assert data["count"] == 2
    assert [item["id"] for item in data["items"]] == [title.pk, body.pk]
    assert set(data["items"][0]) == {
        "id",
        "title",
        "snippet",
        "rank",
        "importance",
        "status",
        "entry_type",
        "created_at",
    }


def test_the_endpoint_shows_archived_entries_only_when_asked(workspace):
    entry = _entry(workspace, "An archived runbook")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status=Status.ARCHIVED, reason="manual"
    )
    client = _client(workspace)

    assert client.get("/api/v1/search", {"q": "runbook"}).json()["count"] == 0
    shown = client.get("/api/v1/search", {"q": "runbook", "include_archived": "true"}).json()
    assert [item["id"] for item in shown["items"]] == [entry.pk]


def test_an_empty_query_is_422_not_500(workspace):
    client = _client(workspace)

    for params in [
        {"q": ""},
        {"q": "   "},
        {},
        {"q": "x" * 501},
        {"q": "x", "limit": 0},
        {"q": "x", "limit": 501},
        {"q": "x", "offset": -1},
        {"q": "x", "offset": "two"},
    ]:
        response = client.get("/api/v1/search", params)
        assert response.status_code == 422, (params, response.content)
        assert "detail" in response.json()


def test_fts_syntax_through_the_endpoint_is_never_a_500(workspace):
    _entry(workspace, "A cache in front of redis")
    client = _client(workspace)

    for q in ['"unbalanced', "NEAR(a b)", "a AND OR NOT b", "*:^", "-"]:
        assert client.get("/api/v1/search", {"q": q}).status_code == 200, q


def test_another_workspaces_key_does_not_see_the_entries(workspace, other_workspace):
    _entry(workspace, "Our private runbook")

    response = _client(other_workspace).get("/api/v1/search", {"q": "runbook"})

    assert response.status_code == 200
    assert response.json() == {
        "count": 0,
        "count_exact": True,
        "ranked": 0,
        "limit": 20,
        "offset": 0,
        "items": [],
    }


def test_an_unauthenticated_request_is_401(workspace):
    _entry(workspace, "Our private runbook")

    response = Client().get("/api/v1/search", {"q": "runbook"})

    assert response.status_code == 401


def test_an_entry_of_the_largest_content_of_distinct_words_is_written_and_found(workspace):
    # Its tsvector is far larger than a btree index row may be (2,704 bytes on PostgreSQL):
    # no index on memory_entry may carry it.
    from memory.models.choices import CONTENT_MAX

    words, text = [], ""
    n = 0
    while True:
        word = f"w{n:06d}x"
        if len(text) + len(word) + 1 > CONTENT_MAX:
            break
        text += word + " "
        words.append(word)
        n += 1
    entry = _entry(workspace, text.strip(), title="Glossary")

    assert _ids(workspace, words[-1]) == [entry.pk]
    assert _ids(workspace, "glossary") == [entry.pk]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner estimate")
def test_the_planner_estimate_is_asked_once_per_workspace_statuses_and_query(workspace, other_workspace):
    _entry(workspace, "A note about the retry queue")

    def explains(*calls):
        with CaptureQueriesContext(connection) as queries:
            for ws, q, archived in calls:
                search(ws, q, include_archived=archived)
        return sum(1 for x in queries.captured_queries if x["sql"].startswith("EXPLAIN"))

    assert explains((workspace, "retry", False)) == 1
    assert explains((workspace, "retry", False), (workspace, "retry", False)) == 0
    assert (
        explains((workspace, "queue", False), (workspace, "retry", True), (other_workspace, "retry", False))
        == 3
    )
    # What the search finds does not come from the cache: a new match shows at once.
    newer = _entry(workspace, "Another retry note")
    assert newer.pk in _ids(workspace, "retry")
