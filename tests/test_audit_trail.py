"""The audit trail's references are kept by the code that deletes, not re-checked by the
database per row: ``LifecycleEvent`` has no database constraint on its workspace, entry and
run, nor ``Tombstone`` (a first run over a large workspace writes an event for most of its
entries and a Tombstone for a quarter of them; the checks cost about what writing them did). So every
door that deletes one of those rows must remove or unlink what names it, and a purge must not
leave an event naming an entry it deleted — whatever ran beside it."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import close_old_connections, connection, transaction

from maintenance.models import MaintenanceRun
from maintenance.passes import purge_lineages
from memory import lifecycle, new_entries
from memory.models import Entry, LifecycleEvent, Tombstone, Workspace
from memory.models.choices import Status


def _entry(workspace: Workspace, now, text: str) -> Entry:
    return new_entries.entry_create(workspace=workspace, content=text, created_at=now, now=now)


def _tombstone(workspace: Workspace, entry: Entry, now, run: MaintenanceRun | None = None) -> Tombstone:
    lifecycle.change_status(
        workspace.pk,
        [entry.pk],
        Status.TOMBSTONED,
        reason="test",
        actor="test",
        now=now,
        automatic=run is not None,
        run_id=run.pk if run else None,
        tombstone=lifecycle.Tombstoning("manual", now),
    )
    return Tombstone.objects.get(entry_id=entry.pk, restored_at__isnull=True)


def _purge(workspace: Workspace, tombstone: Tombstone, now) -> None:
    with transaction.atomic():
        rows = Tombstone.objects.select_for_update().filter(pk=tombstone.pk)
        purge_lineages(workspace, list(rows.values("pk", "entry_ref", "lineage_ref")), now)


@pytest.mark.django_db
def test_a_purge_unlinks_every_event_and_tombstone_of_the_entries_it_deletes(workspace, now):
    entry = _entry(workspace, now, "a note about the retry budget of the sync job")
    kept = _entry(workspace, now, "a note about the cache keys of the search page")
    for status in (Status.STALE, Status.ACTIVE):
        lifecycle.change_status(
            workspace.pk, [entry.pk, kept.pk], status, reason="test", actor="test", now=now
        )
    # A Tombstone closed earlier (tombstoned, then restored) names the entry too.
    _tombstone(workspace, entry, now)
    lifecycle.change_status(workspace.pk, [entry.pk], Status.ACTIVE, reason="test", actor="test", now=now)
    tombstone = _tombstone(workspace, entry, now)
    _tombstone(workspace, kept, now)
    _purge(workspace, tombstone, now)

    assert not Entry.objects.filter(pk=entry.pk).exists()
    events = LifecycleEvent.objects.filter(entry_ref=entry.pk)
    assert events.count() == 7  # created, stale, active, tombstoned, active, tombstoned, purged
    assert not events.filter(entry_id__isnull=False).exists()
    tombstones = Tombstone.objects.filter(entry_ref=entry.pk)
    assert tombstones.count() == 2 and not tombstones.filter(entry_id__isnull=False).exists()
    # The entry that stayed keeps its events and its Tombstone linked.
    assert LifecycleEvent.objects.filter(entry_ref=kept.pk, entry_id=kept.pk).count() == 4
    assert Tombstone.objects.filter(entry_id=kept.pk).count() == 1


@pytest.mark.django_db
def test_deleting_a_run_unlinks_its_events_and_tombstones(workspace, now):
    run = MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="cli", status="succeeded")
    entry = _entry(workspace, now, "a note about the flaky upload test")
    _tombstone(workspace, entry, now, run=run)
    assert LifecycleEvent.objects.filter(run=run).count() == 1

    MaintenanceRun.objects.filter(pk=run.pk).delete()

    assert not LifecycleEvent.objects.filter(run_id=run.pk).exists()
    assert not Tombstone.objects.filter(run_id=run.pk).exists()
    assert Tombstone.objects.get(entry_id=entry.pk).run_id is None


@pytest.mark.django_db
def test_deleting_a_workspace_leaves_no_event_or_tombstone_naming_it(workspace, other_workspace, now):
    entry = _entry(workspace, now, "a note about the release checklist")
    other = _entry(other_workspace, now, "a note about the release checklist")
    _tombstone(workspace, entry, now)
    _tombstone(other_workspace, other, now)
    gone = workspace.pk

    Workspace.objects.filter(pk=gone).delete()

    assert not LifecycleEvent.objects.filter(workspace_id=gone).exists()
    assert not Tombstone.objects.filter(workspace_id=gone).exists()
    assert LifecycleEvent.objects.filter(workspace=other_workspace).count() == 2
    assert Tombstone.objects.filter(workspace=other_workspace).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_purge_waits_for_a_writer_holding_the_entry_and_unlinks_its_event(workspace, now):
    """An event written by a transaction that holds an entry's lock while a purge of its
    lineage starts: the purge locks the lineage first, so it unlinks that event too, instead of
    unlinking before the event is committed and deleting the entry after."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks between two connections: PostgreSQL (SQLite serialises writers)")
    entry = _entry(workspace, now, "a note about the nightly export")
    tombstone = _tombstone(workspace, entry, now)
    older = Entry.objects.get(pk=entry.pk)
    holding, purged = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with transaction.atomic():
                Entry.objects.select_for_update().get(pk=older.pk)
                LifecycleEvent.objects.create(
                    workspace=workspace,
                    entry_id=older.pk,
                    entry_ref=older.pk,
                    from_status=Status.TOMBSTONED,
                    to_status=Status.TOMBSTONED,
                    reason="note",
                    created_at=now + timedelta(seconds=1),
                )
                holding.set()
                # The purge has started meanwhile and waits for this lock.
                assert not purged.wait(1.0)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            holding.set()
        finally:
            close_old_connections()

    thread = threading.Thread(target=writer)
    thread.start()
    assert holding.wait(10)
    _purge(workspace, tombstone, now + timedelta(seconds=2))
    purged.set()
    thread.join(10)
    assert not errors, errors
    assert not Entry.objects.filter(pk=entry.pk).exists()
    assert not LifecycleEvent.objects.filter(entry_ref=entry.pk, entry_id__isnull=False).exists()
    assert LifecycleEvent.objects.filter(entry_ref=entry.pk, reason="note").exists()
