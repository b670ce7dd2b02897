"""What the commands tell a person (issue 14, item 4): ``maintain``, ``prune`` and ``sweep_decay``
say why a run was blocked or only proposed and what to do next, with metrics apart from
changes; ``hygiene`` shows excerpts and filters like the console; ``import_entries`` says what
maintenance will do with the import."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from maintenance.models import MaintenanceLease
from maintenance.run_start import run_maintenance
from memory import accounts, holds, journal_import, new_entries
from memory.models import Entry

pytestmark = pytest.mark.django_db


@pytest.fixture
def now():
    return timezone.now()


def make(workspace, now, *, age_days=0.0, content=None, **fields):
    return new_entries.entry_create(
        workspace=workspace,
        content=content or f"note {Entry.objects.count()} about the retry budget of the cache layer",
        created_at=now - timedelta(days=age_days),
        now=now - timedelta(days=age_days),
        **fields,
    )


def cmd(*args: Any) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def lines_of(text: str, prefix: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip().startswith(prefix))


def breaker_workspace(workspace, now):
    """21 cold entries of 41: 51 % tombstoned, past the default max_tombstone_fraction 50 %."""
    cold = [make(workspace, now, age_days=200) for _ in range(21)]
    for _ in range(20):
        make(workspace, now)
    return cold


# --- blocked ------------------------------------------------------------------------------------


def test_a_blocked_run_says_why_with_the_breaker_numbers_and_how_to_force_it(workspace, now):
    cold = breaker_workspace(workspace, now)

    text = cmd("maintain", "--workspace", "acme")

    head = text.splitlines()[0]
    assert head.endswith("on acme: blocked — the circuit breaker stopped it; nothing was changed")
    assert "it would tombstone 21 of the 41 live entries (51%, more than max_tombstone_fraction 50%)" in text
    assert "evicted 21" in lines_of(text, "would change:")
    assert "scored" not in lines_of(text, "would change:")
    assert lines_of(text, "metrics:").startswith("metrics: scored 41, orphans ")
    assert "manage.py maintain --workspace acme --force" in text and "--dry-run --json" in text
    assert all(Entry.objects.get(pk=e.pk).status == "active" for e in cold)


def test_the_blocked_result_carries_the_breaker_numbers_in_json(workspace, now):
    breaker_workspace(workspace, now)
    result = json.loads(cmd("maintain", "--workspace", "acme", "--json", "--dry-run"))
    assert result["status"] == "blocked"
    assert result["breaker"] == {"would_trip": True, "tombstones": 21, "live": 41}


def test_sweep_decay_and_prune_name_themselves_in_the_hint(workspace, now):
    breaker_workspace(workspace, now)
    sweep = cmd("sweep_decay", "--workspace", "acme", "--dry-run")
    assert "(decay, dry run) on acme: blocked" in sweep
    assert "manage.py sweep_decay --workspace acme --force" in sweep
    assert "orphans" not in sweep  # only a full run measures orphans
    prune = cmd(
        "prune", "--workspace", "acme", "--prune-older-than-days", "100", "--importance-threshold", "1"
    )
    assert "on acme: blocked" in prune and "manage.py prune --workspace acme --force" in prune
    assert "pruned 21" in lines_of(prune, "would change:")


# --- proposed -----------------------------------------------------------------------------------


def test_a_proposed_run_says_nothing_was_archived_and_how_to_decide(propose_workspace, now):
    cold = [make(propose_workspace, now, age_days=200) for _ in range(3)]
    for i in range(2):
        make(propose_workspace, now, age_days=40, content=f"half done {i}...", tier="semantic")
    for _ in range(10):
        make(propose_workspace, now)

    text = cmd("maintain", "--workspace", "initech")

    assert text.splitlines()[0].endswith(
        "on initech: proposed — 2 archives and 3 tombstones await approval; "
        "nothing was archived or tombstoned"
    )
    assert lines_of(text, "proposed:") == "proposed: low_quality_archived 2, evicted 3"
    assert lines_of(text, "applied:") == "applied: stale_marked 3"  # stale marking still applies
    assert lines_of(text, "metrics:").startswith("metrics: scored 15, orphans ")
    assert "manage.py proposals --workspace initech" in text
    assert "--approve-all [--reason R]" in text and "--reject ID..." in text
    assert [Entry.objects.get(pk=e.pk).status for e in cold] == ["stale"] * 3
    dry = cmd("maintain", "--workspace", "initech", "--dry-run")
    assert "3 tombstones would await approval" in dry and "a real run" in dry


def test_a_proposing_sweep_says_so_too(propose_workspace, now):
    for _ in range(3):
        make(propose_workspace, now, age_days=200)
    text = cmd("sweep_decay", "--workspace", "initech")
    assert "proposed — 0 archives and 3 tombstones await approval" in text
    assert lines_of(text, "proposed:") == "proposed: evicted 3"
    assert not Entry.objects.filter(status="tombstoned").exists()


# --- metrics and skipped runs ----------------------------------------------------------------------


def test_held_skipped_is_a_metric_shown_only_when_there_are_some(workspace, now):
    held, free = make(workspace, now, age_days=200), make(workspace, now, age_days=200)
    plain = cmd("maintain", "--workspace", "acme", "--dry-run")
    assert "held_skipped" not in plain
    holds.hold(workspace, [held.pk], reason="restore", actor="user:ann", now=now)

    text = cmd("maintain", "--workspace", "acme")

    assert lines_of(text, "changes:") == "changes: stale_marked 1, evicted 1"  # the free one
    assert "held_skipped 1 (operator holds kept automation away" in lines_of(text, "metrics:")
    assert Entry.objects.get(pk=held.pk).status == "active"
    assert Entry.objects.get(pk=free.pk).status == "tombstoned"


def test_a_run_finding_the_lease_held_says_it_did_nothing(workspace, now):
    make(workspace, now)
    MaintenanceLease.objects.update_or_create(
        workspace=workspace, defaults={"holder": "another-machine", "renewed_at": timezone.now()}
    )
    text = cmd("maintain", "--workspace", "acme")
    assert "on acme: skipped — nothing was done" in text and "lease" in text


def test_an_ordinary_run_lists_changes_apart_from_metrics(workspace, now):
    make(workspace, now, age_days=200)
    make(workspace, now)
    text = cmd("maintain", "--workspace", "acme")
    assert text.splitlines()[0].endswith("on acme: succeeded")
    assert lines_of(text, "changes:") == "changes: stale_marked 1, evicted 1"
    assert lines_of(text, "metrics:") == "metrics: scored 2, orphans 1"
    assert lines_of(text, "backup:").startswith("backup: pre-prune-backup-")
    assert cmd("maintain", "--workspace", "acme").splitlines()[1] == "  changes: none"


# --- hygiene --------------------------------------------------------------------------------------


def test_hygiene_shows_excerpts_and_filters_by_recommendation_and_reason(workspace, now):
    archive = make(workspace, now, content="half done...")  # 4: recommend archive
    review = make(workspace, now, content="short remark about caching")  # 2: review
    make(
        workspace,
        now,
        content="The connection pool keeps twelve sockets open between deploys and retries failed "
        "handshakes.",
    )

    text = cmd("hygiene", "--workspace", "acme")
    assert "half done..." in lines_of(text, str(archive.pk)) and "short remark" in text
    assert "1–2 of 2 candidates" in text
    only_archive = cmd("hygiene", "--workspace", "acme", "--recommendation", "archive")
    assert "half done" in only_archive and "short remark" not in only_archive
    assert "1–1 of 1 matching candidates (of 2)" in only_archive
    only_review = json.loads(cmd("hygiene", "--workspace", "acme", "--recommendation", "review", "--json"))
    assert [c["id"] for c in only_review["candidates"]] == [review.pk]
    assert (only_review["count"], only_review["total"]) == (1, 2)
    assert only_review["candidates"][0]["content_excerpt"] == "short remark about caching"
    by_reason = json.loads(
        cmd("hygiene", "--workspace", "acme", "--reason", "truncated_or_unbalanced", "--json")
    )
    assert [c["id"] for c in by_reason["candidates"]] == [archive.pk]


# --- import ---------------------------------------------------------------------------------------


def test_an_import_into_a_new_workspace_is_never_changed_before_a_proposal(now):
    # A new workspace proposes: the import's first runs, even a year on, archive and tombstone
    # nothing; what they want waits as proposals.
    cmd("create_workspace", "history")
    text = cmd("import_entries", str(journal_import.SAMPLE_PATH), "--workspace", "history")
    assert "Review mode propose" in text and "change none of them until you approve" in text
    workspace = accounts.workspace_get("history")
    for days in (0, 30, 365):
        result = run_maintenance(workspace=workspace, now=now + timedelta(days=days))
        assert result["status"] == "proposed"
        assert result["affected"]["archived"] == result["affected"]["tombstoned"] == []
    assert not Entry.objects.filter(workspace=workspace, status__in=["archived", "tombstoned"]).exists()
    assert "proposals await approval" in cmd("proposals", "--workspace", "history")


def test_an_import_into_an_apply_workspace_warns_that_runs_change_it_at_once(now):
    cmd("create_workspace", "history", "--review-mode", "apply")
    text = cmd("import_entries", str(journal_import.SAMPLE_PATH), "--workspace", "history")
    assert "Review mode apply: the next maintenance run archives and tombstones at once" in text
