"""A run's plan keeps the statuses it decides beside the entries (``maintenance.plan_status``):
later passes of the plan see them exactly as the apply's later passes see the written rows, and
the plan neither writes nor locks the entries it marks stale, archives or tombstones."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections

from maintenance import passes, plan_status
from maintenance.run_start import run_maintenance
from memory import accounts, new_entries, relationships
from memory.models import Entry, Relationship
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db

GOOD = "Retry the payment webhook with exponential backoff; the provider drops bursts above ten a second."


def policy(workspace, **values):
    row = MaintenancePolicy.objects.get(workspace=workspace)
    for k, v in values.items():
        setattr(row, k, v)
    row.save()


def make(workspace, now, content=None, *, age_days=0.0, **fields):
    writable = {k: fields.pop(k) for k in list(fields) if k in ("tier", "impact_score")}
    when = now - timedelta(days=age_days)
    entry = new_entries.entry_create(
        workspace=workspace,
        content=content or f"memory {Entry.objects.count()} about caching and retries",
        created_at=when,
        now=when,
        **writable,
    )
    if fields:
        Entry.objects.filter(pk=entry.pk).update(**fields)
    return entry


def statuses(*entries):
    found = dict(Entry.objects.filter(pk__in=[e.pk for e in entries]).values_list("pk", "status"))
    return [found[e.pk] for e in entries]


def dry_then_real(workspace, now, recorded):
    original = plan_status.record

    def spy(ids, status, when):
        if ids:
            recorded.append((str(status), list(ids)))
        original(ids, status, when)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(plan_status, "record", spy)
        dry = run_maintenance(workspace=workspace, now=now, dry_run=True)
    real = run_maintenance(workspace=workspace, now=now)
    assert dry["counts"] == real["counts"]
    assert dry["affected"] == real["affected"]
    return real


def test_an_entry_archived_earlier_in_the_run_is_not_evicted_and_a_stale_one_is(workspace, now):
    policy(workspace, archive_older_than_days=150, importance_threshold=0.5, max_tombstone_fraction=1.0)
    archived = make(workspace, now, age_days=200)  # stale (4), then archived (5): not a decay candidate
    cold = make(workspace, now, age_days=100)  # stale (4), too young to archive, cold: evicted (9)
    recorded = []
    real = dry_then_real(workspace, now, recorded)
    assert statuses(archived, cold) == ["archived", "tombstoned"]
    assert real["affected"]["archived"] == [archived.pk]
    assert real["affected"]["tombstoned"] == [cold.pk]
    assert real["counts"]["stale_marked"] == 2 and real["counts"]["evicted"] == 1
    # The plan moved both through the overlay: stale first, then one archived, one tombstoned.
    assert recorded == [
        ("stale", sorted([archived.pk, cold.pk])),
        ("archived", [archived.pk]),
        ("tombstoned", [cold.pk]),
    ]


def test_an_entry_marked_stale_earlier_in_the_run_is_not_archived_as_low_quality(workspace, now):
    junk = make(workspace, now, "half done...", age_days=200, tier="semantic")
    real = dry_then_real(workspace, now, [])
    assert statuses(junk) == ["stale"]
    assert real["counts"]["stale_marked"] == 1 and real["counts"]["low_quality_archived"] == 0


def test_a_copy_whose_older_twin_was_archived_earlier_in_the_run_is_no_duplicate(workspace, now):
    policy(workspace, archive_older_than_days=150, importance_threshold=0.5)
    older = make(workspace, now, GOOD, age_days=200, tier="semantic")
    newer = make(workspace, now, GOOD, age_days=40, tier="semantic")
    real = dry_then_real(workspace, now, [])
    assert statuses(older, newer) == ["archived", "active"]
    assert real["counts"]["low_quality_archived"] == 0


def test_a_link_whose_ends_were_both_archived_earlier_in_the_run_is_pruned(workspace, now):
    policy(workspace, archive_older_than_days=150, importance_threshold=0.5)
    a = make(workspace, now, age_days=200, tier="semantic")
    b = make(workspace, now, age_days=200, tier="semantic")
    link, _ = relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=b.pk, now=now)
    real = dry_then_real(workspace, now, [])
    assert statuses(a, b) == ["archived", "archived"]
    assert real["counts"]["links_pruned"] == 1
    assert Relationship.objects.get(pk=link.pk).pruned_at == now


def test_fragments_archived_earlier_in_the_run_leave_their_group_too_small_to_compact(workspace, now):
    policy(workspace, archive_older_than_days=150, importance_threshold=0.5)
    for n in range(11):  # 11 > consolidation_min_group (10); the two oldest are archived first (5)
        when = now - timedelta(days=200 if n < 2 else 20, minutes=n)
        new_entries.entry_create(
            workspace=workspace,
            content=f"Step {n}: wired the login form validation and checked the session cookie",
            entry_type="development_note",
            tier="semantic",
            project="web",
            session_key="feature-login",
            created_at=when,
            now=when,
        )
    real = dry_then_real(workspace, now, [])
    assert real["counts"]["archived"] == 2
    assert real["counts"]["summaries_created"] == 0 and real["counts"]["consolidated"] == 0


def test_with_no_grace_the_plan_writes_its_changes_as_before(workspace, now):
    """A grace of 0 days purges this run's own tombstones in the same run: the purge reads
    tombstone rows, so that plan writes (and rolls back) every change."""
    policy(workspace, tombstone_grace_days=0, max_tombstone_fraction=1.0)
    cold = make(workspace, now, age_days=100)
    recorded = []
    real = dry_then_real(workspace, now, recorded)
    assert recorded == []
    assert real["counts"]["evicted"] == 1 and real["counts"]["hard_deleted"] == 1
    assert not Entry.objects.filter(pk=cold.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_plan_leaves_the_rows_it_changes_unlocked(monkeypatch, now):
    """While the plan runs, another connection updates an entry the plan has just marked
    stale, at once: the plan wrote nothing into its row (on PostgreSQL the update would wait
    for the plan's rollback; on SQLite the plan reads a copy of the database, and a plan in
    the database itself would hold its write lock from its start)."""
    ws = accounts.workspace_create(slug="unlocked", name="Unlocked", review_mode="apply")
    old = make(ws, now, age_days=100)
    outcome: dict[str, object] = {}
    original = passes.archive

    def side_write() -> None:
        side = connections.create_connection("default")
        try:
            with side.cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute("SET lock_timeout = '2s'")
                cursor.execute("UPDATE memory_entry SET title = 'written meanwhile' WHERE id = %s", [old.pk])
                outcome["rows"] = cursor.rowcount
        except Exception as exc:  # a lock timeout: the plan held the row
            outcome["error"] = exc
        finally:
            side.close()

    def archive_after_a_side_write(ctx, **kwargs):
        if ctx.planning:
            thread = threading.Thread(target=side_write)
            thread.start()
            thread.join()
        return original(ctx, **kwargs)

    monkeypatch.setattr(passes, "archive", archive_after_a_side_write)
    result = run_maintenance(workspace=ws, now=now, dry_run=True)
    assert result["counts"]["stale_marked"] == 1
    assert outcome == {"rows": 1}
    assert Entry.objects.get(pk=old.pk).title == "written meanwhile"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the overlay's statistics are PostgreSQL's")
def test_the_overlay_s_statistics_are_renewed_once_a_tenth_of_its_rows_are_new(now):
    """The overlay is analysed after ANALYZE_FROM recorded rows, then only once the rows
    recorded since reach a tenth of those before: a pass recording batch by batch into a large
    overlay does not sample all of it again for every thousand."""
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    def analyses(ids):
        with CaptureQueriesContext(connection) as seen:
            plan_status.record(ids, "stale", now)
        return sum("ANALYZE" in q["sql"] for q in seen.captured_queries)

    with transaction.atomic(), plan_status.overlay():
        assert analyses(range(1, 900)) == 0  # below ANALYZE_FROM
        assert analyses(range(900, 20_001)) == 1  # 20,000 recorded, all analysed
        assert analyses(range(20_001, 21_501)) == 0  # 1,500 new: under a tenth of 20,000
        assert analyses(range(21_501, 22_101)) == 1  # 2,100 new
        assert analyses(range(22_101, 23_101)) == 0  # 1,000 new: under a tenth of 22,100
        assert analyses(range(1, 3001)) == 1  # rows recorded again count too
