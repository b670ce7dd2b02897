"""Reverting automatic changes: one entry, a selection, a whole run."""

from datetime import timedelta

import pytest
from django.core.management import call_command

from maintenance.revert import revert_entry, revert_run, revert_selection
from maintenance.run_start import run_maintenance
from memory import entry_changes, new_entries, relationships
from memory.errors import NotFound
from memory.models import Entry, LifecycleEvent, Relationship, Tombstone
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _backups(settings, tmp_path):
    settings.BACKUP_DIR = tmp_path / "backups"


def old(workspace, now, days=100, **fields):
    entry = new_entries.entry_create(
        workspace=workspace,
        content=f"note {Entry.objects.count()}",
        created_at=now - timedelta(days=days),
        now=now,
    )
    if fields:
        Entry.objects.filter(pk=entry.pk).update(**fields)
    return entry


def status(entry):
    return Entry.objects.get(pk=entry.pk).status


def test_reverting_a_run_brings_back_everything_it_archived_and_tombstoned(workspace, now):
    cold = [old(workspace, now) for _ in range(3)]
    stale = old(workspace, now, days=500, status="stale", status_changed_at=now - timedelta(days=200))
    archived_a = old(workspace, now, status="archived", archived_at=now)
    archived_b = old(workspace, now, status="archived", archived_at=now)
    link, _ = relationships.relationship_create(
        workspace=workspace, from_id=archived_a.pk, to_id=archived_b.pk, now=now
    )
    result = run_maintenance(workspace=workspace, now=now)
    assert all(status(e) == "tombstoned" for e in cold)
    assert status(stale) == "archived"
    assert Relationship.objects.get(pk=link.pk).pruned_at is not None

    reverted = revert_run(workspace, result["run_id"], actor="user:op", now=now + timedelta(hours=1))
    assert sorted(reverted["reverted"]) == sorted([*(e.pk for e in cold), stale.pk])
    assert reverted["links_restored"] == 1
    assert all(status(e) == "active" for e in cold)
    assert status(stale) == "stale"
    assert Relationship.objects.get(pk=link.pk).pruned_at is None
    assert not Tombstone.objects.filter(entry__in=cold, restored_at__isnull=True).exists()
    # the operator's decision sticks: every reverted entry is held, by whom and why
    holds = Entry.objects.filter(pk__in=reverted["reverted"]).values_list("hold_reason", "held_by", "held_at")
    assert set(holds) == {("revert", "user:op", now + timedelta(hours=1))}
    events = LifecycleEvent.objects.filter(reason="revert", actor="user:op")
    assert events.count() == 4
    assert all(e.reverts.reverted_at is not None for e in events)
    at, run_id, hold = now + timedelta(hours=1), result["run_id"], (("hold", "revert"),)
    assert {
        (e.entry_id, e.entry_ref, e.from_status, e.to_status, e.run_id, e.automatic, e.created_at, *details)
        for e in events
        for details in [e.details.items()]
    } == {
        *((c.pk, c.pk, "tombstoned", "active", run_id, False, at, *hold) for c in cold),
        (stale.pk, stale.pk, "archived", "stale", run_id, False, at, *hold),
    }
    assert all(
        (e.reverts.entry_id, e.reverts.run_id, e.workspace_id) == (e.entry_id, result["run_id"], workspace.pk)
        for e in events
    )
    # reverting twice does nothing more
    assert revert_run(workspace, result["run_id"], actor="user:op")["reverted"] == []


def test_a_whole_run_revert_works_in_batches_with_no_query_per_entry(workspace, now, monkeypatch):
    """Reverting a run reads each event's run id, not its run row (a run's row carries every
    affected id: reading it per entry took 14 s and 720 MB for 2,807 entries), and reverts in
    batches of REVERT_BATCH entries, one transaction each."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from maintenance import revert

    def revert_of(n):
        ids = [old(workspace, now).pk for _ in range(n)]
        run_id = run_maintenance(workspace=workspace, now=now, force=True)["run_id"]
        with CaptureQueriesContext(connection) as queries:
            result = revert_run(workspace, run_id, actor="user:op", now=now + timedelta(hours=1))
        assert sorted(result["reverted"]) == sorted(ids)
        assert all(status(Entry(pk=i)) == "active" for i in ids)
        return len(queries.captured_queries)

    monkeypatch.setattr(revert, "REVERT_BATCH", 1000)
    few, more = revert_of(4), revert_of(12)
    assert more == few  # one batch either way: the statements do not grow with the entries
    monkeypatch.setattr(revert, "REVERT_BATCH", 5)
    batched = revert_of(12)  # 3 batches of the same statements
    assert few < batched <= 3 * few


def test_a_revert_rescores_exactly_the_entries_whose_counted_links_changed(workspace, now):
    """An entry's own status is no input of its scores; a link counts while its other end is
    not tombstoned. So a revert refreshes the link partners of entries it brings out of the
    tombstone, and both ends of the links it restores — and leaves the other scores alone."""
    from memory.scoring_db import refresh_scores

    cold = old(workspace, now, expires_at=now - timedelta(days=1))  # a TTL tombstones a linked entry too
    partner = new_entries.entry_create(workspace=workspace, content="a fresh partner note", now=now)
    relationships.relationship_create(workspace=workspace, from_id=partner.pk, to_id=cold.pk, now=now)
    stale = old(workspace, now, days=500, status="stale", status_changed_at=now - timedelta(days=200))
    archived_a = old(workspace, now, status="archived", archived_at=now)
    archived_b = old(workspace, now, status="archived", archived_at=now)
    relationships.relationship_create(
        workspace=workspace, from_id=archived_a.pk, to_id=archived_b.pk, now=now
    )
    run_id = run_maintenance(workspace=workspace, now=now)["run_id"]
    assert (status(cold), status(stale)) == ("tombstoned", "archived")
    later = now + timedelta(days=3)
    refresh_scores(workspace, now=later, ids=[partner.pk, archived_a.pk, archived_b.pk])
    without = Entry.objects.get(pk=partner.pk).importance  # the tombstoned end does not count

    at = later + timedelta(hours=1)
    result = revert_run(workspace, run_id, actor="user:op", now=at)
    assert sorted(result["reverted"]) == sorted([cold.pk, stale.pk]) and result["links_restored"] == 1

    def scores():
        rows = Entry.objects.filter(workspace=workspace)
        return {e.pk: (e.importance, e.retention, e.scored_at) for e in rows}

    after = scores()
    rescored = {pk for pk, (_, _, scored_at) in after.items() if scored_at == at}
    assert rescored == {partner.pk, archived_a.pk, archived_b.pk}
    assert after[partner.pk][0] > without
    refresh_scores(workspace, now=at, ids=list(rescored))
    assert scores() == after  # what a refresh at the revert's instant computes


def test_a_revert_skips_entries_changed_since(workspace, now):
    a, b = old(workspace, now), old(workspace, now)
    result = run_maintenance(workspace=workspace, now=now)
    entry_changes.entry_restore(workspace=workspace, entry_id=a.pk, now=now + timedelta(minutes=1))
    entry_changes.entry_tombstone(workspace=workspace, entry_id=a.pk, now=now + timedelta(minutes=2))
    reverted = revert_run(workspace, result["run_id"], actor="user:op", now=now + timedelta(minutes=3))
    assert reverted == {
        "reverted": [b.pk],
        "skipped": [a.pk],
        "links_restored": 0,
        "summaries_archived": [],
        "run_id": result["run_id"],
    }
    assert status(a) == "tombstoned"  # the operator's own tombstone stands


def test_revert_entry_and_selection_undo_the_newest_automatic_transition(workspace, now):
    a, b, c = old(workspace, now), old(workspace, now), old(workspace, now)
    run_maintenance(workspace=workspace, now=now)
    assert revert_entry(workspace, a.pk, actor="user:op")["reverted"] == [a.pk]
    assert status(a) == "active"
    assert revert_selection(workspace, [b.pk, c.pk], actor="user:op")["reverted"] == [b.pk, c.pk]
    assert revert_entry(workspace, a.pk, actor="user:op")["reverted"] == []


def test_staged_expiry_then_ttl_in_one_run_reverts_to_staged(workspace, now):
    entry = new_entries.entry_create(
        workspace=workspace,
        content="x",
        staged_class="evidence",
        created_at=now - timedelta(days=20),
        now=now,
    )
    Entry.objects.filter(pk=entry.pk).update(expires_at=now)
    result = run_maintenance(workspace=workspace, now=now)
    assert status(entry) == "tombstoned"
    revert_run(workspace, result["run_id"], actor="user:op")
    assert status(entry) == "staged"


def test_purged_entries_cannot_be_reverted_but_the_rest_can(workspace, now):
    MaintenancePolicy.objects.filter(workspace=workspace).update(tombstone_grace_days=0)
    a = old(workspace, now)
    result = run_maintenance(workspace=workspace, now=now)
    assert result["counts"]["hard_deleted"] == 1  # grace 0: tombstoned and purged in one run
    assert not Entry.objects.filter(pk=a.pk).exists()
    assert revert_run(workspace, result["run_id"], actor="user:op")["reverted"] == []


def test_another_workspaces_run_or_entry_is_not_found(workspace, other_workspace, now):
    old(other_workspace, now)
    result = run_maintenance(workspace=other_workspace, now=now)
    with pytest.raises(NotFound):
        revert_run(workspace, result["run_id"], actor="user:op")
    theirs = Entry.objects.get(workspace=other_workspace)
    with pytest.raises(NotFound):
        revert_entry(workspace, theirs.pk, actor="user:op")
    assert revert_selection(workspace, [theirs.pk], actor="user:op")["reverted"] == []
    assert status(theirs) == "tombstoned"


def test_revert_run_command(workspace, now):
    import json
    from io import StringIO

    a = old(workspace, now)
    result = run_maintenance(workspace=workspace, now=now)
    out = StringIO()
    call_command("revert_run", str(result["run_id"]), "--workspace", workspace.slug, "--json", stdout=out)
    assert json.loads(out.getvalue())["reverted"] == [a.pk]


def test_an_archive_stays_revertible_after_the_entry_gets_new_content(workspace, now):
    stale = old(workspace, now, days=500, status="stale", status_changed_at=now - timedelta(days=200))
    MaintenancePolicy.objects.filter(workspace=workspace).update(cold_threshold=0.0)
    result = run_maintenance(workspace=workspace, now=now)
    assert status(stale) == "archived"
    newer = entry_changes.entry_update(
        workspace=workspace, entry_id=stale.pk, content="rewritten", now=now
    ).entry
    assert status(newer) == "archived"
    reverted = revert_run(workspace, result["run_id"], actor="user:op", now=now + timedelta(minutes=1))
    assert reverted["reverted"] == [newer.pk]
    assert status(newer) == "stale"
    assert LifecycleEvent.objects.get(entry=newer, reason="revert").reverts.entry_id == stale.pk


def test_the_lookup_of_a_huge_revert_stays_within_the_databases_parameter_limits(workspace):
    """A run over a million entries changes hundreds of thousands: one query with their ids as
    parameters failed on PostgreSQL (at most 65,535; SQLite's limit depends on its build).
    70,000 ids that name no entry need no rows to show it."""
    from maintenance.revert import _latest_ids

    entry = new_entries.entry_create(workspace=workspace, content="the one entry that exists here")
    assert _latest_ids(workspace, [entry.pk, *range(10**9, 10**9 + 70_000)]) == {entry.pk: entry.pk}


def test_a_batched_revert_tells_open_pages_once(
    workspace, now, monkeypatch, django_capture_on_commit_callbacks
):
    """Each batch places holds, which announce the review counts; rendering them reads the
    whole workspace (seconds at a million entries), so a revert announces once, at its end."""
    from console import live
    from maintenance import revert

    ids = [old(workspace, now).pk for _ in range(6)]
    run_id = run_maintenance(workspace=workspace, now=now, force=True)["run_id"]
    monkeypatch.setattr(revert, "REVERT_BATCH", 2)
    sent: list[str] = []
    monkeypatch.setattr(live, "deliver", lambda workspace_id, html: sent.append(html))

    with django_capture_on_commit_callbacks(execute=True):
        result = revert_run(workspace, run_id, actor="user:op", now=now + timedelta(hours=1))

    assert sorted(result["reverted"]) == sorted(ids)
    assert len(sent) == 1
    assert 'id="live-queue"' in sent[0]
