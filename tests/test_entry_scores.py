"""Where scores are stored: importance on the entry row, written only where it changed;
retention and ``scored_at`` in the entry's narrow ``EntryScore`` row."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection

from maintenance import backups, restore
from memory import new_entries, selectors
from memory.models import Entry, EntryScore
from memory.models.entries import RETENTION_UNSCORED
from memory.scoring import DecayParams
from memory.scoring_db import refresh_scores, rescore
from tests.test_backups import backup_path, dump, populate, read_lines, wipe, with_fresh_checksum, write_lines


@contextmanager
def rewritten_entry_rows() -> Iterator[set[int]]:
    """The ids of ``memory_entry`` rows written while the block runs: on PostgreSQL a row's
    ``xmin`` changes with every new version; on SQLite a temporary trigger notes each UPDATE."""
    seen: set[int] = set()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT id, xmin::text FROM memory_entry")
            before = dict(cursor.fetchall())
        else:
            cursor.execute("CREATE TEMP TABLE rewritten (id integer)")
            cursor.execute(
                "CREATE TEMP TRIGGER note_rewrite AFTER UPDATE ON main.memory_entry"
                " BEGIN INSERT INTO rewritten VALUES (new.id); END"
            )
    try:
        yield seen
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT id, xmin::text FROM memory_entry")
                seen.update(pk for pk, xmin in cursor.fetchall() if before.get(pk) != xmin)
            else:
                cursor.execute("SELECT id FROM rewritten")
                seen.update(pk for (pk,) in cursor.fetchall())
                cursor.execute("DROP TRIGGER note_rewrite")
                cursor.execute("DROP TABLE rewritten")


def test_a_refresh_rewrites_an_entry_row_only_where_its_importance_changed(workspace, now):
    # Importance has an age term for 90 days: the young entry's moves within an hour, the old
    # one's does not. Both retentions decay.
    old = new_entries.entry_create(
        workspace=workspace, content="old", created_at=now - timedelta(days=200), now=now
    )
    young = new_entries.entry_create(
        workspace=workspace, content="young", created_at=now - timedelta(days=5), now=now
    )
    refresh_scores(workspace, now=now)
    before = {e.pk: (e.importance, e.retention) for e in Entry.objects.select_related("score")}
    later = now + timedelta(hours=1)

    with rewritten_entry_rows() as rewritten:
        assert refresh_scores(workspace, now=later) == 2

    assert rewritten == {young.pk}
    after = {e.pk: e for e in Entry.objects.select_related("score")}
    assert after[old.pk].importance == before[old.pk][0]
    assert after[young.pk].importance < before[young.pk][0]
    for pk in (old.pk, young.pk):
        assert after[pk].retention < before[pk][1]
        assert after[pk].scored_at == later
    assert EntryScore.objects.count() == 2


def test_a_write_rescoring_few_entries_keeps_the_same_rule(workspace, now):
    """A write rescores itself and its neighbours in Python (up to FEW_IDS ids): stored the
    same way, the entry rows only where importance changed."""
    old = new_entries.entry_create(
        workspace=workspace, content="old", created_at=now - timedelta(days=200), now=now
    )
    young = new_entries.entry_create(
        workspace=workspace, content="young", created_at=now - timedelta(days=5), now=now
    )
    later = now + timedelta(hours=1)

    with rewritten_entry_rows() as rewritten:
        assert rescore(workspace, [old.pk, young.pk], now=later, params=DecayParams()) == 2

    assert rewritten == {young.pk}
    for entry in (old, young):
        stored = Entry.objects.select_related("score").get(pk=entry.pk)
        assert stored.scored_at == later
        assert stored.retention < entry.retention


@pytest.mark.django_db(transaction=True)
def test_a_new_entry_is_written_with_its_scores_row(workspace, now):
    # On PostgreSQL the common write is one statement (a CTE per table); with a new tag it
    # goes through the ORM: both routes write the row.
    plain = new_entries.entry_create(workspace=workspace, content="plain", now=now)
    tagged = new_entries.entry_create(workspace=workspace, content="tagged", tags=["new-tag"], now=now)

    for entry in (plain, tagged):
        score = EntryScore.objects.get(entry_id=entry.pk)
        assert score.retention == pytest.approx(1.0)
        assert score.scored_at == now
        assert entry.retention == score.retention


def test_an_entry_never_scored_reads_and_sorts_as_unscored(workspace, now):
    scored = new_entries.entry_create(
        workspace=workspace, content="scored", created_at=now - timedelta(days=60)
    )
    refresh_scores(workspace, now=now)
    bare = Entry.objects.create(workspace=workspace, content="loaded in bulk", content_hash="h")
    Entry.objects.filter(pk=bare.pk).update(lineage_id=bare.pk)

    assert not EntryScore.objects.filter(entry_id=bare.pk).exists()
    loaded = Entry.objects.get(pk=bare.pk)
    assert (loaded.retention, loaded.scored_at) == (RETENTION_UNSCORED, None)
    assert Entry.objects.get(pk=scored.pk).retention < RETENTION_UNSCORED
    assert [e.pk for e in selectors.entry_list(workspace, sort="retention")] == [bare.pk, scored.pk]


def test_a_backup_carries_no_scores_row_and_a_restore_brings_entries_back_unscored(workspace, now):
    populate(workspace, now)
    refresh_scores(workspace, now=now)
    before = dump(workspace)
    path = backup_path(backups.write_backup(workspace, now=now))
    entry_rows = [json.loads(line)["row"] for line in read_lines(path) if json.loads(line)["kind"] == "entry"]
    assert entry_rows and all("retention" not in row and "scored_at" not in row for row in entry_rows)
    wipe(workspace)

    restore.restore_backup(path)

    assert dump(workspace) == before
    restored = Entry.objects.filter(workspace=workspace).select_related("score")
    assert {e.retention for e in restored} == {RETENTION_UNSCORED}  # until the next run scores them
    assert refresh_scores(workspace, now=now) == EntryScore.objects.count() > 0


def test_a_backup_written_before_scores_moved_still_restores(workspace, now):
    """Files of earlier versions carry retention and scored_at in each entry's row: read and
    left aside (the next run computes them from the restored inputs)."""
    populate(workspace, now)
    before = dump(workspace)
    path = backup_path(backups.write_backup(workspace, now=now))
    lines = []
    for line in read_lines(path)[:-1]:
        obj = json.loads(line)
        if obj["kind"] == "entry":
            obj["row"].update(retention=0.5, scored_at=now.isoformat())
            line = (json.dumps(obj) + "\n").encode()
        lines.append(line)
    write_lines(path, with_fresh_checksum([*lines, read_lines(path)[-1]]))
    wipe(workspace)

    restore.restore_backup(path)

    assert dump(workspace) == before
