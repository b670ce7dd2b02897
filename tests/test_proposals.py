"""Operator approval and holds at the service level: a propose-mode run
changes no archive or tombstone and proposes exactly what an apply-mode dry run would do;
approve re-checks and applies as a run would; reject and every corrective decision hold the
entry, and no automatic run undoes a held entry — over simulated weeks, through the scheduler
and the CLI too."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from maintenance import hygiene_actions, proposals, revert
from maintenance.models import Backup, MaintenanceRun, Proposal
from maintenance.run_start import run_maintenance
from maintenance.tasks import run_scheduled
from memory import entry_changes, entry_signals, journal_export, new_entries, relationships
from memory.errors import Conflict, InvalidInput
from memory.models import Entry, LifecycleEvent
from memory.models.choices import Status
from memory.policy_model import MaintenancePolicy
from tests.helpers_scores import set_scores

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def policy(workspace, **values):
    row = MaintenancePolicy.objects.get(workspace=workspace)
    for k, v in values.items():
        setattr(row, k, v)
    row.save()


def make(workspace, *, age_days=200.0, content=None, **fields):
    """An entry created ``age_days`` before NOW (cold after ~80 days unused); extra fields are
    set straight on the row."""
    at = NOW - timedelta(days=age_days)
    entry = new_entries.entry_create(
        workspace=workspace,
        content=content or f"memory {Entry.objects.count()} about caching, retries and queues",
        created_at=at,
        now=at,
    )
    if fields:
        Entry.objects.filter(pk=entry.pk).update(**fields)
    entry.refresh_from_db()
    return entry


def status(entry) -> str:
    return Entry.objects.get(pk=entry.pk).status


def run(workspace, now=NOW, **kwargs):
    return run_maintenance(workspace=workspace, now=now, **kwargs)


def open_ids(workspace, reason=None) -> list[int]:
    return sorted(proposals.open_set(workspace, reason=reason).values_list("entry_ref", flat=True))


def snapshot(workspace) -> dict[int, dict[str, Any]]:
    return {
        row["pk"]: row
        for row in Entry.objects.filter(workspace=workspace).values(
            "pk", "status", "is_latest", "content", "title", "pinned", "archived_at", "entry_type"
        )
    }


# --- holds -----------------------------------------------------------------------------------


def test_a_restored_entry_survives_scheduled_and_cli_runs_for_weeks(workspace):
    entry = make(workspace)
    assert run(workspace)["counts"]["evicted"] == 1
    assert status(entry) == Status.TOMBSTONED
    entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, actor="user:ops", now=NOW)
    restored = Entry.objects.get(pk=entry.pk)
    assert (restored.status, restored.hold_reason, restored.held_by) == (Status.ACTIVE, "restore", "user:ops")
    for day in (1, 3, 10, 30):
        with time_machine.travel(NOW + timedelta(days=day), tick=False):
            scheduled = run_scheduled(workspace.pk, "decay")
            call_command("maintain", "--workspace", workspace.slug, "--json")
        assert scheduled is not None and scheduled["counts"]["held_skipped"] == 1
        assert status(entry) == Status.ACTIVE
    last = MaintenanceRun.objects.filter(workspace=workspace, kind="full").latest("pk")
    assert last.counts["held_skipped"] == 1 and last.counts["evicted"] == 0


def test_a_whole_run_reverted_stays_reverted_through_30_days_of_decay_sweeps(workspace):
    cold = [make(workspace, age_days=150 + i) for i in range(6)]
    fresh = make(workspace, age_days=1)
    first = run(workspace)
    assert sorted(first["affected"]["tombstoned"]) == sorted(e.pk for e in cold)
    result = revert.revert_run(workspace, first["run_id"], actor="user:ops", now=NOW)
    assert result["reverted"] == sorted(e.pk for e in cold)
    for day in range(1, 31):
        sweep = run(workspace, NOW + timedelta(days=day), kind="decay")
        assert sweep["counts"]["evicted"] == 0
        assert sweep["counts"]["held_skipped"] == len(cold)
    # Back where the run found them (stale marking had come first), and live.
    assert {status(e) for e in cold} == {Status.STALE}
    assert status(fresh) == Status.ACTIVE  # 31 days old: still warm


def test_a_held_entry_with_an_expired_ttl_stays(workspace):
    entry = make(workspace, age_days=1, expires_at=NOW - timedelta(days=5))
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=NOW - timedelta(days=1))
    entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, actor="user:ops", now=NOW)
    result = run(workspace, NOW + timedelta(hours=1))
    assert result["counts"]["expired"] == 0 and result["counts"]["held_skipped"] == 1
    assert status(entry) == Status.ACTIVE
    # Without the hold the writer's TTL is honoured again.
    entry_changes.entry_release(workspace=workspace, entry_id=entry.pk, actor="user:ops", now=NOW)
    assert run(workspace, NOW + timedelta(hours=2))["counts"]["expired"] == 1


def test_a_new_version_of_a_held_entry_is_not_held(workspace):
    entry = make(workspace)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=NOW)
    entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, actor="user:ops", now=NOW)
    updated = entry_changes.entry_update(
        workspace=workspace, entry_id=entry.pk, content="rewritten: the queue retries three times", now=NOW
    )
    assert updated.new_version
    assert (updated.entry.held_at, updated.entry.held_by, updated.entry.hold_reason) == (None, "", "")
    assert Entry.objects.get(pk=entry.pk).held_at is not None  # the old version keeps its record
    assert run(workspace, NOW + timedelta(days=200))["counts"]["evicted"] == 1


def test_a_field_change_in_place_keeps_the_hold(workspace):
    entry = make(workspace)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=NOW)
    entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, actor="user:ops", now=NOW)
    entry_changes.entry_update(workspace=workspace, entry_id=entry.pk, title="renamed", now=NOW)
    assert Entry.objects.get(pk=entry.pk).hold_reason == "restore"


def test_a_hold_expires_after_operator_hold_days(workspace):
    entry = make(workspace)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=NOW)
    entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, actor="user:ops", now=NOW)
    policy(workspace, operator_hold_days=7)
    assert run(workspace, NOW + timedelta(days=6))["counts"]["evicted"] == 0
    assert status(entry) == Status.ACTIVE
    assert run(workspace, NOW + timedelta(days=8))["counts"]["evicted"] == 1


def test_release_ends_the_hold_and_records_who_had_held_it(workspace):
    entry = make(workspace)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=NOW)
    entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, actor="user:ops", now=NOW)
    released = entry_changes.entry_release(workspace=workspace, entry_id=entry.pk, actor="user:lead", now=NOW)
    assert released.held_at is None
    event = LifecycleEvent.objects.filter(entry=entry, reason="release").get()
    assert event.actor == "user:lead" and event.from_status == event.to_status == Status.ACTIVE
    assert event.details["held_by"] == "user:ops" and event.details["hold_reason"] == "restore"
    with pytest.raises(Conflict):
        entry_changes.entry_release(workspace=workspace, entry_id=entry.pk, actor="user:lead", now=NOW)


def test_release_of_another_workspaces_entry_is_not_found(workspace, other_workspace):
    from memory.errors import NotFound

    theirs = make(other_workspace)
    with pytest.raises(NotFound):
        entry_changes.entry_release(workspace=workspace, entry_id=theirs.pk, actor="user:ops")


def test_keep_and_a_dispute_resolved_in_favour_hold_the_entries(workspace):
    from maintenance import contradictions
    from maintenance.models import Dispute

    kept = make(workspace, age_days=1)
    hygiene_actions.keep(workspace, [kept.pk], actor="user:ops", now=NOW)
    assert Entry.objects.get(pk=kept.pk).hold_reason == "keep"
    a = make(workspace, age_days=1, content="always run the migrations before deploying the web tier")
    b = make(workspace, age_days=1, content="never run the migrations before deploying the web tier")
    dispute = Dispute.objects.create(workspace=workspace, entry_a=a, entry_b=b, detected_by="sweep")
    contradictions.resolve(workspace, dispute.pk, "keep_second", actor="user:ops", now=NOW)
    assert Entry.objects.get(pk=b.pk).hold_reason == "dispute"
    assert Entry.objects.get(pk=a.pk).held_at is None


def test_stale_marking_and_archiving_skip_held_entries(workspace):
    policy(workspace, stale_after_days=30)
    entry = make(workspace, age_days=40, tier="semantic")  # not episodic: decay leaves it alone
    hygiene_actions.keep(workspace, [entry.pk], actor="user:ops", now=NOW)
    result = run(workspace)
    assert result["counts"]["stale_marked"] == 0 and result["counts"]["held_skipped"] == 1
    assert status(entry) == Status.ACTIVE


# --- propose mode ----------------------------------------------------------------------------


def _mixed_workspace(workspace):
    """Entries that every proposing pass and the applied passes act on."""
    policy(workspace, prune_older_than_days=300, archive_older_than_days=250, stale_after_days=30)
    made = {
        "cold": [make(workspace, age_days=120 + i) for i in range(4)],
        "old": [make(workspace, age_days=400 + i, tier="semantic") for i in range(3)],
        "ttl": make(workspace, age_days=2, expires_at=NOW - timedelta(hours=1)),
        "stale_soon": make(workspace, age_days=40, tier="procedural"),
        "fresh": make(workspace, age_days=1),
        "staged": make(
            workspace,
            age_days=10,
            status=Status.STAGED,
            staged_class="evidence",
            ttl_expires_at=NOW - timedelta(days=1),
        ),
    }
    gone = make(workspace, age_days=1)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk, now=NOW - timedelta(days=400))
    made["past_grace"] = gone
    return made


def test_a_propose_mode_dry_run_reports_every_count_and_id_its_real_run_then_makes(propose_workspace):
    """A dry run in propose mode reports what the real run at the same ``now`` reports: the
    proposals (as if applied, the counts a real run would have), and what the passes that still
    apply do with the proposals not applied — the orphans, links and purges among them. It
    used to count orphans as if the proposals had been applied (the demo: 225 against 294)."""
    _mixed_workspace(propose_workspace)

    dry = run(propose_workspace, dry_run=True)
    real = run(propose_workspace)

    assert dry["status"] == real["status"] == "proposed"
    assert dry["counts"] == real["counts"]
    assert real["counts"]["evicted"] >= 2 and real["counts"]["orphans"] > 0
    assert dry["affected"] == real["affected"]


def test_a_propose_mode_dry_runs_second_plan_repeats_the_first_plans_stale_marks(
    propose_workspace, monkeypatch
):
    from maintenance import pass_tools

    _mixed_workspace(propose_workspace)
    policy(propose_workspace, stale_after_days=30)
    seen: list[tuple[str, list[int] | None]] = []
    planned_transition = pass_tools._planned_transition

    def spy(ctx, candidates, *, to_status, detail_fields, ids=None):
        read = sorted(candidates.values_list("pk", flat=True))  # what reading them again finds
        found = planned_transition(ctx, candidates, to_status=to_status, detail_fields=detail_fields, ids=ids)
        seen.append((to_status, None if ids is None else list(ids)))
        assert to_status != Status.STALE or found.ids == read
        return found

    monkeypatch.setattr(pass_tools, "_planned_transition", spy)
    dry = run(propose_workspace, dry_run=True)

    stale = [ids for to_status, ids in seen if to_status == Status.STALE]
    assert dry["counts"]["stale_marked"] > 0 and len(stale) == 2
    real = run(propose_workspace)
    marked = LifecycleEvent.objects.filter(run_id=real["run_id"], to_status=Status.STALE)
    assert stale[0] is None and stale[1] == sorted(marked.values_list("entry_id", flat=True))


def test_a_propose_mode_run_proposes_exactly_what_an_apply_mode_dry_run_would_do(
    workspace, propose_workspace
):
    _mixed_workspace(workspace)
    _mixed_workspace(propose_workspace)
    dry = run(workspace, dry_run=True)
    assert dry["status"] == "succeeded"
    before = snapshot(propose_workspace)
    exported_before = list(journal_export.export_records(propose_workspace))

    result = run(propose_workspace)

    assert result["status"] == "proposed"
    proposing = (
        "staged_expired",
        "archived",
        "low_quality_archived",
        "consolidated",
        "pruned",
        "evicted",
        "expired",
        "reclaimed",
    )
    assert {k: result["counts"][k] for k in proposing} == {k: dry["counts"][k] for k in proposing}
    assert sum(dry["counts"][k] for k in proposing) > 5
    # Ids: the proposals are the dry run's ids, mapped across the two identical workspaces.
    offset = min(Entry.objects.filter(workspace=propose_workspace).values_list("pk", flat=True)) - min(
        Entry.objects.filter(workspace=workspace).values_list("pk", flat=True)
    )
    by_action = {
        "archive": sorted(i + offset for i in dry["affected"]["archived"]),
        "tombstone": sorted(i + offset for i in dry["affected"]["tombstoned"]),
    }
    for action, ids in by_action.items():
        assert (
            sorted(proposals.open_set(propose_workspace, action=action).values_list("entry_ref", flat=True))
            == ids
        )
        assert result["affected"]["proposed"][action] == ids
    assert result["affected"]["archived"] == result["affected"]["tombstoned"] == []
    # Nothing was archived or tombstoned; what propose mode still applies did (stale marks, the purge).
    after = snapshot(propose_workspace)
    assert set(after) == set(before) - set(result["affected"]["purged"])
    for pk, row in after.items():
        old = before[pk]
        if old["status"] == Status.ACTIVE and row["status"] == Status.STALE:
            continue  # stale marking applies in propose mode
        assert row == old, pk
    assert result["counts"]["hard_deleted"] == 1 and result["counts"]["stale_marked"] >= 1
    exported_after = list(journal_export.export_records(propose_workspace))
    strip = ("status", "importance", "retention")
    assert [{k: v for k, v in r.items() if k not in strip} for r in exported_after] == [
        {k: v for k, v in r.items() if k not in strip} for r in exported_before
    ]


def test_proposals_carry_their_deciding_values_in_words(propose_workspace):
    entry = make(propose_workspace, age_days=412)
    run(propose_workspace)
    proposal = Proposal.objects.get(entry_ref=entry.pk)
    assert proposal.action == "tombstone" and proposal.reason == "evicted"
    assert proposal.values["retention"] < 0.2 and proposal.values["age_days"] == 412.0
    assert proposal.why.startswith("retention 0.00 < 0.20, never accessed, 412 days old")


def test_a_newer_run_confirms_supersedes_and_adds_without_duplicates(propose_workspace):
    first_cold = [make(propose_workspace, age_days=150 + i) for i in range(3)]
    first = run(propose_workspace)
    assert open_ids(propose_workspace) == sorted(e.pk for e in first_cold)
    entry_signals.entry_record_access(
        workspace=propose_workspace, entry_id=first_cold[0].pk, actor="agent", now=NOW
    )
    newly_cold = make(propose_workspace, age_days=100)
    second = run(propose_workspace, NOW + timedelta(minutes=10), kind="decay")
    assert second["status"] == "proposed"
    assert open_ids(propose_workspace) == sorted([first_cold[1].pk, first_cold[2].pk, newly_cold.pk])
    assert Proposal.objects.filter(entry_ref=first_cold[0].pk).get().status == "superseded"
    assert set(Proposal.objects.filter(status="open").values_list("run_id", flat=True)) == {second["run_id"]}
    assert Proposal.objects.count() == 4
    assert first["run_id"] != second["run_id"]


def test_a_confirmation_moves_the_proposal_and_keeps_the_values_that_first_decided_it(propose_workspace):
    entry = make(propose_workspace, age_days=412)
    first = run(propose_workspace)
    before = Proposal.objects.get(entry_ref=entry.pk)

    second = run(propose_workspace, NOW + timedelta(days=3), kind="decay")

    after = Proposal.objects.get(entry_ref=entry.pk)
    assert after.pk == before.pk and after.status == "open"
    assert after.run_id == second["run_id"] != first["run_id"]
    # What decided it first, and when: a sweep every 10 minutes rewrote every open proposal.
    assert (after.values, after.why, after.created_at) == (before.values, before.why, before.created_at)
    assert after.why.startswith("retention 0.00 < 0.20, never accessed, 412 days old")


def test_a_proposal_another_pass_makes_again_takes_that_pass_and_its_values(propose_workspace):
    entry = make(propose_workspace, age_days=412)
    run(propose_workspace)
    assert Proposal.objects.get(entry_ref=entry.pk).reason == "evicted"
    # Read since (no longer cold), and its writer's TTL has passed: the TTL pass tombstones it.
    entry_signals.entry_record_access(workspace=propose_workspace, entry_id=entry.pk, actor="agent", now=NOW)
    expires = NOW + timedelta(hours=12)
    Entry.objects.filter(pk=entry.pk).update(expires_at=expires)

    later = run(propose_workspace, NOW + timedelta(days=1))

    proposal = Proposal.objects.get(entry_ref=entry.pk, status="open")
    assert proposal.run_id == later["run_id"] and proposal.reason == "expired"
    assert proposal.values == {"expires_at": expires.isoformat()}
    assert proposal.created_at == NOW + timedelta(days=1)  # what its values are of
    assert Proposal.objects.filter(entry_ref=entry.pk).count() == 1


@pytest.mark.parametrize("part", [1, 2])
def test_proposals_recorded_in_parts_of_any_size_come_out_the_same(propose_workspace, monkeypatch, part):
    """``proposals.record`` reads and writes a part of the proposed entries at a time (flat
    memory at a million entries): confirming, superseding and adding across parts."""
    monkeypatch.setattr(proposals, "RECORD_PART", part)
    test_a_newer_run_confirms_supersedes_and_adds_without_duplicates(propose_workspace)


def test_a_run_supersedes_more_open_proposals_than_a_statement_takes_parameters(propose_workspace):
    """70,000 open proposals (more than the 65,535 parameters PostgreSQL takes in a statement)
    that a new run no longer makes are superseded. The next propose-mode run
    at 1,000,000 generated entries failed so ("number of parameters must be between 0 and
    65535"): the open set's ids went into one IN list."""
    from maintenance.run_results import Outcome

    first, second = (MaintenanceRun.objects.create(workspace=propose_workspace, kind="full") for _ in "ab")
    n = 70_000
    with connection.cursor() as cursor:  # entries long gone (entry unset), proposals still open
        cursor.execute(
            "WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < %s) "
            'INSERT INTO maintenance_proposal (workspace_id, run_id, entry_ref, action, reason, "values", '
            "why, status, created_at, decided_by, note) "
            "SELECT %s, %s, 1000000 + i, 'tombstone', 'evicted', '{}', '', 'open', %s, '', '' FROM seq",
            [n, propose_workspace.pk, first.pk, NOW],
        )
    plan = Outcome()
    plan.ids["evicted"] = []

    made = proposals.record(
        second, plan, keys=["evicted"], policy=MaintenancePolicy.for_workspace(propose_workspace), now=NOW
    )

    assert made == 0
    assert Proposal.objects.filter(workspace=propose_workspace, status="superseded").count() == n
    assert not proposals.open_proposals(propose_workspace).exists()


def test_a_decay_sweep_leaves_a_full_runs_archive_proposals_open(propose_workspace):
    policy(propose_workspace, archive_older_than_days=100)
    old = make(propose_workspace, age_days=200, tier="semantic")
    run(propose_workspace)
    assert open_ids(propose_workspace, "archived") == [old.pk]
    run(propose_workspace, NOW + timedelta(minutes=10), kind="decay")
    assert open_ids(propose_workspace, "archived") == [old.pk]


def test_approving_a_selection_changes_exactly_those_entries(propose_workspace):
    cold = [make(propose_workspace, age_days=150 + i) for i in range(5)]
    result = run(propose_workspace)
    chosen = [cold[0].pk, cold[3].pk]
    done = proposals.approve(propose_workspace, ids=chosen, actor="user:ops", now=NOW)
    assert done["applied"] == sorted(chosen) and done["skipped"] == []
    assert done["backup_file"] and Backup.objects.filter(workspace=propose_workspace).count() == 1
    assert [status(e) for e in cold] == ["tombstoned", "stale", "stale", "tombstoned", "stale"]
    assert open_ids(propose_workspace) == sorted(e.pk for e in cold if e.pk not in chosen)
    event = LifecycleEvent.objects.get(entry_id=cold[0].pk, to_status="tombstoned")
    assert (event.actor, event.automatic, event.run_id) == ("user:ops", True, result["run_id"])
    # Revertible like any change: one entry, or the proposing run as a whole.
    assert revert.revert_run(propose_workspace, result["run_id"], actor="user:ops")["reverted"] == sorted(
        chosen
    )


def test_approve_all_of_a_reason_leaves_the_other_reasons_open(propose_workspace):
    policy(propose_workspace, archive_older_than_days=100)
    old = make(propose_workspace, age_days=200, tier="semantic")
    cold = make(propose_workspace, age_days=95)  # cold, but younger than archive_older_than_days
    run(propose_workspace)
    done = proposals.approve(propose_workspace, all=True, reason="archived", actor="user:ops", now=NOW)
    assert done["applied"] == [old.pk] and done["backup_file"] is None  # archiving writes no backup
    assert status(old) == Status.ARCHIVED and status(cold) == Status.STALE
    assert open_ids(propose_workspace) == [cold.pk]


def test_approving_after_the_data_moved_skips_with_why(propose_workspace):
    accessed, pinned, held, fine = (make(propose_workspace, age_days=150 + i) for i in range(4))
    run(propose_workspace)
    later = NOW + timedelta(hours=1)
    entry_signals.entry_record_access(
        workspace=propose_workspace, entry_id=accessed.pk, actor="agent", now=later
    )
    Entry.objects.filter(pk=pinned.pk).update(pinned=True)
    hygiene_actions.keep(propose_workspace, [held.pk], actor="user:other", now=later)
    done = proposals.approve(propose_workspace, all=True, actor="user:ops", now=later)
    assert done["applied"] == [fine.pk]
    why = {s["id"]: s["why"] for s in done["skipped"]}
    assert set(why) == {accessed.pk, pinned.pk, held.pk}
    assert "accessed since" in why[accessed.pk]
    assert "pinned" in why[pinned.pk]
    assert why[held.pk].startswith("held by user:other")
    assert {status(e) for e in (accessed, pinned, held)} <= {Status.ACTIVE, Status.STALE}
    assert Proposal.objects.filter(entry_ref=accessed.pk).get().status == "skipped"


def test_approve_past_the_breaker_needs_force(propose_workspace):
    cold = [make(propose_workspace, age_days=150 + i) for i in range(30)]
    warm = [make(propose_workspace, age_days=1) for _ in range(5)]
    result = run(propose_workspace)
    assert result["status"] == "proposed" and result["breaker"]["would_trip"]
    with pytest.raises(Conflict, match="circuit breaker"):
        proposals.approve(propose_workspace, all=True, actor="user:ops", now=NOW)
    assert {status(e) for e in cold} == {Status.STALE}
    assert not Backup.objects.filter(workspace=propose_workspace).exists()
    done = proposals.approve(propose_workspace, all=True, force=True, actor="user:ops", now=NOW)
    assert len(done["applied"]) == 30 and {status(e) for e in warm} == {Status.ACTIVE}


def test_approve_waits_for_a_running_run(propose_workspace):
    from maintenance import lease

    make(propose_workspace)
    run(propose_workspace)
    assert lease.acquire(propose_workspace, holder="someone", now=datetime.now(UTC))
    with pytest.raises(Conflict, match="maintenance run"):
        proposals.approve(propose_workspace, all=True, actor="user:ops")


def test_reject_closes_the_proposal_and_holds_the_entry(propose_workspace):
    entry = make(propose_workspace)
    other = make(propose_workspace, age_days=151)
    run(propose_workspace)
    done = proposals.reject(propose_workspace, ids=[entry.pk, 999_999], actor="user:ops", now=NOW)
    assert done["rejected"] == [entry.pk]
    assert done["skipped"] == [{"id": 999_999, "why": "no open proposal for this entry"}]
    row = Entry.objects.get(pk=entry.pk)
    assert (row.hold_reason, row.held_by) == ("reject", "user:ops")
    again = run(propose_workspace, NOW + timedelta(days=1))
    assert open_ids(propose_workspace) == [other.pk]
    assert again["counts"]["held_skipped"] == 1 and again["counts"]["evicted"] == 1


def test_bad_approve_arguments_are_refused_before_anything(propose_workspace, other_workspace):
    theirs = make(other_workspace)
    make(propose_workspace)
    run(propose_workspace)
    with pytest.raises(InvalidInput):
        proposals.approve(propose_workspace, actor="x")
    with pytest.raises(InvalidInput):
        proposals.approve(propose_workspace, ids=[1], all=True, actor="x")
    with pytest.raises(InvalidInput):
        proposals.approve(propose_workspace, ids=["1"], actor="x")
    with pytest.raises(InvalidInput):
        proposals.approve(propose_workspace, all=True, reason="nope", actor="x")
    done = proposals.approve(propose_workspace, ids=[theirs.pk], actor="x")
    assert done["applied"] == [] and done["skipped"][0]["id"] == theirs.pk
    assert status(theirs) == Status.ACTIVE


def test_compaction_and_low_quality_proposals_apply_through_their_own_passes(propose_workspace):
    policy(propose_workspace, consolidation_min_group=3)
    fragments = [
        make(
            propose_workspace,
            age_days=20,
            content=f"step {i} of the migration work went fine today",
            entry_type="development_note",
            session_key="s-1",
        )
        for i in range(4)
    ]
    junk = make(propose_workspace, age_days=40, content="implementation plan ...")
    result = run(propose_workspace)
    assert result["counts"]["consolidated"] == 4 and result["counts"]["summaries_created"] == 1
    assert result["counts"]["low_quality_archived"] == 1
    assert not Entry.objects.filter(workspace=propose_workspace, entry_type="retrospective").exists()
    done = proposals.approve(propose_workspace, all=True, actor="user:ops", now=NOW)
    assert sorted(done["applied"]) == sorted([*(f.pk for f in fragments), junk.pk])
    summary = Entry.objects.get(workspace=propose_workspace, entry_type="retrospective")
    assert summary.links_out.count() == 4
    assert {status(f) for f in fragments} == {Status.ARCHIVED} and status(junk) == Status.ARCHIVED


# --- found by review: each failed before its fix -----------------------------------------------


def test_a_prune_runs_proposals_are_approved_under_the_prunes_own_parameters(propose_workspace):
    old = [make(propose_workspace, age_days=400 + i, tier="semantic") for i in range(3)]
    result = run(propose_workspace, kind="prune", params={"prune_older_than_days": 300})
    assert result["status"] == "proposed" and open_ids(propose_workspace, "pruned") == [e.pk for e in old]
    done = proposals.approve(propose_workspace, all=True, actor="user:ops", now=NOW)
    assert done["applied"] == [e.pk for e in old] and done["skipped"] == []


def test_an_entry_held_while_a_run_works_is_not_proposed(propose_workspace, monkeypatch):
    from maintenance import runs

    entry = make(propose_workspace)
    real = runs.proposals.record

    def reject_first(run_row, plan, **kwargs):
        hygiene_actions.keep(propose_workspace, [entry.pk], actor="user:ops", now=NOW)  # mid-run decision
        return real(run_row, plan, **kwargs)

    monkeypatch.setattr(runs.proposals, "record", reject_first)
    run(propose_workspace)
    assert open_ids(propose_workspace) == []


def test_a_propose_mode_run_whose_backup_fails_changes_nothing(propose_workspace, monkeypatch):
    from maintenance import backups

    policy(propose_workspace, stale_after_days=30)
    staling = make(propose_workspace, age_days=40, tier="semantic")
    gone = make(propose_workspace, age_days=1)
    entry_changes.entry_tombstone(
        workspace=propose_workspace, entry_id=gone.pk, now=NOW - timedelta(days=400)
    )

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(backups, "write_backup", broken)
    result = run(propose_workspace)
    assert result["status"] == "failed"
    assert status(staling) == Status.ACTIVE and status(gone) == Status.TOMBSTONED
    assert not LifecycleEvent.objects.filter(entry=staling, to_status="stale").exists()


def test_a_propose_mode_run_backs_up_only_for_links_gone_before_it(propose_workspace):
    a, b = (make(propose_workspace, age_days=200, tier="semantic") for _ in range(2))
    relationships.relationship_create(workspace=propose_workspace, from_id=a.pk, to_id=b.pk, now=NOW)
    stale_since = NOW - timedelta(days=200)
    Entry.objects.filter(pk__in=[a.pk, b.pk]).update(status="stale", status_changed_at=stale_since)

    # Its plan archives both (what it proposes) and prunes their link; the run itself prunes
    # nothing and purges nothing: no backup (it wrote one for every such plan).
    proposing = run(propose_workspace)
    assert proposing["status"] == "proposed"
    assert open_ids(propose_workspace, "archived") == sorted([a.pk, b.pk])
    assert proposing["counts"]["links_pruned"] == 0 and proposing["backup_file"] is None

    # Both ends archived by hand since: the next run prunes the link, after its backup.
    Entry.objects.filter(pk__in=[a.pk, b.pk]).update(status="archived", archived_at=NOW)
    pruning = run(propose_workspace, NOW + timedelta(minutes=5))
    assert pruning["counts"]["links_pruned"] == 1 and pruning["backup_file"]
    assert Backup.objects.filter(file_name=pruning["backup_file"]).exists()


def test_an_approval_whose_backup_fails_changes_nothing(propose_workspace, monkeypatch):
    from maintenance import backups

    policy(propose_workspace, archive_older_than_days=100)
    old = make(propose_workspace, age_days=200, tier="semantic")
    cold = make(propose_workspace, age_days=95)
    run(propose_workspace)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(backups, "write_backup", broken)
    with pytest.raises(OSError):
        proposals.approve(propose_workspace, all=True, actor="user:ops", now=NOW)
    assert status(old) == Status.STALE and status(cold) == Status.STALE
    assert open_ids(propose_workspace) == sorted([old.pk, cold.pk])


def test_explaining_skipped_proposals_costs_no_query_per_entry(
    propose_workspace, django_assert_max_num_queries
):
    cold = [make(propose_workspace, age_days=150 + i) for i in range(30)]
    run(propose_workspace)
    set_scores([e.pk for e in cold], retention=0.9)  # warm again
    policy(propose_workspace, exclude_tags=["keep"])
    with django_assert_max_num_queries(30):
        done = proposals.approve(propose_workspace, all=True, actor="user:ops", now=NOW)
    assert len(done["skipped"]) == 30


def test_a_prune_run_leaves_the_full_runs_stale_archive_proposals_open(propose_workspace):
    stale = make(
        propose_workspace,
        age_days=400,
        tier="semantic",
        status=Status.STALE,
        status_changed_at=NOW - timedelta(days=200),
        importance=0.9,
    )
    run(propose_workspace)
    assert open_ids(propose_workspace, "archived") == [stale.pk]
    run(propose_workspace, NOW + timedelta(minutes=5), kind="prune")
    assert open_ids(propose_workspace, "archived") == [stale.pk]


def test_a_held_fragment_of_a_group_too_small_to_compact_is_not_counted_as_skipped(workspace):
    note = make(workspace, age_days=20, entry_type="development_note", session_key="s-9", tier="semantic")
    hygiene_actions.keep(workspace, [note.pk], actor="user:ops", now=NOW)
    assert run(workspace)["counts"]["held_skipped"] == 0


def test_a_held_fragment_of_a_compacted_group_is_counted_as_skipped(workspace):
    """Compaction reads a group's fragments by the ids its count returns on PostgreSQL; the held
    fragment is not among those, and still counts as skipped, in the dry run and the real one."""
    notes = [
        make(workspace, age_days=20, entry_type="development_note", session_key="s-7", tier="semantic")
        for _ in range(12)
    ]
    hygiene_actions.keep(workspace, [notes[0].pk], actor="user:ops", now=NOW)
    dry = run(workspace, dry_run=True)
    real = run(workspace)
    for result in (dry, real):
        assert result["counts"]["consolidated"] == 11 and result["counts"]["held_skipped"] == 1
    assert Entry.objects.get(pk=notes[0].pk).status == Status.ACTIVE


# A pass's read of the held entries among its candidates: its rule without the hold, then the
# hold (``pass_tools.held_only``); the question whether the workspace has any hold at all.
HELD_READ = re.compile(r'"pinned"\)+ AND "memory_entry"\."held_at" IS NOT NULL')
ANY_HELD = re.compile(r'"held_at" IS NOT NULL\) LIMIT 1')


def _count(pattern: re.Pattern[str], queries) -> int:
    return sum(bool(pattern.search(q["sql"])) for q in queries)


def test_a_workspace_without_holds_is_asked_once_per_phase_instead_of_per_pass(workspace):
    """Each pass read its candidates a second time for the held ones among them (~5 more
    reads of a million entries per phase): a workspace without a hold is now asked once per
    phase, and counts the same."""
    cold = [make(workspace, age_days=300) for _ in range(3)]
    with CaptureQueriesContext(connection) as plain:
        dry = run(workspace, dry_run=True)
    assert dry["counts"]["evicted"] == 3 and dry["counts"]["held_skipped"] == 0
    assert _count(ANY_HELD, plain.captured_queries) == 1
    assert _count(HELD_READ, plain.captured_queries) == 0

    hygiene_actions.keep(workspace, [cold[0].pk], actor="user:ops", now=NOW)
    with CaptureQueriesContext(connection) as held:
        real = run(workspace)
    assert real["counts"]["evicted"] == 2 and real["counts"]["held_skipped"] == 1
    assert status(cold[0]) == Status.ACTIVE
    # Plan and apply: asked once each, then every pass reads its held entries.
    assert _count(ANY_HELD, held.captured_queries) == 2
    assert _count(HELD_READ, held.captured_queries) >= 2
