"""``manage.py proposals`` and ``manage.py release``: the open proposal set
listed with excerpts and deciding values, approved and rejected from the command line, refusals
as messages with a non-zero exit, and one real process."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from maintenance import proposals
from maintenance.models import MaintenanceLease, Proposal
from maintenance.run_start import run_maintenance
from memory import entry_changes, entry_signals, holds, new_entries
from memory.models import Entry, LifecycleEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def now():
    # The commands decide at the real clock: the entries are aged relative to it.
    return timezone.now()


def make(workspace, now, *, age_days=0.0, content=None, **fields):
    entry = new_entries.entry_create(
        workspace=workspace,
        content=content or f"note {Entry.objects.count()} about the retry budget of the cache layer",
        created_at=now - timedelta(days=age_days),
        now=now - timedelta(days=age_days),
        **fields,
    )
    entry.refresh_from_db()
    return entry


def cold(workspace, now, n):
    """Episodic entries old enough to decay: proposals to tombstone (reason evicted)."""
    return [
        make(workspace, now, age_days=200, content=f"cold note {i} on how the cache retried the upload")
        for i in range(n)
    ]


def junk(workspace, now, n):
    """Semantic (never decayed) fragments hygiene recommends archiving: low_quality_archived."""
    return [make(workspace, now, age_days=40, content=f"half done {i}...", tier="semantic") for i in range(n)]


def propose_run(workspace, now):
    result = run_maintenance(workspace=workspace, now=now)
    assert result["status"] == "proposed", result
    return result


def cmd(*args: Any) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def proposals_cmd(workspace, *args: Any) -> str:
    return cmd("proposals", "--workspace", workspace.slug, *map(str, args))


def statuses(entries):
    return [Entry.objects.get(pk=e.pk).status for e in entries]


def open_ids(workspace, reason=None):
    return sorted(proposals.open_set(workspace, reason=reason).values_list("entry_ref", flat=True))


@pytest.fixture
def proposed(propose_workspace, now):
    """A propose-mode workspace whose run proposed 3 tombstones and 2 archives, among 10 warm
    entries nothing proposes."""
    made = {"cold": cold(propose_workspace, now, 3), "junk": junk(propose_workspace, now, 2)}
    for _ in range(10):
        make(propose_workspace, now)
    made["run"] = propose_run(propose_workspace, now)
    return made


# --- listing ----------------------------------------------------------------------------------


def test_it_lists_the_open_set_by_reason_with_excerpts_and_deciding_values(propose_workspace, proposed):
    text = proposals_cmd(propose_workspace)

    assert text.startswith("5 proposals await approval in workspace 'initech'; none of these entries")
    archive = text.index("low quality (hygiene) (low_quality_archived, archive): 2")
    evict = text.index("decayed: retention below the cold threshold (evicted, tombstone): 3")
    assert archive < evict  # run order
    for entry in proposed["cold"]:
        row = next(line for line in text.splitlines() if line.startswith(f"  {entry.pk:>8}  "))
        why = Proposal.objects.get(entry_ref=entry.pk, status="open").why
        assert entry.content[:20] in row and row.endswith(why)
        assert "never accessed" in why and "< 0.20" in why and "200 days old" in why
    for entry in proposed["junk"]:
        row = next(line for line in text.splitlines() if line.startswith(f"  {entry.pk:>8}  "))
        assert entry.content in row and "hygiene score 4" in row
    assert "--approve ID... | --approve-all [--reason R]" in text
    assert "--reject ID..." in text


def test_the_list_filters_by_reason_and_action_and_limits_each_group(propose_workspace, proposed):
    by_reason = proposals_cmd(propose_workspace, "--reason", "evicted")
    assert "evicted, tombstone): 3" in by_reason and "low_quality_archived" not in by_reason
    assert by_reason.startswith("3 proposals await approval")
    by_action = proposals_cmd(propose_workspace, "--action", "archive")
    assert "low_quality_archived, archive): 2" in by_action and "evicted" not in by_action
    limited = proposals_cmd(propose_workspace, "--limit", "1")
    assert "… and 2 more (--reason evicted --limit 0 lists them all)" in limited
    assert "… and 1 more (--reason low_quality_archived --limit 0 lists them all)" in limited
    assert f"  {proposed['cold'][1].pk:>8}  " not in limited


def test_the_json_list_is_the_open_set(propose_workspace, proposed):
    data = json.loads(proposals_cmd(propose_workspace, "--json", "--limit", "0"))

    assert data["workspace"] == "initech" and data["count"] == 5
    assert [(g["reason"], g["action"], g["count"]) for g in data["reasons"]] == [
        ("low_quality_archived", "archive", 2),
        ("evicted", "tombstone", 3),
    ]
    evicted = data["reasons"][1]["proposals"]
    assert [p["id"] for p in evicted] == sorted(e.pk for e in proposed["cold"])
    first = evicted[0]
    assert set(first) == {
        "id",
        "action",
        "why",
        "values",
        "run_id",
        "proposed_at",
        "title",
        "content_excerpt",
    }
    assert first["run_id"] == proposed["run"]["run_id"]
    assert first["values"]["retention"] < first["values"]["cold_threshold"] == 0.2
    assert first["content_excerpt"] == Entry.objects.get(pk=first["id"]).content
    filtered = json.loads(proposals_cmd(propose_workspace, "--json", "--action", "tombstone"))
    assert [g["reason"] for g in filtered["reasons"]] == ["evicted"] and filtered["count"] == 3


def test_an_empty_set_says_what_comes_next(propose_workspace, workspace):
    assert proposals_cmd(propose_workspace) == (
        "No open proposals in workspace 'initech'; the next maintenance run records what it would "
        "archive or tombstone here.\n"
    )
    assert "review mode is apply" in proposals_cmd(workspace)
    assert json.loads(proposals_cmd(workspace, "--json")) == {"workspace": "acme", "count": 0, "reasons": []}


# --- approving --------------------------------------------------------------------------------


def test_approving_ids_applies_exactly_those_and_prints_what_approve_returns(propose_workspace, proposed):
    target, kept = proposed["cold"][0], proposed["cold"][1:]
    fragment = proposed["junk"][0]

    data = json.loads(proposals_cmd(propose_workspace, "--approve", target.pk, fragment.pk, "--json"))

    assert list(data) == ["applied", "skipped", "backup_file"]
    assert data["applied"] == sorted([target.pk, fragment.pk]) and data["skipped"] == []
    assert data["backup_file"].startswith("pre-prune-backup-")
    assert statuses([target, fragment]) == ["tombstoned", "archived"]
    # The run marked the cold entries stale (stale marking applies in propose mode).
    assert statuses(kept) == ["stale", "stale"] and statuses(proposed["junk"][1:]) == ["active"]
    assert open_ids(propose_workspace) == sorted([*(e.pk for e in kept), proposed["junk"][1].pk])
    event = LifecycleEvent.objects.get(entry_ref=target.pk, to_status="tombstoned")
    assert (event.actor, event.run_id) == ("cli", proposed["run"]["run_id"])


def test_the_approval_text_names_what_changed_the_backup_and_the_undo(propose_workspace, proposed):
    target = proposed["cold"][0]
    text = proposals_cmd(propose_workspace, "--approve", target.pk)
    run_id = proposed["run"]["run_id"]
    assert text.splitlines()[0] == f"approved and applied 1: {target.pk}"
    assert "backup: pre-prune-backup-" in text
    assert f"undo: manage.py revert_run {run_id} --workspace initech reverts what was approved" in text
    # ... and the undo works: a whole-run revert brings the approved tombstone back.
    cmd("revert_run", run_id, "--workspace", "initech")
    assert statuses([target]) == ["stale"]


def test_approve_all_of_a_reason_leaves_the_other_reasons_open(propose_workspace, proposed):
    text = proposals_cmd(propose_workspace, "--approve-all", "--reason", "evicted")
    assert text.startswith("approved and applied 3: ")
    assert statuses(proposed["cold"]) == ["tombstoned"] * 3
    assert statuses(proposed["junk"]) == ["active"] * 2
    assert open_ids(propose_workspace) == sorted(e.pk for e in proposed["junk"])


def test_approve_all_of_an_action_and_then_everything(propose_workspace, proposed):
    proposals_cmd(propose_workspace, "--approve-all", "--action", "archive")
    assert statuses(proposed["junk"]) == ["archived"] * 2
    assert statuses(proposed["cold"]) == ["stale"] * 3
    data = json.loads(proposals_cmd(propose_workspace, "--approve-all", "--json"))
    assert data["applied"] == sorted(e.pk for e in proposed["cold"])
    assert open_ids(propose_workspace) == []
    assert Entry.objects.filter(workspace=propose_workspace, status="active").count() == 10


def test_a_proposal_that_no_longer_holds_is_skipped_with_why(propose_workspace, proposed, now):
    accessed = proposed["cold"][0]
    entry_signals.entry_record_access(
        workspace=propose_workspace, entry_id=accessed.pk, actor="agent:a", now=now + timedelta(seconds=1)
    )

    text = proposals_cmd(propose_workspace, "--approve-all", "--reason", "evicted")

    assert text.startswith("approved and applied 2: ")
    assert f"skipped 1:\n  {accessed.pk:>8}  accessed since it was proposed" in text
    assert statuses(proposed["cold"]) == ["active", "tombstoned", "tombstoned"]
    assert Proposal.objects.get(entry_ref=accessed.pk).status == "skipped"


def test_the_circuit_breaker_stops_an_approval_until_forced(propose_workspace, now):
    many = cold(propose_workspace, now, 21)
    for _ in range(20):
        make(propose_workspace, now)
    result = propose_run(propose_workspace, now)
    assert result["breaker"] == {"would_trip": True, "tombstones": 21, "live": 41}
    assert "trips the circuit breaker: approve with --force" in cmd(
        "maintain", "--workspace", "initech", "--dry-run"
    )

    with pytest.raises(CommandError, match=r"tombstone 21 of 41 live entries .*approve again with --force"):
        proposals_cmd(propose_workspace, "--approve-all")
    assert statuses(many) == ["stale"] * 21 and len(open_ids(propose_workspace)) == 21
    # A few at a time stay below the breaker's 20 entries.
    assert proposals_cmd(propose_workspace, "--approve", many[0].pk).startswith("approved and applied 1")
    data = json.loads(proposals_cmd(propose_workspace, "--approve-all", "--force", "--json"))
    assert len(data["applied"]) == 20
    assert statuses(many) == ["tombstoned"] * 21


def test_a_running_maintenance_refuses_an_approval_with_a_message(propose_workspace, proposed):
    MaintenanceLease.objects.update_or_create(
        workspace=propose_workspace, defaults={"holder": "another-machine", "renewed_at": timezone.now()}
    )
    with pytest.raises(CommandError, match="a maintenance run is working on this workspace"):
        proposals_cmd(propose_workspace, "--approve-all")
    assert statuses(proposed["cold"]) == ["stale"] * 3 and len(open_ids(propose_workspace)) == 5


def test_ids_without_an_open_proposal_are_named_and_the_command_exits_non_zero(propose_workspace, proposed):
    target = proposed["cold"][0]
    out = StringIO()
    with pytest.raises(
        CommandError, match=r"^999999: no open proposal for this entry in workspace 'initech'"
    ):
        call_command(
            "proposals", "--workspace", "initech", "--approve", str(target.pk), "999999", "--json", stdout=out
        )
    # The real one was applied; the JSON says what happened to each.
    assert json.loads(out.getvalue())["skipped"] == [{"id": 999999, "why": "no open proposal for this entry"}]
    assert statuses([target]) == ["tombstoned"]
    with pytest.raises(CommandError, match=f"{target.pk}: no open proposal"):
        proposals_cmd(propose_workspace, "--reject", target.pk)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--approve", "0"], "is not an entry id"),
        (["--approve", "abc"], "invalid int value"),
        (["--reject", "-3"], "is not an entry id"),
        (["--approve-all", "--reason", "sometime"], "invalid choice"),
        (["--approve-all", "--action", "purge"], "invalid choice"),
        (["--reject-all", "--force"], "--force only applies to --approve"),
        (["--approve", "1", "--action", "archive"], "--action selects with"),
        (["--approve", "1", "--reject", "2"], "not allowed with"),
        (["--limit", "-1"], "--limit must be 0"),
    ],
)
def test_bad_options_are_refused_with_a_message_and_change_nothing(
    propose_workspace, proposed, args, message
):
    with pytest.raises(CommandError, match=message):
        proposals_cmd(propose_workspace, *args)
    assert len(open_ids(propose_workspace)) == 5
    assert not Entry.objects.filter(status__in=["archived", "tombstoned"]).exists()


def test_an_unknown_workspace_is_refused():
    with pytest.raises(CommandError, match="workspace 'nowhere' not found"):
        cmd("proposals", "--workspace", "nowhere")


# --- rejecting --------------------------------------------------------------------------------


def test_rejecting_ids_closes_them_and_holds_the_entries(propose_workspace, proposed, now):
    target = proposed["cold"][0]

    data = json.loads(proposals_cmd(propose_workspace, "--reject", target.pk, "--json"))

    assert data == {"rejected": [target.pk], "skipped": []}
    entry = Entry.objects.get(pk=target.pk)
    assert (entry.status, entry.held_by, entry.hold_reason) == ("stale", "cli", "reject")
    assert Proposal.objects.get(entry_ref=target.pk).status == "rejected"
    # The next run wants it again, skips it, and counts it.
    again = run_maintenance(workspace=propose_workspace, now=now + timedelta(minutes=1))
    assert target.pk not in open_ids(propose_workspace) and again["counts"]["held_skipped"] == 1


def test_reject_all_of_a_reason(propose_workspace, proposed):
    text = proposals_cmd(propose_workspace, "--reject-all", "--reason", "low_quality_archived")
    assert text.startswith("rejected 2: ") and "(held: automation leaves them alone)" in text
    assert [Entry.objects.get(pk=e.pk).hold_reason for e in proposed["junk"]] == ["reject", "reject"]
    assert open_ids(propose_workspace) == sorted(e.pk for e in proposed["cold"])


# --- release ----------------------------------------------------------------------------------


def test_release_ends_a_hold_and_says_whose_it_was(propose_workspace, proposed):
    first, second = proposed["cold"][:2]
    proposals_cmd(propose_workspace, "--reject", first.pk, second.pk)

    text = cmd("release", str(first.pk), "--workspace", "initech")

    assert text.startswith(f"entry {first.pk} (stale) released: it was held by cli since ")
    assert "(reject); automatic passes may change it again." in text
    assert Entry.objects.get(pk=first.pk).held_at is None
    event = LifecycleEvent.objects.filter(entry_ref=first.pk, reason="release").get()
    assert event.actor == "cli" and event.details["hold_reason"] == "reject"
    held_at = Entry.objects.get(pk=second.pk).held_at
    data = json.loads(cmd("release", str(second.pk), "--workspace", "initech", "--json"))
    assert data == {
        "id": second.pk,
        "status": "stale",
        "held": False,
        "released_hold": {"held_by": "cli", "held_at": held_at.isoformat(), "hold_reason": "reject"},
    }


def test_release_refuses_what_it_cannot_release(propose_workspace, workspace, now):
    free = make(propose_workspace, now)
    elsewhere = make(workspace, now)
    holds.hold(workspace, [elsewhere.pk], reason="restore", actor="user:ann", now=now)
    old = make(propose_workspace, now)
    holds.hold(propose_workspace, [old.pk], reason="keep", actor="user:ann", now=now)
    newer = entry_changes.entry_update(
        workspace=propose_workspace, entry_id=old.pk, content="new text, new version"
    )
    cases = [
        (free.pk, f"entry {free.pk} is not held"),
        (elsewhere.pk, "not found"),
        (2**70, "not found"),
        (old.pk, "old version"),
    ]
    for entry_id, message in cases:
        with pytest.raises(CommandError, match=message):
            cmd("release", str(entry_id), "--workspace", "initech")
    assert Entry.objects.get(pk=elsewhere.pk).held_by == "user:ann"
    assert newer is not None


# --- a real process -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def process_env(tmp_path_factory):
    """A migrated SQLite file other processes can reach (pytest's database is in memory)."""
    from tests.helpers_subprocess import migrated_sqlite, subprocess_env

    folder: Path = tmp_path_factory.mktemp("proposals_cli")
    return subprocess_env(migrated_sqlite(folder / "db.sqlite3"), folder / "backups")


def test_the_command_line_lists_approves_and_refuses_in_a_real_process(process_env):
    import subprocess

    from tests.helpers_subprocess import PYTHON, ROOT, helper, manage

    now = timezone.now().replace(microsecond=0).isoformat()
    helper(["seed", "--workspace", "cli", "--entries", "120", "--now", now], process_env)
    result = json.loads(helper(["run", "--workspace", "cli", "--now", now], process_env))
    assert result["status"] == "proposed", result
    proposed = result["affected"]["proposed"]
    assert proposed["tombstone"] and not result["affected"]["tombstoned"]

    listing = manage(["proposals", "--workspace", "cli"], process_env)
    assert f"{len(proposed['archive']) + len(proposed['tombstone'])} proposals await approval" in listing

    refused = subprocess.run(
        [PYTHON, str(ROOT / "manage.py"), "proposals", "--workspace", "cli", "--approve", "99999999"],
        env=process_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1
    assert "99999999: no open proposal for this entry" in refused.stderr
    assert "Traceback" not in refused.stderr

    approved = json.loads(manage(["proposals", "--workspace", "cli", "--approve-all", "--json"], process_env))
    assert approved["applied"] == sorted({*proposed["archive"], *proposed["tombstone"]})
    assert manage(["proposals", "--workspace", "cli"], process_env).startswith("No open proposals")
