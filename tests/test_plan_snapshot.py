"""On SQLite a run's plan works on a private copy of the database (maintenance.plan_snapshot):
the copy is the database as it stands, the plan's writes never reach the database, the default
connection comes back, and the temporary file goes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from django.db import connection, transaction

from maintenance import plan_snapshot
from memory import services
from memory.models import Entry
from tests.helpers_runs import read_aside


def _copies() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("plan-*.sqlite3*"))


@pytest.mark.django_db(transaction=True)
def test_a_plan_on_sqlite_writes_into_a_copy_that_goes_away():
    if connection.vendor != "sqlite":
        assert not plan_snapshot.possible()
        pytest.skip("SQLite's plan only: PostgreSQL's plan writes no locked row")
    ws = services.workspace_create(slug="copy", name="Copy", review_mode="apply")
    entry = services.entry_create(workspace=ws, title="kept", content="the original text of this entry")
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
