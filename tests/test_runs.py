"""The maintenance run: every pass with its boundaries and protections, the
dry run, the circuit breaker, the lease and the result object."""

import functools
import json
from datetime import timedelta

import pytest
from django.core.management import call_command

from maintenance.lease import acquire, new_holder
from maintenance.models import MaintenanceRun
from maintenance.run_results import COUNT_KEYS, decay_result, prune_result
from maintenance.run_start import run_maintenance
from memory import accounts, entry_changes, journal_export, journal_import, new_entries, relationships
from memory.models import Entry, LifecycleEvent, Relationship, Tombstone
from memory.policy_model import MaintenancePolicy
from tests.helpers_scores import set_scores

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _backups(settings, tmp_path):
    settings.BACKUP_DIR = tmp_path / "backups"


def policy(workspace, **values):
    row = MaintenancePolicy.objects.get(workspace=workspace)
    for k, v in values.items():
        setattr(row, k, v)
    row.save()


def make(workspace, now, *, age_days=0.0, **fields):
    """An entry created age_days before now; extra fields are set straight on the row."""
    tags = fields.pop("tags", None)
    entry = new_entries.entry_create(
        workspace=workspace,
        content=fields.pop("content", f"memory {Entry.objects.count()} about caching and retries"),
        created_at=now - timedelta(days=age_days),
        now=now - timedelta(days=age_days),
        tags=tags,
        **{
            k: fields.pop(k)
            for k in list(fields)
            if k in ("source", "tier", "pinned", "impact_score", "significance_type")
        },
    )
    if fields:
        Entry.objects.filter(pk=entry.pk).update(**fields)
    entry.refresh_from_db()
    return entry


def status(entry):
    return Entry.objects.get(pk=entry.pk).status


def run(workspace, now, **kwargs):
    return run_maintenance(workspace=workspace, now=now, **kwargs)


# --- the result object ----------------------------------------------------------------------


def test_the_result_object_has_exactly_the_spec_shape(workspace, now):
    make(workspace, now)
    result = run(workspace, now)
    assert list(result) == [
        "run_id",
        "workspace",
        "kind",
        "dry_run",
        "status",
        "backup_file",
        "counts",
        "affected",
    ]
    assert list(result["counts"]) == list(COUNT_KEYS)
    assert list(result["affected"]) == ["archived", "tombstoned", "purged"]
    assert result["status"] == "succeeded"
    assert result["counts"]["scored"] == 1
    stored = MaintenanceRun.objects.get(pk=result["run_id"])
    assert stored.result == json.loads(json.dumps(result))
    assert stored.counts == result["counts"]


# --- decay (pass 9) -------------------------------------------------------------------------


def test_decay_tombstones_cold_episodic_entries_strictly_below_the_threshold(workspace, now):
    # ln(0.2)/-0.02 = 80.47 days: 80 days is warm, 81 is cold
    warm = make(workspace, now, age_days=80)
    cold = make(workspace, now, age_days=81)
    result = run(workspace, now)
    assert status(warm) == "active"
    assert status(cold) == "tombstoned"
    assert result["counts"]["evicted"] == 1
    assert result["affected"]["tombstoned"] == [cold.pk]
    tomb = Tombstone.objects.get(entry=cold)
    assert (tomb.reason, tomb.previous_status, tomb.run_id) == ("decay", "active", result["run_id"])
    assert tomb.purge_after == now + timedelta(days=180)


def test_decay_never_touches_protected_or_high_value_entries(workspace, now):
    protected = [
        make(workspace, now, age_days=200, pinned=True),
        make(workspace, now, age_days=200, source="operator"),
        make(workspace, now, age_days=200, source="system"),
        make(workspace, now, age_days=200, tier="constitutional"),
        make(workspace, now, age_days=200, tier="semantic"),  # only episodic decays
        make(workspace, now, age_days=200, tags=["keep"]),
        make(workspace, now, age_days=200, impact_score=0.5),
        make(workspace, now, age_days=200, significance_type="security"),
    ]
    linked = make(workspace, now, age_days=200)
    anchor = make(workspace, now, age_days=1)
    relationships.relationship_create(workspace=workspace, from_id=linked.pk, to_id=anchor.pk, now=now)
    victim = make(workspace, now, age_days=200)
    policy(workspace, exclude_tags=["keep"])
    run(workspace, now)
    # Protected entries are not even marked stale; semantic and high-value ones may be marked
    # stale (that removes nothing) but are never tombstoned.
    assert [status(e) for e in protected] == ["active"] * 4 + ["stale", "active", "stale", "stale"]
    assert status(linked) == "stale"
    assert status(victim) == "tombstoned"


def test_an_entry_a_newer_one_evolved_from_is_absorbed_not_high_value(workspace, now):
    """A consolidation (or a compaction's retrospective) links ``evolves_from`` to what it was
    drawn from: that incoming link does not keep the source from decaying. Any other link, and
    the newer entry's own outgoing evolves_from, still make an entry high value."""
    absorbed = make(workspace, now, age_days=200)
    referenced = make(workspace, now, age_days=200)
    for target, kind in ((absorbed, "evolves_from"), (referenced, "references")):
        new_entries.entry_create(
            workspace=workspace,
            content=f"a semantic note drawn from {target.pk}",
            tier="semantic",
            links=[{"to_id": target.pk, "type": kind}],
            now=now,
        )
    newer = make(workspace, now, age_days=200)
    older = make(workspace, now, age_days=1)
    relationships.relationship_create(
        workspace=workspace, from_id=newer.pk, to_id=older.pk, type="evolves_from", now=now
    )
    result = run(workspace, now)
    assert status(absorbed) == "tombstoned"
    assert (status(referenced), status(newer)) == ("stale", "stale")
    assert result["affected"]["tombstoned"] == [absorbed.pk]


# --- ttl (pass 10) --------------------------------------------------------------------------


def test_ttl_beats_pin_but_not_an_operator_source(workspace, now):
    pinned = make(workspace, now, pinned=True, expires_at=now)
    operator = make(workspace, now, source="operator", expires_at=now - timedelta(days=1))
    future = make(workspace, now, expires_at=now + timedelta(seconds=1))
    result = run(workspace, now)
    assert status(pinned) == "tombstoned"
    assert status(operator) == "active"
    assert status(future) == "active"
    assert result["counts"]["expired"] == 1
    assert Tombstone.objects.get(entry=pinned).reason == "ttl"


# --- staged (passes 2, 3) -------------------------------------------------------------------


def test_staged_traces_graduate_when_reinforced_or_dispatched_twice(workspace, now):
    proc = new_entries.entry_create(
        workspace=workspace,
        content="run migrations before deploy",
        staged_class="procedural",
        now=now,
        trust_score=0.8,
    )
    ref = new_entries.entry_create(
        workspace=workspace,
        content="the API docs live at /docs",
        staged_class="reference",
        entry_type="research",
        now=now,
    )
    once = new_entries.entry_create(
        workspace=workspace, content="tried a cache once", staged_class="conceptual", now=now
    )
    evidence = new_entries.entry_create(
        workspace=workspace, content="log line seen", staged_class="evidence", now=now
    )
    Entry.objects.filter(pk__in=[proc.pk, evidence.pk]).update(reinforced_at=now)
    Entry.objects.filter(pk=ref.pk).update(retrieval_count=2)
    Entry.objects.filter(pk=once.pk).update(retrieval_count=1)
    result = run(workspace, now)
    assert result["counts"]["staged_graduated"] == 2
    proc.refresh_from_db()
    ref.refresh_from_db()
    assert (proc.status, proc.entry_type, proc.trust_score, proc.impact_score) == (
        "active",
        "lesson",
        0.9,
        0.15,
    )
    assert (ref.status, ref.entry_type, ref.trust_score) == ("active", "research", 0.75)
    assert set(proc.tags.values_list("name", flat=True)) == {"consolidated", "graduated"}
    assert status(once) == "staged"
    assert status(evidence) == "staged"  # evidence never graduates
    assert LifecycleEvent.objects.filter(entry=proc, reason="graduate", automatic=True).count() == 1


def test_unreinforced_staged_traces_expire_at_their_ttl(workspace, now):
    expired = new_entries.entry_create(
        workspace=workspace,
        content="a",
        staged_class="evidence",
        created_at=now - timedelta(days=14),
        now=now,
    )
    fresh = new_entries.entry_create(
        workspace=workspace,
        content="b",
        staged_class="evidence",
        created_at=now - timedelta(days=13),
        now=now,
    )
    kept = new_entries.entry_create(
        workspace=workspace,
        content="c",
        staged_class="evidence",
        created_at=now - timedelta(days=30),
        now=now,
    )
    Entry.objects.filter(pk=kept.pk).update(reinforced_at=now)
    result = run(workspace, now)
    assert status(expired) == "archived"
    assert status(fresh) == "staged"
    assert status(kept) == "staged"
    assert result["counts"]["staged_expired"] == 1


# --- stale marking and archive (passes 4, 5) ------------------------------------------------


def test_stale_marking_and_archive_follow_their_day_counts(workspace, now):
    policy(workspace, cold_threshold=0.0)  # keep decay out of this test
    idle = make(workspace, now, age_days=91, updated_at=now - timedelta(days=91))
    touched = make(workspace, now, age_days=91, updated_at=now - timedelta(days=89))
    read = make(
        workspace,
        now,
        age_days=91,
        updated_at=now - timedelta(days=91),
        access_count=1,
        last_accessed_at=now - timedelta(days=10),
    )
    long_stale = make(
        workspace, now, age_days=400, status="stale", status_changed_at=now - timedelta(days=180)
    )
    recent_stale = make(
        workspace, now, age_days=400, status="stale", status_changed_at=now - timedelta(days=179)
    )
    result = run(workspace, now)
    assert status(idle) == "stale"
    assert status(touched) == "active"
    assert status(read) == "active"
    assert status(long_stale) == "archived"
    assert status(recent_stale) == "stale"
    assert result["counts"]["stale_marked"] == 1
    assert result["counts"]["archived"] == 1
    assert Entry.objects.get(pk=long_stale.pk).archived_at == now


def test_archive_older_than_uses_a_strict_importance_threshold(workspace, now):
    policy(workspace, archive_older_than_days=30, importance_threshold=0.15, cold_threshold=0.0)
    low = make(workspace, now, age_days=31)  # importance 0.15 × (1 − 31/90) < 0.15 at `now`
    young = make(workspace, now, age_days=29)
    result = run(workspace, now)
    assert status(low) == "archived"
    assert Entry.objects.get(pk=low.pk).importance == pytest.approx(0.15 * (1 - 31 / 90))
    assert status(young) == "active"
    assert result["counts"]["archived"] == 1


def test_the_plan_decides_on_fresh_scores_without_rewriting_the_stored_ones(workspace, now):
    """The plan scores into a temporary table: no UPDATE of memory_entry's scores, yet it decides
    on the scores at ``now`` (not the stale stored ones), exactly as the real run does."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    policy(workspace, archive_older_than_days=30, importance_threshold=0.15, cold_threshold=0.3)
    low = make(workspace, now, age_days=31)  # 0.15 × (1 − 31/90) at `now`: below the threshold
    # Retention e^(−0.02 × 200) ≈ 0.02 at `now`; importance 0.45 × 0.3 × 1.5 ≈ 0.2: not archived.
    cold = make(workspace, now, age_days=200, impact_score=0.45, validation_status="passed")
    # Stored scores that say otherwise (as if last refreshed long ago): the run must not use them.
    set_scores([low.pk, cold.pk], importance=0.9, retention=0.9)
    with CaptureQueriesContext(connection) as plan:
        dry = run(workspace, now, dry_run=True)
    rescored = [q["sql"] for q in plan.captured_queries if 'SET "importance"' in q["sql"]]
    assert rescored == []  # no score written to the entries, not even to roll it back
    assert any("maintenance_planscore" in q["sql"] for q in plan.captured_queries)
    assert Entry.objects.get(pk=low.pk).importance == 0.9  # untouched
    assert dry["counts"]["scored"] == 2
    assert dry["affected"]["archived"] == [low.pk]
    assert dry["affected"]["tombstoned"] == [cold.pk]
    evicted = run(workspace, now, kind="decay", dry_run=True)["sweep"]["evicted"]
    assert [e["id"] for e in evicted] == [cold.pk]
    assert evicted[0]["retention"] < 0.3  # the retention at `now`, not the stored 0.9

    real = run(workspace, now)
    assert real["counts"] == dry["counts"]
    assert real["affected"] == dry["affected"]
    assert Entry.objects.get(pk=low.pk).importance == pytest.approx(0.15 * (1 - 31 / 90))
    assert Entry.objects.get(pk=cold.pk).retention == pytest.approx(evicted[0]["retention"], abs=1e-12)
    assert status(low) == "archived" and status(cold) == "tombstoned"


# --- prune (pass 8) and the partial prune run ------------------------------------------------


def test_prune_uses_caller_parameters_and_reports_the_spec_shape(workspace, now):
    policy(workspace, cold_threshold=0.0)
    old = make(workspace, now, age_days=100)
    keep = make(workspace, now, age_days=100, tags=["important"])
    young = make(workspace, now, age_days=10)
    result = run(
        workspace,
        now,
        kind="prune",
        params={"prune_older_than_days": 50, "importance_threshold": 0.15, "exclude_tags": "important"},
    )
    shaped = prune_result(result)
    assert shaped == {
        "success": True,
        "archived_count": 0,
        "pruned_count": 1,
        "hard_deleted_count": 0,
        "backup_file": result["backup_file"],
        "dry_run": False,
        "run_id": result["run_id"],
        "status": "succeeded",
    }
    assert shaped["backup_file"].startswith("pre-prune-backup-")
    assert [status(old), status(keep), status(young)] == ["tombstoned", "active", "active"]


def test_prune_does_nothing_when_prune_older_than_days_is_off(workspace, now):
    make(workspace, now, age_days=1000)
    result = run(workspace, now, kind="prune", params={"importance_threshold": 1.0})
    assert result["counts"]["pruned"] == 0


# --- reclaim, links, purge (passes 11, 12, 13) -----------------------------------------------


def test_reclaim_tombstones_entries_archived_for_a_year(workspace, now):
    policy(workspace, cold_threshold=0.0)
    due = make(workspace, now, age_days=800, status="archived", archived_at=now - timedelta(days=365))
    not_yet = make(workspace, now, age_days=800, status="archived", archived_at=now - timedelta(days=364))
    result = run(workspace, now)
    assert status(due) == "tombstoned"
    assert status(not_yet) == "archived"
    assert result["counts"]["reclaimed"] == 1
    assert Tombstone.objects.get(entry=due).previous_status == "archived"


def test_links_between_two_gone_entries_are_pruned_not_deleted(workspace, now):
    policy(workspace, cold_threshold=0.0)
    a = make(workspace, now, status="archived", archived_at=now)
    b = make(workspace, now, status="archived", archived_at=now)
    c = make(workspace, now)
    gone, _ = relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=b.pk, now=now)
    alive, _ = relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=c.pk, now=now)
    result = run(workspace, now)
    assert result["counts"]["links_pruned"] == 1
    assert Relationship.objects.get(pk=gone.pk).pruned_at == now
    assert Relationship.objects.get(pk=alive.pk).pruned_at is None


def test_purge_waits_for_the_grace_then_removes_the_whole_lineage(workspace, now):
    entry = make(workspace, now - timedelta(days=10))
    newer = entry_changes.entry_update(
        workspace=workspace, entry_id=entry.pk, content="second version", now=now - timedelta(days=10)
    ).entry
    other = make(workspace, now)
    relationships.relationship_create(workspace=workspace, from_id=newer.pk, to_id=other.pk, now=now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=newer.pk, now=now - timedelta(days=180))
    early = run(workspace, now - timedelta(seconds=1), kind="decay")
    assert early["counts"]["hard_deleted"] == 0
    result = run(workspace, now, kind="decay")
    assert result["counts"]["hard_deleted"] == 1
    assert result["affected"]["purged"] == [newer.pk]
    assert not Entry.objects.filter(lineage_id=entry.lineage_id).exists()
    assert not Relationship.objects.filter(to_entry=other).exists()
    tomb = Tombstone.objects.get(entry_ref=newer.pk)
    assert tomb.purged_at == now and tomb.entry is None and tomb.content_hash
    assert LifecycleEvent.objects.filter(entry_ref=newer.pk, to_status="purged").exists()
    assert Entry.objects.filter(pk=other.pk).exists()
    assert result["backup_file"]


def test_hard_delete_older_than_days_replaces_the_grace(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now - timedelta(days=3))
    assert (
        run(workspace, now, kind="prune", params={"hard_delete_older_than_days": 4})["counts"]["hard_deleted"]
        == 0
    )
    assert (
        run(workspace, now, kind="prune", params={"hard_delete_older_than_days": 3})["counts"]["hard_deleted"]
        == 1
    )


# --- decay sweep shape ------------------------------------------------------------------------


def test_the_decay_sweep_reports_evicted_and_expired_entries(workspace, now):
    cold = make(workspace, now, age_days=100)
    ttl = make(workspace, now, expires_at=now - timedelta(hours=1))
    make(workspace, now)
    shaped = decay_result(run(workspace, now, kind="decay"))
    assert shaped["candidates_evaluated"] == 3
    assert [e["id"] for e in shaped["evicted"]] == [cold.pk]
    assert shaped["evicted"][0]["age_days"] == pytest.approx(100)
    assert shaped["evicted"][0]["retention"] < 0.2
    assert shaped["expired"] == [{"id": ttl.pk, "expired_at": (now - timedelta(hours=1)).isoformat()}]
    assert shaped["hard_deleted"] == 0


# --- dry run ----------------------------------------------------------------------------------


def _snapshot(workspace):
    records = list(journal_export.export_records(workspace))
    rows = list(Entry.objects.filter(workspace=workspace).order_by("pk").values())
    return (
        records,
        rows,
        Tombstone.objects.count(),
        LifecycleEvent.objects.count(),
        Relationship.objects.filter(pruned_at__isnull=False).count(),
    )


def _busy_workspace(workspace, now):
    journal_import.import_journal(
        workspace=workspace, path=journal_import.SAMPLE_PATH, now=now - timedelta(days=30)
    )
    policy(workspace, max_tombstone_fraction=1.0, prune_older_than_days=3000, importance_threshold=0.2)
    ids = list(Entry.objects.filter(workspace=workspace).order_by("pk").values_list("pk", flat=True))
    Entry.objects.filter(pk__in=ids[:20]).update(status="archived", archived_at=now - timedelta(days=400))
    Entry.objects.filter(pk__in=ids[20:30]).update(expires_at=now - timedelta(days=1))
    Entry.objects.filter(pk__in=ids[30:40]).update(pinned=True)


def test_a_dry_run_reports_the_same_counts_and_ids_as_the_real_run_and_changes_nothing(
    workspace, now, settings
):
    _busy_workspace(workspace, now)
    before = _snapshot(workspace)
    dry = run(workspace, now, dry_run=True)
    assert _snapshot(workspace) == before
    assert not list(settings.BACKUP_DIR.glob("**/*.gz"))
    real = run(workspace, now)
    assert dry["dry_run"] and not real["dry_run"]
    assert dry["counts"] == real["counts"]
    assert dry["affected"] == real["affected"]
    assert real["counts"]["evicted"] + real["counts"]["pruned"] > 100
    assert real["backup_file"]


def test_a_second_run_at_the_same_now_changes_nothing_more(workspace, now):
    _busy_workspace(workspace, now)
    run(workspace, now)
    again = run(workspace, now)
    changed = {k: v for k, v in again["counts"].items() if v and k not in ("scored", "orphans")}
    assert changed == {}


# --- circuit breaker --------------------------------------------------------------------------


def test_the_circuit_breaker_blocks_a_run_that_would_tombstone_most_entries(workspace, now):
    cold = [make(workspace, now, age_days=100) for _ in range(21)]
    warm = [make(workspace, now) for _ in range(20)]
    before = _snapshot(workspace)
    dry = run(workspace, now, dry_run=True)
    blocked = run(workspace, now)
    assert dry["status"] == blocked["status"] == "blocked"
    assert blocked["counts"]["evicted"] == 21
    assert blocked["affected"]["tombstoned"] == sorted(e.pk for e in cold)
    assert _snapshot(workspace)[1:] == before[1:]
    assert MaintenanceRun.objects.get(pk=blocked["run_id"]).error.startswith("circuit breaker")
    forced = run(workspace, now, force=True)
    assert forced["status"] == "succeeded"
    assert all(status(e) == "tombstoned" for e in cold)
    assert all(status(e) == "active" for e in warm)


def test_an_orphan_has_no_active_link_on_either_side_and_a_low_importance(workspace, now):
    """The apply's orphan count (``passes.count_orphans``, one NOT EXISTS per side of a link):
    a link from the entry or to it keeps it from being an orphan, a pruned one does not."""
    from maintenance import pass_tools, passes, runs
    from memory.policy import PolicyValues

    low = [make(workspace, now, importance=0.1) for _ in range(4)]
    high = [make(workspace, now, importance=0.5) for _ in range(4)]
    relationships.relationship_create(workspace=workspace, from_id=low[0].pk, to_id=high[0].pk, now=now)
    relationships.relationship_create(workspace=workspace, from_id=high[1].pk, to_id=low[1].pk, now=now)
    pruned, _ = relationships.relationship_create(
        workspace=workspace, from_id=low[2].pk, to_id=high[2].pk, now=now
    )
    Relationship.objects.filter(pk=pruned.pk).update(pruned_at=now)
    # A link rescores its ends: the stored importances set again after them.
    Entry.objects.filter(pk__in=[e.pk for e in low]).update(importance=0.1)
    Entry.objects.filter(pk__in=[e.pk for e in high]).update(importance=0.5)
    ctx = pass_tools.RunContext(workspace=workspace, now=now, policy=PolicyValues(), run=None)
    assert passes.count_orphans(ctx).count == 2  # low[2] (its only link pruned) and low[3]
    assert runs.RUN_PASSES["full"][-1][0] == "orphans"  # the plan decides it after every other pass


def test_the_plan_counts_orphans_only_for_a_run_that_ends_with_it(workspace, now, monkeypatch):
    """Orphans is a metric, the last pass: a run that applies reports its apply's count, so
    its plan does not count them; a dry run and a run the breaker blocks report their plan's
    count, the same number."""
    from maintenance import passes

    counted = []
    plan_count = passes._planned_orphans
    monkeypatch.setattr(passes, "_planned_orphans", lambda ctx: counted.append(ctx.now) or plan_count(ctx))
    cold = [make(workspace, now, age_days=100) for _ in range(21)]
    for _ in range(3):
        make(workspace, now, age_days=40, importance=0.05)  # stale, kept: orphans after the run
    make(workspace, now)
    dry = run(workspace, now, dry_run=True)
    blocked = run(workspace, now)
    assert dry["status"] == blocked["status"] == "blocked" and len(counted) == 2
    # 21 tombstones of 25 live entries pass a breaker set at 90 %: the run applies, unforced,
    # and its plan knew it would before its last pass (the live entries are read before it).
    policy(workspace, max_tombstone_fraction=0.9)
    applied = run(workspace, now)
    assert applied["status"] == "succeeded" and len(counted) == 2  # its plan did not count
    assert all(status(e) == "tombstoned" for e in cold)
    assert 0 < dry["counts"]["orphans"] == blocked["counts"]["orphans"] == applied["counts"]["orphans"]
    quiet = run(workspace, now, dry_run=True)  # nothing left to tombstone: a dry run still counts
    assert len(counted) == 3 and quiet["counts"]["orphans"] == applied["counts"]["orphans"]


def test_the_breaker_ignores_twenty_or_fewer_tombstones(workspace, now):
    for _ in range(20):
        make(workspace, now, age_days=100)
    assert run(workspace, now)["status"] == "succeeded"


# --- lease, scope, backups ----------------------------------------------------------------------


def test_a_run_while_the_lease_is_held_is_recorded_as_skipped(workspace, now):
    from django.utils import timezone

    make(workspace, now, age_days=100)
    assert acquire(workspace, holder=new_holder(), now=timezone.now())
    result = run(workspace, now)
    assert result["status"] == "skipped"
    assert Entry.objects.filter(status="tombstoned").count() == 0


def test_an_expired_lease_is_taken_over_and_the_dead_run_marked_failed(workspace, now):
    from django.utils import timezone

    dead = MaintenanceRun.objects.create(
        workspace=workspace, kind="full", trigger="schedule", started_at=timezone.now() - timedelta(minutes=5)
    )
    acquire(workspace, holder="dead-process", now=timezone.now() - timedelta(seconds=61), run=dead)
    result = run(workspace, now)
    assert result["status"] == "succeeded"
    dead.refresh_from_db()
    assert dead.status == "failed" and "interrupted" in dead.error


def test_a_run_renews_its_lease_at_most_every_few_seconds_and_notices_a_loss_after_a_stall(
    workspace, monkeypatch
):
    """Between two renewals less than ``RENEW_EVERY`` apart nothing can have taken the lease
    (a takeover needs it unrenewed for LEASE_TTL): the renewal answers without a statement.
    After a longer pause it asks again, and a lease taken meanwhile is reported lost."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from maintenance import lease

    clock = [1000.0]
    monkeypatch.setattr(lease.time, "monotonic", lambda: clock[0])
    holder = new_holder()
    assert acquire(workspace, holder=holder, now=timezone.now())
    renew = lease.renewer(workspace, holder=holder)
    with CaptureQueriesContext(connection) as queries:
        assert renew()
        clock[0] += lease.RENEW_EVERY / 2
        assert renew()
    assert len([q for q in queries if "UPDATE" in q["sql"]]) == 1
    acquire(workspace, holder="someone else", now=timezone.now() + lease.LEASE_TTL * 2)
    clock[0] += lease.RENEW_EVERY
    assert not renew()
    assert not renew()  # and keeps saying so


def test_a_run_never_touches_another_workspace(workspace, other_workspace, now):
    mine = make(workspace, now, age_days=100)
    theirs = make(other_workspace, now, age_days=100)
    entry_changes.entry_tombstone(
        workspace=other_workspace, entry_id=make(other_workspace, now).pk, now=now - timedelta(days=400)
    )
    before = list(Entry.objects.filter(workspace=other_workspace).order_by("pk").values())
    result = run(workspace, now)
    assert status(mine) == "tombstoned"
    assert status(theirs) == "active"
    assert list(Entry.objects.filter(workspace=other_workspace).order_by("pk").values()) == before
    assert result["counts"]["hard_deleted"] == 0


def test_a_failed_backup_fails_the_run_and_changes_nothing(workspace, now, settings, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    settings.BACKUP_DIR = blocker
    cold = make(workspace, now, age_days=100)
    before = _snapshot(workspace)
    result = run(workspace, now)
    assert result["status"] == "failed"
    assert "backup" in MaintenanceRun.objects.get(pk=result["run_id"]).error
    assert status(cold) == "active"
    assert _snapshot(workspace)[1:] == before[1:]


def test_no_backup_is_written_when_nothing_destructive_happens(workspace, now, settings):
    make(workspace, now)
    result = run(workspace, now)
    assert result["backup_file"] is None


# --- commands -----------------------------------------------------------------------------------


def test_maintain_json_prints_exactly_the_result_object(workspace, now, capsys):
    from io import StringIO

    make(workspace, now, age_days=100)
    out = StringIO()
    call_command("maintain", "--workspace", workspace.slug, "--json", "--dry-run", stdout=out)
    result = json.loads(out.getvalue())
    assert result == MaintenanceRun.objects.get(pk=result["run_id"]).result
    assert result["dry_run"] is True


def test_prune_and_sweep_commands_print_their_shapes(workspace, now):
    from io import StringIO

    make(workspace, now, age_days=100)
    out = StringIO()
    call_command(
        "prune",
        "--workspace",
        workspace.slug,
        "--json",
        "--dry-run",
        "--prune-older-than-days",
        "50",
        "--exclude-tags",
        "a,b",
        stdout=out,
    )
    shaped = json.loads(out.getvalue())
    assert set(shaped) >= {
        "success",
        "archived_count",
        "pruned_count",
        "hard_deleted_count",
        "backup_file",
        "dry_run",
        "run_id",
    }
    run_row = MaintenanceRun.objects.get(pk=shaped["run_id"])
    assert run_row.params["exclude_tags"] == ["a", "b"] and run_row.params["prune_older_than_days"] == 50
    out = StringIO()
    call_command("sweep_decay", "--workspace", workspace.slug, "--json", "--dry-run", stdout=out)
    assert set(json.loads(out.getvalue())) >= {
        "dry_run",
        "candidates_evaluated",
        "evicted",
        "expired",
        "hard_deleted",
        "run_id",
    }


def test_lowering_the_grace_never_purges_before_the_countdown_shown(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now - timedelta(days=2))
    policy(workspace, tombstone_grace_days=1)
    assert run(workspace, now, kind="decay")["counts"]["hard_deleted"] == 0
    assert Tombstone.objects.get(entry_ref=entry.pk).purge_after == now - timedelta(days=2) + timedelta(
        days=180
    )


def test_a_second_run_at_the_same_now_keeps_a_guard_given_by_a_link_the_first_run_ended(workspace, now):
    # C is cold but linked to F; F's writer TTL ends now. Run 1 keeps C (its link was live when
    # the run started) and tombstones F; run 2 at the same `now` must decide exactly the same.
    cold = make(workspace, now, age_days=85)  # cold (retention 0.18) but not yet stale (90 days)
    fading = make(workspace, now, expires_at=now - timedelta(minutes=1))
    relationships.relationship_create(workspace=workspace, from_id=cold.pk, to_id=fading.pk, now=now)
    first = run(workspace, now)
    assert (status(cold), status(fading)) == ("active", "tombstoned")
    assert first["counts"]["expired"] == 1 and first["counts"]["evicted"] == 0
    second = run(workspace, now)
    assert {k: v for k, v in second["counts"].items() if v and k not in ("scored", "orphans")} == {}
    assert status(cold) == "active"
    later = run(workspace, now + timedelta(hours=1))
    assert later["counts"]["evicted"] == 1  # an hour later the link no longer protects it


@pytest.mark.django_db(transaction=True)
def test_a_plan_renews_its_lease_from_a_side_connection(monkeypatch, now, settings, tmp_path):
    """The plan is one transaction, rolled back: a renewal inside it would be rolled back too,
    so it renews from a connection of its own (a plan longer than the lease's TTL keeps the
    lease) — on PostgreSQL, and on SQLite, where the plan reads a copy of the database and
    leaves the write lock to others."""
    import time

    from maintenance import lease, passes
    from tests.helpers_runs import read_aside

    settings.BACKUP_DIR = tmp_path / "backups"
    ws = accounts.workspace_create(slug="long-plan", name="Long plan", review_mode="apply")
    make(ws, now, age_days=400)
    monkeypatch.setattr(lease, "KEEP_ALIVE_EVERY", 0.0)
    seen = []
    original = passes.mark_stale
    sql = "SELECT renewed_at FROM maintenance_maintenancelease WHERE workspace_id = %s"

    def slow(ctx):
        if ctx.planning:
            before = read_aside(sql, [ws.pk])
            time.sleep(0.05)
            ctx.heartbeat()
            seen.append((before, read_aside(sql, [ws.pk])))
        return original(ctx)

    monkeypatch.setattr(passes, "mark_stale", slow)
    result = run_maintenance(workspace=ws, now=now, dry_run=True)
    assert result["status"] == "succeeded"
    assert len(seen) == 1 and seen[0][1] > seen[0][0]


@pytest.mark.django_db(transaction=True)
def test_the_lease_is_renewed_while_the_pre_prune_backup_is_written(monkeypatch, now):
    """The pre-prune backup reads one snapshot (about a minute at 1,000,000 entries, the
    lease's TTL): the lease is renewed from a side connection meanwhile, so a run started
    during the backup finds it held. (SQLite: the same renewal; its tests' in-memory database
    has no second connection to watch it from.)"""
    from django.db import connection, connections

    from maintenance import backups, lease
    from maintenance.models import MaintenanceLease

    if connection.vendor != "postgresql":
        pytest.skip("watched from a second connection: PostgreSQL here")
    ws = accounts.workspace_create(slug="long-backup", name="Long backup", review_mode="apply")
    make(ws, now, age_days=100)
    monkeypatch.setattr(lease, "KEEP_ALIVE_EVERY", 0.0)
    seen = []
    original = backups._write_lines

    def renewed_at():
        side = connections.create_connection("default")
        try:
            with side.cursor() as cursor:
                cursor.execute(
                    "SELECT renewed_at FROM maintenance_maintenancelease WHERE workspace_id = %s", [ws.pk]
                )
                return cursor.fetchone()[0]
        finally:
            side.close()

    def watched_lines(out, workspace, reason, when, progress=None):
        def watched(rows):
            before = renewed_at()
            progress(rows)
            seen.append((before, renewed_at()))

        return original(out, workspace, reason, when, watched if progress else None)

    monkeypatch.setattr(backups, "_write_lines", watched_lines)
    result = run_maintenance(workspace=ws, now=now, force=True)
    assert result["status"] == "succeeded" and result["backup_file"]
    assert seen and all(after > before for before, after in seen)
    assert not MaintenanceLease.objects.filter(workspace=ws).exclude(holder="").exists()


@pytest.mark.django_db(transaction=True)
def test_a_renewal_that_fails_while_the_backup_is_written_does_not_fail_the_run(monkeypatch, now):
    """The side renewal is a courtesy (the run checks its lease itself after the backup): a
    renewal that raises — a busy SQLite, a refused connection — is logged, not raised."""
    from maintenance import lease

    workspace = accounts.workspace_create(slug="broken-renewal", name="Broken renewal", review_mode="apply")
    make(workspace, now, age_days=100)
    monkeypatch.setattr(lease, "KEEP_ALIVE_EVERY", 0.0)
    tried = []

    def broken(side, ws, holder):
        side.close()
        tried.append(holder)
        raise RuntimeError("database is locked")

    monkeypatch.setattr(lease, "_renew_from", broken)
    result = run(workspace, now, force=True)
    assert result["status"] == "succeeded" and result["backup_file"]
    assert tried


def test_a_candidate_that_stops_qualifying_before_its_batch_is_left_alone(workspace, now):
    """The pass reads its candidates' ids first and locks each batch's ids through the whole
    predicate again: an entry an operator pins while earlier batches are applied keeps its
    status (here: pinned between the first batch and the second)."""
    from maintenance import pass_tools, passes
    from memory.policy import PolicyValues

    first, second = (make(workspace, now, age_days=200) for _ in range(2))
    pinned_meanwhile = []

    def renew() -> bool:  # called after each batch
        if not pinned_meanwhile:
            Entry.objects.filter(pk=second.pk).update(pinned=True)
            pinned_meanwhile.append(second.pk)
        return True

    run_row = MaintenanceRun.objects.create(workspace=workspace, kind="decay", trigger="cli", started_at=now)
    ctx = pass_tools.RunContext(
        workspace=workspace, now=now, policy=PolicyValues(), run=run_row, batch_size=1, renew=renew
    )
    passes.score(ctx)
    result = passes.decay(ctx)
    assert result.ids == [first.pk]
    assert (status(first), status(second)) == ("tombstoned", "active")


def test_status_changes_spread_their_batches_on_postgresql_and_results_stay_in_id_order(
    workspace, now, monkeypatch
):
    """On PostgreSQL a batch of status changes takes every n-th candidate, so it changes about
    one row per page and each new row version finds room beside the old one (a HOT update);
    a tombstoning pass, and every pass elsewhere, takes consecutive ids. Either way the pass
    reports its ids, and a decay sweep its rows, in id order."""
    from django.db import connection

    from maintenance import pass_tools, passes
    from memory import lifecycle
    from memory.policy import PolicyValues

    idle = sorted(
        make(workspace, now, age_days=91, updated_at=now - timedelta(days=91), tier="semantic").pk
        for _ in range(6)
    )
    cold = sorted(make(workspace, now, age_days=200).pk for _ in range(6))
    written: list[tuple[str, list[int]]] = []
    original = lifecycle.change_status

    def spy(workspace_id, ids, to_status, *args, **kwargs):
        written.append((to_status, list(ids)))
        return original(workspace_id, ids, to_status, *args, **kwargs)

    def spy_selected(workspace_id, selected, to_status, **kwargs):
        changed = original_selected(workspace_id, selected, to_status, **kwargs)
        written.append((to_status, changed))
        return changed

    original_selected = lifecycle.change_selected
    monkeypatch.setattr(lifecycle, "change_status", spy)
    monkeypatch.setattr(lifecycle, "change_selected", spy_selected)
    run_row = MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="cli", started_at=now)
    values = PolicyValues(cold_threshold=0.0)
    ctx = pass_tools.RunContext(workspace=workspace, now=now, policy=values, run=run_row, batch_size=2)
    passes.score(ctx)
    stale = passes.mark_stale(ctx)
    ctx.policy = PolicyValues()
    decay = passes.decay(ctx)
    marked = [ids for to, ids in written if to == "stale"]
    tombstoned = [ids for to, ids in written if to == "tombstoned"]
    both = sorted(idle + cold)  # both idle for 90 days: marked stale; only episodic decays
    if connection.vendor == "postgresql":
        assert marked == [[both[k], both[k + 6]] for k in range(6)]
    else:
        assert marked == [both[k : k + 2] for k in range(0, 12, 2)]
    assert tombstoned == [cold[0:2], cold[2:4], cold[4:6]]
    assert stale.ids == both
    assert decay.ids == cold and [r["id"] for r in decay.rows] == cold
    assert lifecycle.batches([1, 2, 3, 4, 5], 5) == [[1, 2, 3, 4, 5]]
    assert lifecycle.batches([], 500) == []
    with pytest.raises(ValueError):
        lifecycle.batches([1, 2], 0)
    # Spread within windows of SPREAD_WINDOW batches, never across them.
    many = list(range(1, 2 * 2 * lifecycle.SPREAD_WINDOW + 5))
    split = lifecycle.batches(many, 2)
    assert sorted(i for batch in split for i in batch) == many
    assert all(len(batch) <= 2 and list(batch) == sorted(batch) for batch in split)
    if connection.vendor == "postgresql":
        window = 2 * lifecycle.SPREAD_WINDOW
        assert split[0] == [1, 1 + lifecycle.SPREAD_WINDOW]
        assert all(max(b) - min(b) < window for b in split)
        rest = many[2 * window :]  # the last window: 4 ids in 2 batches
        assert split[-2:] == [rest[0::2], rest[1::2]]
    else:
        assert split == [many[k : k + 2] for k in range(0, len(many), 2)]


def test_only_a_decay_sweep_gathers_the_evicted_and_expired_rows_details(workspace, now, monkeypatch):
    # A full run's result carries no per-row details: at a million entries gathering them kept
    # ~250,000 dicts alive through the run.
    from maintenance import passes

    asked: list[tuple[str, tuple[str, ...]]] = []
    original = passes.tombstone

    def spy(ctx, candidates, reason, **options):
        asked.append((reason, tuple(options.get("detail_fields", ()))))
        return original(ctx, candidates, reason, **options)

    monkeypatch.setattr(passes, "tombstone", spy)
    cold = make(workspace, now, age_days=81)
    run(workspace, now, dry_run=True)
    assert ("decay", ()) in asked and ("ttl", ()) in asked
    assert all(details == () for _, details in asked)
    asked.clear()
    result = run(workspace, now, kind="decay", dry_run=True)
    assert ("decay", passes.DECAY_DETAILS) in asked and ("ttl", passes.TTL_DETAILS) in asked
    assert [e["id"] for e in decay_result(result)["evicted"]] == [cold.pk]


def test_a_transition_records_each_change_from_the_row_before_it_changed(workspace, now):
    # The events and tombstones are written by one INSERT … SELECT from the entries, before
    # their status changes: every column must be what a model instance would have held.
    idle = make(workspace, now, age_days=91, updated_at=now - timedelta(days=91), tier="semantic")
    versioned = make(workspace, now, age_days=81, lineage_id=idle.pk + 1000, content_hash="c" * 64)
    result = run(workspace, now, actor="user:olga")
    run_id = result["run_id"]
    assert status(idle) == "stale" and status(versioned) == "tombstoned"
    event = LifecycleEvent.objects.get(entry=idle, run_id=run_id)
    assert (event.workspace_id, event.entry_ref, event.from_status, event.to_status, event.reason) == (
        workspace.pk,
        idle.pk,
        "active",
        "stale",
        "stale",
    )
    assert (event.actor, event.automatic, event.created_at, event.details, event.reverts_id) == (
        "user:olga",
        True,
        now,
        {},
        None,
    )
    tomb = Tombstone.objects.get(entry=versioned)
    assert (tomb.workspace_id, tomb.entry_ref, tomb.lineage_ref, tomb.content_hash) == (
        workspace.pk,
        versioned.pk,
        idle.pk + 1000,
        "c" * 64,
    )
    assert (tomb.reason, tomb.previous_status, tomb.run_id) == ("decay", "active", run_id)
    assert tomb.actor == "user:olga"
    assert (tomb.created_at, tomb.purge_after, tomb.restored_at, tomb.purged_at) == (
        now,
        now + timedelta(days=180),
        None,
        None,
    )
    evicted = LifecycleEvent.objects.get(entry=versioned, run_id=run_id)
    assert (evicted.from_status, evicted.to_status, evicted.reason) == ("active", "tombstoned", "decay")


# --- the apply walks its plan's ids -----------------------------------------------------------


def test_the_apply_changes_what_its_plan_decided_and_each_row_still_qualifies(workspace, now, monkeypatch):
    """Between the plan and the apply an operator pins an entry the plan marked stale, and
    another entry starts to qualify: the apply leaves both (each batch re-checks the whole rule;
    the ids walked are the plan's). The next run marks the second."""
    from maintenance import runs

    pinned = make(workspace, now, age_days=400, tier="semantic")
    late = make(workspace, now, age_days=400, tier="semantic", updated_at=now)
    stale = make(workspace, now, age_days=400, tier="semantic")
    trips = runs.breaker_trips

    def meanwhile(*args, **kwargs):
        Entry.objects.filter(pk=pinned.pk).update(pinned=True)
        Entry.objects.filter(pk=late.pk).update(updated_at=now - timedelta(days=400))
        return trips(*args, **kwargs)

    monkeypatch.setattr(runs, "breaker_trips", meanwhile)
    result = run(workspace, now, force=True)
    assert result["counts"]["stale_marked"] == 1
    assert (status(pinned), status(late), status(stale)) == ("active", "active", "stale")
    monkeypatch.setattr(runs, "breaker_trips", trips)
    again = run(workspace, now + timedelta(minutes=10))
    assert again["counts"]["stale_marked"] == 1
    assert status(late) == "stale"


def test_graduation_and_link_pruning_apply_their_plans_ids_each_still_qualifying(workspace, now, monkeypatch):
    """Between the plan and the apply: a staged trace the plan graduates loses what made it
    useful, another gains it; a link the plan prunes gets a live end back, another loses its
    last one. The apply changes neither pair (it walks the plan's ids, each re-checked); the
    next run takes the two that qualify now."""
    from maintenance import runs

    policy(workspace, cold_threshold=0.0)

    staged = functools.partial(
        new_entries.entry_create, workspace=workspace, staged_class="procedural", now=now
    )

    planned_trace = staged(content="run migrations before deploy")
    late_trace = staged(content="restart the worker after deploy")
    Entry.objects.filter(pk=planned_trace.pk).update(reinforced_at=now)
    a = make(workspace, now, status="archived", archived_at=now)
    b = make(workspace, now, status="archived", archived_at=now)
    c = make(workspace, now, status="archived", archived_at=now)
    d = make(workspace, now)
    link = functools.partial(relationships.relationship_create, workspace=workspace, now=now)
    planned_link, _ = link(from_id=a.pk, to_id=b.pk)
    late_link, _ = link(from_id=c.pk, to_id=d.pk)
    trips = runs.breaker_trips

    def meanwhile(*args, **kwargs):
        Entry.objects.filter(pk=planned_trace.pk).update(reinforced_at=None)
        Entry.objects.filter(pk=late_trace.pk).update(reinforced_at=now)
        Entry.objects.filter(pk=b.pk).update(status="active")
        Entry.objects.filter(pk=d.pk).update(status="archived", archived_at=now)
        return trips(*args, **kwargs)

    monkeypatch.setattr(runs, "breaker_trips", meanwhile)
    result = run(workspace, now, force=True)

    assert (result["counts"]["staged_graduated"], result["counts"]["links_pruned"]) == (0, 0)
    assert (status(planned_trace), status(late_trace)) == ("staged", "staged")
    pruned = Relationship.objects.filter(pk__in=[planned_link.pk, late_link.pk], pruned_at__isnull=False)
    assert not pruned.exists()
    monkeypatch.setattr(runs, "breaker_trips", trips)
    again = run(workspace, now + timedelta(minutes=10))
    assert (again["counts"]["staged_graduated"], again["counts"]["links_pruned"]) == (1, 1)
    assert status(late_trace) == "active"
    assert Relationship.objects.get(pk=late_link.pk).pruned_at is not None
