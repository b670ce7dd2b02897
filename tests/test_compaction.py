"""Compaction (pass 7): fragments of one (project, session_key) become one
retrospective digest linked evolves_from to each; the fragments are archived, revertibly."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from maintenance.compaction import digest
from maintenance.models import MaintenanceRun
from maintenance.revert import revert_run
from maintenance.run_start import run_maintenance
from memory import new_entries
from memory.models import Entry, LifecycleEvent, Relationship
from memory.models.choices import CONTENT_MAX
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db


def fragment(workspace, now, n, *, age_days=20, session="feature-login", project="web", **fields):
    fields.setdefault("entry_type", "development_note")
    return new_entries.entry_create(
        workspace=workspace,
        content=f"Step {n}: wired the login form validation and checked the session cookie handling",
        project=project,
        session_key=session,
        created_at=now - timedelta(days=age_days, minutes=n),
        now=now - timedelta(days=age_days, minutes=n),
        **fields,
    )


def group(workspace, now, size, **kwargs):
    return [fragment(workspace, now, n, **kwargs) for n in range(size)]


def consolidate(workspace, now, **kwargs):
    return run_maintenance(workspace=workspace, now=now, kind="consolidate", **kwargs)


def summaries(workspace):
    return Entry.objects.filter(workspace=workspace, entry_type="retrospective")


def statuses(entries):
    return set(Entry.objects.filter(pk__in=[e.pk for e in entries]).values_list("status", flat=True))


def test_more_than_the_minimum_group_becomes_one_linked_retrospective(workspace, now):
    fragments = group(workspace, now, 11)  # consolidation_min_group is 10: 11 > 10
    result = consolidate(workspace, now)
    assert result["status"] == "succeeded"
    assert result["counts"]["summaries_created"] == 1
    assert result["counts"]["consolidated"] == 11
    assert result["affected"]["archived"] == sorted(f.pk for f in fragments)
    (summary,) = summaries(workspace)
    assert (summary.status, summary.project, summary.session_key) == ("active", "web", "feature-login")
    assert summary.source == "platform" and summary.lineage_id == summary.pk
    links = Relationship.objects.filter(from_entry=summary, type="evolves_from")
    assert sorted(links.values_list("to_entry_id", flat=True)) == sorted(f.pk for f in fragments)
    assert statuses(fragments) == {"archived"}
    events = LifecycleEvent.objects.filter(run_id=result["run_id"], reason="compact", to_status="archived")
    assert events.count() == 11 and all(e.automatic for e in events)
    assert summary.scored_at is not None


def test_exactly_the_minimum_is_not_a_group(workspace, now):
    fragments = group(workspace, now, 10)
    result = consolidate(workspace, now)
    assert result["counts"]["summaries_created"] == 0
    assert not summaries(workspace).exists()
    assert statuses(fragments) == {"active"}


def test_the_minimum_group_comes_from_the_policy(workspace, now):
    MaintenancePolicy.objects.filter(workspace=workspace).update(consolidation_min_group=3)
    group(workspace, now, 4)
    assert consolidate(workspace, now)["counts"]["consolidated"] == 4


def test_fragments_younger_than_the_minimum_age_do_not_count(workspace, now):
    group(workspace, now, 8, age_days=20)
    young = group(workspace, now, 5, age_days=13)  # consolidation_min_age_days is 14
    assert consolidate(workspace, now)["counts"]["summaries_created"] == 0
    assert statuses(young) == {"active"}


def test_groups_are_per_project_and_session_and_a_missing_session_is_never_a_group(workspace, now):
    group(workspace, now, 6, session="a")
    group(workspace, now, 6, session="b")
    group(workspace, now, 6, session="a", project="api")
    no_session = group(workspace, now, 20, session="")
    assert consolidate(workspace, now)["counts"]["summaries_created"] == 0
    MaintenancePolicy.objects.filter(workspace=workspace).update(consolidation_min_group=5)
    result = consolidate(workspace, now)
    assert result["counts"]["summaries_created"] == 3
    assert result["counts"]["consolidated"] == 18
    assert statuses(no_session) == {"active"}
    assert sorted(summaries(workspace).values_list("project", "session_key")) == [
        ("api", "a"),
        ("web", "a"),
        ("web", "b"),
    ]


def test_only_development_notes_and_test_entries_of_managed_unprotected_entries_count(workspace, now):
    notes = group(workspace, now, 6)
    tests = group(workspace, now, 5, entry_type="test_entry")
    others = [
        fragment(workspace, now, 100, entry_type="decision"),
        fragment(workspace, now, 101, pinned=True),
        fragment(workspace, now, 102, source="operator"),
        fragment(workspace, now, 103, tags=["keep-me"]),
    ]
    MaintenancePolicy.objects.filter(workspace=workspace).update(exclude_tags=["keep-me"])
    result = consolidate(workspace, now)
    assert result["counts"]["consolidated"] == 11
    assert statuses(notes + tests) == {"archived"}
    assert statuses(others) == {"active"}
    assert "development note and test entry fragments" in summaries(workspace).get().content


def test_a_dry_run_reports_the_counts_and_changes_nothing(workspace, now):
    fragments = group(workspace, now, 12)
    result = consolidate(workspace, now, dry_run=True)
    assert (result["counts"]["summaries_created"], result["counts"]["consolidated"]) == (1, 12)
    assert result["affected"]["archived"] == sorted(f.pk for f in fragments)
    assert not summaries(workspace).exists()
    assert statuses(fragments) == {"active"}
    assert not Relationship.objects.filter(workspace=workspace).exists()


def test_the_full_run_compacts_too_and_a_second_run_finds_nothing_left(workspace, now):
    group(workspace, now, 11)
    first = run_maintenance(workspace=workspace, now=now)
    assert first["counts"]["summaries_created"] == 1
    second = run_maintenance(workspace=workspace, now=now)
    assert second["counts"]["summaries_created"] == 0
    assert summaries(workspace).count() == 1


def test_reverting_the_run_brings_the_fragments_back_and_archives_the_digest(workspace, now):
    fragments = group(workspace, now, 11)
    result = consolidate(workspace, now)
    (summary,) = summaries(workspace)
    undone = revert_run(workspace, result["run_id"], actor="user:ops", now=now + timedelta(hours=1))
    assert undone["reverted"] == sorted(f.pk for f in fragments)
    assert undone["summaries_archived"] == [summary.pk]
    assert statuses(fragments) == {"active"}
    summary.refresh_from_db()
    assert summary.status == "archived"  # kept, never deleted
    # Reverting twice changes nothing more.
    again = revert_run(workspace, result["run_id"], actor="user:ops", now=now + timedelta(hours=2))
    assert again["reverted"] == [] and again["summaries_archived"] == []


def test_another_workspace_is_never_touched(workspace, other_workspace, now):
    theirs = group(other_workspace, now, 11)
    group(workspace, now, 11)
    consolidate(workspace, now)
    assert statuses(theirs) == {"active"}
    assert not summaries(other_workspace).exists()


def test_the_digest_is_deterministic_readable_and_most_important_first(workspace, now):
    fragments = group(workspace, now, 11)
    # A bigger blast radius makes it the most important (the run rescores every entry first).
    Entry.objects.filter(pk=fragments[3].pk).update(impact_score=1.0, title="Chose the argon2 hasher")
    result = consolidate(workspace, now)
    content = summaries(workspace).get().content
    lines = content.splitlines()
    assert lines[0] == "Retrospective of session feature-login of project web."
    first_day = (now - timedelta(days=20, minutes=10)).date().isoformat()
    assert f"11 development note fragments from {first_day} to {first_day}" in lines[1]
    items = [line for line in lines if line.startswith("- ")]
    assert len(items) == 11
    assert items[0].endswith(f"#{fragments[3].pk}: Chose the argon2 hasher")
    shown = [float(item.split("[", 1)[1].split("]", 1)[0]) for item in items]
    assert shown == sorted(shown, reverse=True) and shown[0] > shown[1]
    # The same rows give the same text.
    MaintenanceRun.objects.all().delete()
    rows = [
        {
            "pk": f.pk,
            "title": "",
            "content": "x",
            "created_at": f.created_at,
            "importance": 0.1,
            "entry_type": "test_entry",
        }
        for f in fragments
    ]
    assert digest("p", "s", rows) == digest("p", "s", rows)
    assert result["counts"]["consolidated"] == 11


def test_a_huge_group_stays_within_the_content_limit(workspace, now):
    rows = [
        {
            "pk": n,
            "title": "",
            "content": "word " * 200,
            "created_at": now - timedelta(days=30, minutes=n),
            "importance": 0.5,
            "entry_type": "development_note",
        }
        for n in range(1, 1001)
    ]
    title, content = digest("web", "s1", rows)
    assert len(content) <= CONTENT_MAX
    assert content.rstrip().endswith("more fragments (see the evolves_from links).")
    assert len(title) <= 200


def test_queries_do_not_grow_with_the_size_of_a_group(workspace, other_workspace, now):
    def queries(ws, size):
        group(ws, now, size)
        with CaptureQueriesContext(connection) as ctx:
            consolidate(ws, now)
        return len(ctx.captured_queries)

    small = queries(workspace, 11)
    large = queries(other_workspace, 60)
    assert large == small


def test_queries_do_not_grow_with_the_number_of_groups(workspace, other_workspace, now):
    # Groups are written in parts of whole groups of about a batch of fragments, a constant
    # number of statements each: one transaction per group took 11 statements a group, about
    # 3 s of a plan at 1,000,000 entries for 96 groups.
    def queries(ws, groups):
        for g in range(groups):
            group(ws, now, 11, session=f"s-{g}")
        with CaptureQueriesContext(connection) as ctx:
            result = consolidate(ws, now)
        assert result["counts"]["summaries_created"] == groups
        assert result["counts"]["consolidated"] == 11 * groups
        return len(ctx.captured_queries)

    assert queries(other_workspace, 6) == queries(workspace, 2)
    # Every digest is linked to exactly its own group's eleven fragments.
    for summary in [*summaries(workspace), *summaries(other_workspace)]:
        linked = Entry.objects.filter(
            pk__in=Relationship.objects.filter(from_entry=summary).values("to_entry")
        ).values_list("session_key", flat=True)
        assert list(linked) == [summary.session_key] * 11


def test_groups_beyond_a_batch_go_in_several_parts_none_split(workspace, now, monkeypatch):
    from maintenance import compaction

    parts: list[list[int]] = []
    original = compaction._write_summaries

    def spy(ctx, part):
        parts.append([len(rows) for _, rows in part])
        return original(ctx, part)

    monkeypatch.setattr(compaction, "_write_summaries", spy)
    for g in range(4):
        group(workspace, now, 11, session=f"s-{g}")
    group(workspace, now, 30, session="s-big")
    # A batch of 25 fragments: two groups of 11 fit, a third does not; the group of 30 goes
    # alone. So in the plan and again in the apply.
    assert consolidate(workspace, now, batch_size=25)["counts"]["summaries_created"] == 5
    assert parts == [[11, 11], [11, 11], [30]] * 2


def test_a_failing_part_leaves_the_parts_before_it_whole_and_nothing_of_itself(workspace, now, monkeypatch):
    from maintenance import compaction

    calls = []
    original = compaction.transition

    def failing(ctx, *args, **kwargs):
        calls.append(ctx.planning)
        if len(calls) == 4:  # the plan's two parts, then the apply's first; its second fails
            raise RuntimeError("the database went away")
        return original(ctx, *args, **kwargs)

    monkeypatch.setattr(compaction, "transition", failing)
    groups = [group(workspace, now, 11, session=f"s-{g}") for g in range(4)]
    with pytest.raises(RuntimeError):
        consolidate(workspace, now, batch_size=25)
    assert calls == [True, True, False, False]  # the plan's parts, then the apply's
    assert sorted(summaries(workspace).values_list("session_key", flat=True)) == ["s-0", "s-1"]
    assert [statuses(g) for g in groups] == [{"archived"}, {"archived"}, {"active"}, {"active"}]
    assert Relationship.objects.filter(from_entry__in=summaries(workspace)).count() == 22


def test_the_fragments_of_all_groups_are_read_together_not_group_by_group(workspace, now):
    # One read per group scanned the whole workspace each time (no index leads with the
    # session key): at 1,000,000 entries 96 groups took 73 s of the plan.
    group(workspace, now, 11, session="s-alpha")
    group(workspace, now, 11, session="s-beta")
    with CaptureQueriesContext(connection) as ctx:
        result = consolidate(workspace, now)
    assert result["counts"]["summaries_created"] == 2
    selects = [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]
    reading_both = [sql for sql in selects if "'s-alpha'" in sql and "'s-beta'" in sql]
    reading_one = [sql for sql in selects if ("'s-alpha'" in sql) != ("'s-beta'" in sql)]
    # The plan and the apply each read the fragments (those an operator hold keeps out are
    # read only where some entry is held: none is here).
    assert len(reading_both) == 2
    assert reading_one == []
    # Once the workspace has a hold (on any entry), both also read the held fragments.
    held = new_entries.entry_create(workspace=workspace, content="a note an operator held", now=now)
    Entry.objects.filter(pk=held.pk).update(held_at=now, held_by="user:ops", hold_reason="reject")
    group(workspace, now, 11, session="s-gamma")
    group(workspace, now, 11, session="s-delta")
    with CaptureQueriesContext(connection) as ctx:
        assert consolidate(workspace, now)["counts"]["summaries_created"] == 2
    selects = [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]
    reading_both = [sql for sql in selects if "'s-gamma'" in sql and "'s-delta'" in sql]
    assert len(reading_both) == 4


def test_a_group_larger_than_a_batch_locks_its_fragments_in_id_order(workspace, now, monkeypatch):
    """A group is archived in one transaction of its own, so every batch's row locks stay
    until it commits: its batches are consecutive, never spread over the table as a pass's
    status changes are on PostgreSQL (an operator's action locking two of its fragments in id
    order could otherwise deadlock with it)."""
    from memory import lifecycle

    ids = sorted(e.pk for e in group(workspace, now, 11, session="s-big"))
    archived: list[int] = []
    original = lifecycle.change_status

    def spy(workspace_id, batch, to_status, *args, **kwargs):
        if to_status == "archived":
            archived.extend(batch)
        return original(workspace_id, batch, to_status, *args, **kwargs)

    def spy_selected(workspace_id, selected, to_status, **kwargs):
        changed = original_selected(workspace_id, selected, to_status, **kwargs)
        if to_status == "archived":
            archived.extend(changed)
        return changed

    original_selected = lifecycle.change_selected
    monkeypatch.setattr(lifecycle, "change_status", spy)
    monkeypatch.setattr(lifecycle, "change_selected", spy_selected)
    assert consolidate(workspace, now, batch_size=2)["counts"]["summaries_created"] == 1
    assert archived == ids


def test_a_real_run_s_apply_compacts_its_plan_s_fragments_alone(workspace, now, monkeypatch):
    """The plan finds the groups; the apply re-checks those fragments by the same rule
    instead of counting every session's fragments again; a fragment that turns up after the
    plan is not compacted by this run. None planned, the apply reads nothing; more than
    ``PLANNED_FRAGMENTS_MAX`` planned, it reads the candidates again."""
    from maintenance import compaction, passes

    seen = []
    compact = compaction.compact
    monkeypatch.setattr(
        compaction, "compact", lambda ctx, only=None: seen.append(only) or compact(ctx, only=only)
    )
    first = group(workspace, now, 11)
    other = group(workspace, now, 12, session="feature-search")
    dry = consolidate(workspace, now, dry_run=True)
    real = consolidate(workspace, now)
    planned = sorted(f.pk for f in first + other)
    assert seen == [None, None, planned]  # the dry run's plan, the real run's plan, its apply
    assert real["affected"]["archived"] == dry["affected"]["archived"] == planned
    assert real["counts"]["summaries_created"] == 2

    seen.clear()
    late = group(workspace, now, 11, session="feature-billing")
    monkeypatch.setattr(passes, "planned", lambda ctx, key: None if ctx.planning else [])
    assert consolidate(workspace, now)["counts"]["consolidated"] == 0  # planned none: left alone
    assert seen == [None, []] and statuses(late) == {"active"}

    monkeypatch.setattr(passes, "PLANNED_FRAGMENTS_MAX", 5)
    monkeypatch.setattr(passes, "planned", lambda ctx, key: None if ctx.planning else [late[0].pk] * 6)
    assert consolidate(workspace, now)["counts"]["consolidated"] == 11  # too many named: read again
    assert seen[-1] is None and statuses(late) == {"archived"}
