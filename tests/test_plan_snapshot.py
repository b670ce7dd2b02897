"""On SQLite a run's plan works on a private copy of the database (maintenance.plan_snapshot):
the copy is the database as it stands, the plan's writes never reach the database, the default
connection comes back, and the temporary file goes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from django.db import connection, transaction

from maintenance import plan_snapshot
from memory import accounts, new_entries
from memory.models import Entry
from tests.helpers_runs import read_aside


def _copies() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("plan-*.sqlite3*"))


@pytest.mark.django_db(transaction=True)
def test_a_plan_on_sqlite_writes_into_a_copy_that_goes_away():
    if connection.vendor != "sqlite":
        assert not plan_snapshot.possible()
        pytest.skip("SQLite's plan only: PostgreSQL's plan writes no locked row")
    ws = accounts.workspace_create(slug="copy", name="Copy", review_mode="apply")
    entry = new_entries.entry_create(workspace=ws, title="kept", content="the original text of this entry")
    before = _copies()
    connection.ensure_connection()
    source = connection.connection
    with plan_snapshot.snapshot() as copied:
        assert copied and plan_snapshot.active() and connection.connection is not source
        assert len(_copies() - before) == 1
        assert Entry.objects.get(pk=entry.pk).title == "kept"  # the copy holds the database's rows
        Entry.objects.filter(pk=entry.pk).update(title="written into the copy")
        assert Entry.objects.get(pk=entry.pk).title == "written into the copy"
        # Another connection sees the database itself, unchanged, and may write it meanwhile.
        assert read_aside("SELECT title FROM memory_entry WHERE id = %s", [entry.pk]) == "kept"
    assert connection.connection is source and not plan_snapshot.active()
    assert _copies() == before
    assert Entry.objects.get(pk=entry.pk).title == "kept"


@pytest.mark.django_db(transaction=True)
def test_no_copy_inside_a_callers_transaction():
    """Its uncommitted rows would be missing from a copy: the plan stays in the transaction."""
    with transaction.atomic():
        assert not plan_snapshot.possible()
        with plan_snapshot.snapshot() as copied:
            assert not copied and not plan_snapshot.active()


@pytest.mark.django_db(transaction=True)
def test_the_setting_turns_the_copy_off(settings):
    settings.PLAN_SNAPSHOT = False
    assert not plan_snapshot.possible()


def _mixed_workspace(now):
    """Entries every kind of pass picks: stale, archived, cold, expiring, staged, a fragment,
    duplicates, a tombstone past grace."""
    from datetime import timedelta

    ws = accounts.workspace_create(slug="mixed", name="Mixed", review_mode="apply")
    when = [now - timedelta(days=d) for d in (1, 40, 100, 200, 400)]
    for i, created in enumerate(when * 4):
        entry = new_entries.entry_create(
            workspace=ws,
            content=f"note {i} about the cache layer and its retries, written while on call"
            if i % 3
            else "tiny...",
            created_at=created,
            now=created,
        )
        if i % 5 == 0:
            Entry.objects.filter(pk=entry.pk).update(expires_at=now - timedelta(hours=1))
    return ws


@pytest.mark.django_db(transaction=True)
def test_a_dry_run_on_the_copy_decides_what_one_in_the_database_does(settings, tmp_path, now):
    """The same counts and the same ids, with the copy and without it."""
    from maintenance.run_start import run_maintenance

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's plan only")
    settings.BACKUP_DIR = tmp_path / "backups"
    ws = _mixed_workspace(now)
    outcomes = []
    for on in (True, False):
        settings.PLAN_SNAPSHOT = on
        result = run_maintenance(workspace=ws, now=now, dry_run=True, force=True)
        outcomes.append((result["status"], result["counts"], result.get("affected")))
    assert outcomes[0][2], outcomes[0]  # the ids decided
    assert outcomes[0] == outcomes[1]
    counts = outcomes[0][1]
    assert counts["stale_marked"] and counts["expired"] and counts["scored"] == 20, counts


@pytest.mark.django_db(transaction=True)
def test_without_room_for_a_copy_the_plan_runs_in_the_database(monkeypatch, settings, tmp_path, now, caplog):
    from maintenance.run_start import run_maintenance

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's plan only")
    settings.BACKUP_DIR = tmp_path / "backups"
    settings.PLAN_SNAPSHOT_DIR = str(tmp_path / "no such folder")
    ws = _mixed_workspace(now)
    copied = run_maintenance(workspace=ws, now=now, dry_run=True, force=True)
    assert copied["status"] == "succeeded" and copied["counts"]["expired"]
    assert "no copy of the database for the plan" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_copy_left_by_a_killed_plan_goes_once_a_day_old(settings, tmp_path):
    import os
    import time

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's plan only")
    settings.PLAN_SNAPSHOT_DIR = str(tmp_path)
    old, recent = tmp_path / "plan-old.sqlite3", tmp_path / "plan-recent.sqlite3"
    old.write_bytes(b"x")
    recent.write_bytes(b"x")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    with plan_snapshot.snapshot() as copied:
        assert copied and len(list(tmp_path.glob("plan-*.sqlite3"))) == 2  # recent + this one
    assert sorted(p.name for p in tmp_path.glob("plan-*")) == ["plan-recent.sqlite3"]
