"""The entry lists read an index in their sort's order, on both databases (issue 16, item 7).

Each test asks the database for the plan of the SQL the API runs (``EXPLAIN QUERY PLAN`` on
SQLite, ``EXPLAIN`` on PostgreSQL, through ``QuerySet.explain``) and asserts that it reads the
expected index and never sorts the rows it found: SQLite's ``USE TEMP B-TREE FOR ORDER BY``
(a sort of only the ties of an index's order, ``FOR RIGHT PART OF ORDER BY``, is allowed),
PostgreSQL's ``Sort`` (an ``Incremental Sort`` of the ties is allowed) or ``Seq Scan``. The
counts are unsorted; on SQLite they read ``entry_by_importance``. No index names the status
(a status change then rewrites no index entry: ``test_no_index_names_the_status``). With
a handful of rows PostgreSQL's planner would rightly scan the table, so its tests run with
``enable_seqscan = off`` (for this transaction only): the question is whether the index can
serve the query, which it could not on SQLite while the list's bound parameters hid the
partial index's condition. No timings are asserted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from memory import selectors
from memory.models import Entry
from memory.models.choices import Status
from memory.search import _visible


@pytest.fixture
def entries(workspace, other_workspace) -> None:
    """A few thousand latest entries per workspace, in every status the partial indexes tell
    apart, and the planner's statistics of them (as datagen and autovacuum leave them)."""
    statuses = [Status.ACTIVE] * 6 + [Status.STALE, Status.ARCHIVED, Status.STAGED, Status.TOMBSTONED]
    for ws in (workspace, other_workspace):
        Entry.objects.bulk_create(
            Entry(
                workspace=ws,
                content=f"plan entry {i} about caching",
                content_hash=f"{ws.pk}-{i}",
                status=statuses[i % len(statuses)],
                importance=(i * 7919 % 1000) / 1000,
            )
            for i in range(3000)
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memory_entry" if connection.vendor == "postgresql" else "ANALYZE")


@pytest.fixture(autouse=True)
def _no_seq_scan(db) -> Iterator[None]:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
    yield


def plan(queryset: Any) -> str:
    return str(queryset.explain())


def assert_reads_index_in_order(text: str, index: str) -> None:
    assert index in text, text
    if connection.vendor == "sqlite":
        assert "USE TEMP B-TREE FOR ORDER BY" not in text, text
    else:
        assert not re.search(r"(^|->)\s*Sort\s+\(cost", text, re.MULTILINE), text
        assert "Seq Scan" not in text, text


@pytest.mark.parametrize(
    ("filters", "statuses"),
    [
        ({}, [Status.ACTIVE, Status.STALE]),
        ({"include_archived": True}, [Status.ACTIVE, Status.STALE, Status.ARCHIVED]),
        ({"include_staged": True}, [Status.ACTIVE, Status.STALE, Status.STAGED]),
        ({"status": Status.STALE}, [Status.STALE]),
        ({"entry_type": "observation"}, [Status.ACTIVE, Status.STALE]),
    ],
)
def test_the_default_list_reads_entry_by_importance_in_order(workspace, entries, filters, statuses):
    listed = selectors.entry_list(workspace, **filters)  # sort=importance, the default
    text = plan(listed[:20])
    if connection.vendor == "postgresql" and "status" in filters:
        # One status matches few rows (189 of 2,100 here): PostgreSQL may read them through
        # another index of the workspace and sort them, which its costs say is cheaper than
        # walking the importance index; an index either way, never a table scan.
        assert "Index" in text and "Seq Scan" not in text, text
    else:
        assert_reads_index_in_order(text, "entry_by_importance")
    # The same rows, in the same order, as the filter without the repeated condition.
    plain = Entry.objects.filter(workspace=workspace, is_latest=True, status__in=statuses)
    for key, value in filters.items():
        if key not in ("include_archived", "include_staged"):
            plain = plain.filter(**{key: value})
    expected = list(plain.order_by("-importance", "-id").values_list("pk", flat=True))
    assert expected
    assert list(listed.values_list("pk", flat=True)) == expected


def test_the_recent_list_reads_entry_latest_recent(workspace, entries):
    listed = selectors.entry_list(workspace, sort="recent")
    assert_reads_index_in_order(plan(listed[:20]), "entry_latest_recent")


@pytest.mark.parametrize("filters", [{}, {"include_archived": True}, {"include_staged": True}])
def test_the_list_count_reads_a_partial_index(workspace, entries, filters):
    index = "entry_by_importance"
    counted = selectors.entry_list_counted(workspace, **filters)
    text = plan(counted.order_by()[: selectors.COUNT_EXACT_UP_TO + 1])
    # PostgreSQL picks among its indexes by its statistics (here the workspace's); it needs
    # no repeated condition to use a partial one. An unsorted count sorts nothing on either.
    assert index in text if connection.vendor == "sqlite" else "Seq Scan" not in text, text
    assert "TEMP B-TREE" not in text and "Sort" not in text, text
    listed = selectors.entry_list(workspace, **filters)
    assert counted.count() == len(list(listed)) == selectors.bounded_count(counted)


def test_the_search_counts_visible_entries_on_a_partial_index(workspace, entries):
    statuses = [Status.ACTIVE.value, Status.STALE.value]
    rows = Entry.objects.filter(workspace=workspace, is_latest=True, status__in=statuses)
    text = plan(rows.on_index("entry_by_importance").order_by()[: selectors.COUNT_EXACT_UP_TO + 1])
    assert "entry_by_importance" in text if connection.vendor == "sqlite" else "Seq Scan" not in text, text
    assert _visible(workspace.pk, statuses) == rows.count() == 2100


def test_the_condition_is_written_as_literals(workspace):
    sql, params = (
        Entry.objects.filter(workspace=workspace).on_index("entry_constitutional").query.sql_with_params()
    )
    assert "'constitutional'" in sql
    assert "constitutional" not in params


def test_no_index_names_the_status():
    """A status change rewrites no index entry: no index of the entry table names ``status``
    or ``status_changed_at``, as a key or in its condition (on PostgreSQL, read back from the
    database, where the table also keeps room on its pages for the new version)."""
    for index in Entry._meta.indexes:
        assert not {"status", "status_changed_at"} & set(index.fields), index.name
        assert "status" not in str(index.condition), index.name
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT indexname FROM pg_indexes"
                " WHERE tablename = 'memory_entry' AND indexdef LIKE '%%status%%'"
            )
            assert cursor.fetchall() == []
            cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'memory_entry'")
            assert cursor.fetchone()[0] == ["fillfactor=70"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="HOT updates are PostgreSQL's")
def test_a_status_change_is_a_hot_update(workspace, entries):
    """PostgreSQL writes the new version of a row whose indexed columns did not change beside
    the old one, in no index (a heap-only tuple), when its page has room: the table's
    fillfactor keeps 30 % of each page for them. Here one row in ten changes twice (as a run's
    passes, spread over the table, change a row and then again)."""
    from memory import lifecycle

    ids = list(Entry.objects.filter(workspace=workspace).order_by("pk").values_list("pk", flat=True))[::10]
    assert set(Entry.objects.filter(pk__in=ids).values_list("status", flat=True)) == {Status.ACTIVE}

    def hot() -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'memory_entry'"
            )
            return cursor.fetchone()

    updated, hot_updated = hot()
    now = timezone.now()
    lifecycle.change_status(
        workspace.pk, ids, Status.STALE, reason="decay", actor="test", now=now, automatic=True
    )
    lifecycle.change_status(
        workspace.pk, ids, Status.ARCHIVED, reason="decay", actor="test", now=now, automatic=True
    )
    after, hot_after = hot()
    assert after - updated == 2 * len(ids) == 600
    assert hot_after - hot_updated == 600


def test_an_unknown_or_full_index_is_refused():
    with pytest.raises(ValueError, match="no partial index"):
        Entry.objects.on_index("entry_lineage")
    with pytest.raises(ValueError, match="no partial index"):
        Entry.objects.on_index("no_such_index")


def test_the_successors_of_an_entry_are_found_by_the_partial_supersedes_index(workspace, entries):
    """``supersedes`` is indexed only where it is set (first versions, most rows, have no index
    entry to write on every status change); a lookup of an entry's successors, and the
    SET NULL of a deletion, still read that index."""
    first = Entry.objects.filter(workspace=workspace).order_by("pk").first()
    assert first is not None

    assert "entry_supersedes" in plan(Entry.objects.filter(supersedes=first))
    assert "entry_supersedes" in plan(Entry.objects.filter(supersedes__in=[first.pk, first.pk + 1]))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'entry_supersedes'"
            " AND indexdef LIKE '%%supersedes_id IS NOT NULL%%'"
            if connection.vendor == "postgresql"
            else "SELECT count(*) FROM sqlite_master WHERE name = 'entry_supersedes'"
            " AND sql LIKE '%%IS NOT NULL%%'"
        )
        assert cursor.fetchone()[0] == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a partial index SQLite uses only for literals")
def test_the_count_of_automatic_changes_reads_only_the_open_automatic_events(workspace, entries):
    """The review tab's count (on every console page) reads the partial index of automatic
    archivals and tombstones not yet reverted, not every event of the workspace."""
    from console.selectors_maintenance import automatic_changes
    from memory import capped
    from memory.models import LifecycleEvent

    Entry.objects.filter(workspace=workspace).update(lineage_id=F("id"))  # first versions
    rows = list(Entry.objects.filter(workspace=workspace, status=Status.TOMBSTONED)[:50])
    LifecycleEvent.objects.bulk_create(
        [
            LifecycleEvent(
                workspace=workspace,
                entry=e,
                entry_ref=e.pk,
                from_status=Status.ACTIVE,
                to_status=Status.TOMBSTONED,
                reason="decay",
                automatic=True,
            )
            for e in rows
        ]
        + [
            LifecycleEvent(
                workspace=workspace,
                entry=e,
                entry_ref=e.pk,
                to_status=Status.ACTIVE,
                reason="create",
                created_at=e.created_at - timedelta(days=1),
            )
            for e in Entry.objects.filter(workspace=workspace)[:2000]
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memory_lifecycleevent")
    events = automatic_changes(workspace)
    sql, params = capped._limited(events, capped.CAP)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN SELECT " + sql, params)
        text = "\n".join(row[0] for row in cursor.fetchall())

    assert "event_automatic_open" in text, text
    assert capped.capped_count(events) == 50
