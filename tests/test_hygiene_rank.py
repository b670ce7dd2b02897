"""The kept hygiene rank (``maintenance.hygiene_rank``): marked by the database's triggers
whatever changes an entry, folded into rows equal to a fresh computation, read with the holds
and excluded tags of now, rebuilt when the residue patterns change; and the queue it serves,
filtered or not, equals the candidates scored in Python from the entries."""

from datetime import timedelta

import pytest
from django.db import connection, transaction

from maintenance import backups, hygiene, hygiene_actions, hygiene_rank, pass_tools, rank_triggers, restore
from maintenance.hygiene import read_policy
from maintenance.hygiene_text import CANDIDATE_SCORE
from maintenance.models import (
    HygieneAssessment,
    HygieneRank,
    HygieneRankDirty,
    HygieneRankState,
    MaintenanceRun,
)
from maintenance.pass_tools import RunContext
from maintenance.tasks import assess_hygiene_verdicts
from memory import entry_changes, entry_signals, holds, new_entries
from memory.models import Entry
from memory.models.choices import HoldReason, Status
from memory.policy import PolicyValues
from memory.policy_model import MaintenancePolicy
from tests.test_backups import backup_path
from tests.test_hygiene import GOOD, JUNK, make

pytestmark = pytest.mark.django_db

# Code-heavy (1 point): listed only with another point, an import's for one.
CODE = "Run it:\n```\nx = 1\ny = 2\nz = 3\n```\nthen `a` `b` `c` `d` and check the pool sockets twice."


def kept(workspace):
    return set(HygieneRank.objects.filter(workspace=workspace).values_list("entry_id", "points"))


def fresh(workspace):
    """(entry id, points) of every row the rank should hold now, computed afresh from the
    entries with the queue's own expression: listed (≥ CANDIDATE_SCORE) or still to assess."""
    _, patterns = read_policy(workspace)
    scored = hygiene.scored_entries(workspace, hygiene_rank.rankable(workspace), patterns)
    rows = ((r["pk"], r["hygiene_points"]) for r in scored.values("pk", "hygiene_points"))
    return {(pk, points) for pk, points in rows if points is None or points >= CANDIDATE_SCORE}


def folded(workspace):
    """Fold the marks, then the kept rows must equal a fresh computation."""
    _, patterns = read_policy(workspace)
    hygiene_rank.fold(workspace, patterns)
    assert not HygieneRankDirty.objects.filter(workspace_id=workspace.pk).exists()
    assert kept(workspace) == fresh(workspace)
    return kept(workspace)


def reference(workspace, recommendation=None, reason=None):
    """The queue's candidates scored in Python from the entries (``hygiene.candidates``, what
    hygiene's apply reads), best first, filtered as the page filters."""
    return [
        c.id
        for c in hygiene.candidates(workspace)
        if recommendation in (None, c.recommendation)
        and (reason is None or reason in {r.code for r in c.reasons})
    ]


@pytest.fixture
def mixed(workspace, now):
    """Junk, copies, a flag, imports, and entries protected by their own columns."""
    assess_hygiene_verdicts(budget_seconds=60)
    made = {
        "junk": make(workspace, now, JUNK, age_days=50),
        "good": make(workspace, now, GOOD, age_days=49),
        "first copy": make(workspace, now, GOOD + " Copied.", age_days=48),
        "second copy": make(workspace, now, GOOD + " Copied.", age_days=47),
        "code import": make(workspace, now, CODE, age_days=46, source="import"),
        "code agent": make(workspace, now, CODE, age_days=45.5, title="agent code"),
        "flagged": make(workspace, now, GOOD + " Flagged.", age_days=45, last_feedback="wrong"),
        "pinned junk": make(workspace, now, JUNK + " pinned", age_days=44, pinned=True),
        "operator junk": make(workspace, now, JUNK + " operator", age_days=43, source="operator"),
        "constitutional junk": make(workspace, now, JUNK + " rule", age_days=42, tier="constitutional"),
    }
    hygiene.count(workspace)  # verdicts made, rank built
    return made


def test_the_rank_holds_the_listed_entries_with_their_points(workspace, mixed):
    rows = folded(workspace)
    # The same as the candidates scored in Python from the entries (``hygiene.candidates``).
    assert rows == {(c.id, c.score) for c in hygiene.candidates(workspace)}
    listed = {pk for pk, _ in rows}
    assert {mixed[k].pk for k in ("junk", "second copy", "code import", "flagged")} <= listed
    assert (
        not {
            mixed[k].pk for k in ("good", "first copy", "pinned junk", "operator junk", "constitutional junk")
        }
        & listed
    )
    assert (mixed["second copy"].pk, 4) in rows


def test_every_door_marks_the_entries_and_folding_keeps_the_rank_exact(workspace, mixed, now):
    folded(workspace)
    first, second = mixed["first copy"], mixed["second copy"]

    # The older copy leaves: the later one loses its duplicate points.
    entry_changes.entry_tombstone(workspace=workspace, entry_id=first.pk, now=now)
    assert (second.pk, 4) not in folded(workspace)
    entry_changes.entry_restore(workspace=workspace, entry_id=first.pk, now=now)
    assert (second.pk, 4) in folded(workspace)

    # Feedback, a pin, a status change, a new version, a hold and its release.
    entry_signals.entry_feedback(workspace=workspace, entry_id=mixed["good"].pk, signal="stale", now=now)
    assert (mixed["good"].pk, 2) in folded(workspace)
    entry_changes.entry_set_pinned(workspace=workspace, entry_id=mixed["junk"].pk, pinned=True, now=now)
    assert mixed["junk"].pk not in {pk for pk, _ in folded(workspace)}
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=mixed["flagged"].pk, status="stale", reason="test", now=now
    )
    assert mixed["flagged"].pk not in {pk for pk, _ in folded(workspace)}
    newer = entry_changes.entry_update(workspace=workspace, entry_id=mixed["good"].pk, content=JUNK, now=now)
    rows = folded(workspace)
    assert (newer.entry.pk, None) in rows and mixed["good"].pk not in {pk for pk, _ in rows}
    hygiene.count(workspace)  # assesses the new version
    assert dict(folded(workspace))[newer.entry.pk] >= 4  # junk, a copy of the pinned junk
    holds.hold(workspace, [newer.entry.pk], reason=HoldReason.KEEP, actor="op", now=now)
    assert folded(workspace)  # held_at kept in the row, compared when read
    assert HygieneRank.objects.get(entry_id=newer.entry.pk).held_at is not None

    # A new entry, raw SQL past every door, a verdict stored, a purge.
    before = dict(kept(workspace))[mixed["code agent"].pk]
    new_entries.entry_create(workspace=workspace, content=JUNK + " again", now=now)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE memory_entry SET last_feedback = 'wrong' WHERE id = %s", [mixed["good"].pk])
        cursor.execute("UPDATE memory_entry SET source = 'import' WHERE id = %s", [mixed["code agent"].pk])
    rows = folded(workspace)
    assert (mixed["code agent"].pk, before + 1) in rows  # legacy_import's point
    HygieneAssessment.objects.filter(entry_id=mixed["junk"].pk).update(points=9)
    folded(workspace)
    Entry.objects.filter(pk=second.pk).delete()
    assert second.pk not in {pk for pk, _ in folded(workspace)}


def test_a_change_that_reads_nothing_the_rank_reads_leaves_no_mark(workspace, mixed, now):
    folded(workspace)
    entry_signals.entry_record_access(workspace=workspace, entry_id=mixed["junk"].pk, actor="agent", now=now)
    Entry.objects.filter(workspace=workspace).update(importance=0.5)
    assert not HygieneRankDirty.objects.filter(workspace_id=workspace.pk).exists()


def test_the_page_and_counts_equal_the_queue_computed_from_the_entries(workspace, mixed, now):
    for i in range(12):
        make(workspace, now, f"{i} {JUNK}", age_days=30 + i % 4, access_count=3 if i < 2 else 0)
    # Held entries (one past the hold's days), an excluded tag, a kept entry.
    set_hold = Entry.objects.filter(pk__in=[mixed["junk"].pk, mixed["code import"].pk])
    set_hold.update(held_at=now)
    MaintenancePolicy.objects.filter(workspace=workspace).update(operator_hold_days=30)
    Entry.objects.filter(pk=mixed["code import"].pk).update(held_at=now - timedelta(days=31))
    tagged = make(workspace, now, JUNK + " tagged", tags=["keep-me"])
    MaintenancePolicy.objects.filter(workspace=workspace).update(exclude_tags=["keep-me"])
    hygiene_actions.keep(workspace, [mixed["second copy"].pk], actor="op", now=now)
    hygiene.count(workspace)

    expected = reference(workspace)
    assert len(expected) == hygiene.count(workspace) == 15
    for offset, limit in ((0, 50), (0, 5), (5, 5), (14, 5), (100, 5)):
        total, page = hygiene.page(workspace, limit=limit, offset=offset)
        assert [c.id for c in page] == expected[offset : offset + limit]
        assert total == 15
    # Every filter of the console and the command, against the same candidates filtered in Python.
    codes = {r.code for c in hygiene.candidates(workspace) for r in c.reasons}
    assert {"exact_duplicate", "flagged_by_feedback", "legacy_import", "incomplete_fragment"} <= codes
    assert {c.recommendation for c in hygiene.candidates(workspace) if c.score >= 4} == {"archive", "review"}
    for recommendation in (None, "archive", "review"):
        for reason in (None, *sorted(codes)):
            wanted = reference(workspace, recommendation, reason)
            total, page = hygiene.page(workspace, limit=4, recommendation=recommendation, reason=reason)
            assert (total, [c.id for c in page]) == (len(wanted), wanted[:4]), (recommendation, reason)
    ids = {c.id for c in hygiene.page(workspace, limit=50)[1]}
    assert mixed["junk"].pk not in ids and mixed["code import"].pk in ids
    assert tagged.pk not in ids and mixed["second copy"].pk not in ids
    assert hygiene.count(workspace, cap=10) == 11


def test_new_residue_patterns_rebuild_the_rank_and_the_queue_assesses_again(workspace, mixed):
    folded(workspace)
    key = HygieneRankState.objects.get(workspace=workspace).rank_key
    MaintenancePolicy.objects.filter(workspace=workspace).update(residue_patterns=[r"\bsockets\b"])
    total, page = hygiene.page(workspace, limit=50)
    assert HygieneRankState.objects.get(workspace=workspace).rank_key != key
    # GOOD mentions sockets: residue (2) now lists the good entry and the flagged one's 4.
    assert (mixed["good"].pk, 2) in folded(workspace)
    assert (mixed["flagged"].pk, 4) in kept(workspace)
    assert total == len(page) == len(kept(workspace))


def test_many_marks_rebuild_instead_of_folding_one_by_one(workspace, mixed, now):
    folded(workspace)
    Entry.objects.filter(workspace=workspace).update(last_feedback="stale")
    _, patterns = read_policy(workspace)
    assert hygiene_rank.fold(workspace, patterns, rebuild_over=3) == {"folded": 0, "rebuilt": 7}
    Entry.objects.filter(workspace=workspace).update(last_feedback="")
    assert hygiene_rank.fold(workspace, patterns, batch=2)["folded"] >= 10
    assert kept(workspace) == fresh(workspace)


def test_the_rank_of_one_workspace_never_lists_another(workspace, other_workspace, mixed, now):
    theirs = make(other_workspace, now, JUNK)
    hygiene.count(other_workspace)
    assert theirs.pk in {pk for pk, _ in kept(other_workspace)}
    assert theirs.pk not in {c.id for c in hygiene.page(workspace, limit=50)[1]}
    assert hygiene.count(workspace) == 5 and hygiene.count(other_workspace) == 1


@pytest.mark.django_db(transaction=True)
def test_a_failed_fold_claims_nothing(workspace, now, monkeypatch):
    make(workspace, now, JUNK)
    hygiene.count(workspace)
    entry = make(workspace, now, JUNK + " later")
    marks = HygieneRankDirty.objects.filter(workspace_id=workspace.pk).count()
    assert marks

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(hygiene_rank, "_insert", broken)
    _, patterns = read_policy(workspace)
    with pytest.raises(RuntimeError):
        hygiene_rank.fold(workspace, patterns)
    assert HygieneRankDirty.objects.filter(workspace_id=workspace.pk).count() == marks
    monkeypatch.undo()
    with transaction.atomic():
        hygiene_rank.fold(workspace, patterns)
    assert entry.pk in {pk for pk, _ in kept(workspace)} or (entry.pk, None) in kept(workspace)


def test_a_deleted_workspace_leaves_no_rank_rows_marks_or_state(workspace, other_workspace, mixed, now):
    make(other_workspace, now, JUNK)
    hygiene.count(other_workspace)
    make(workspace, now, JUNK + " unfolded")  # a mark not folded yet
    workspace.delete()
    assert not HygieneRankDirty.objects.filter(workspace_id=workspace.pk).exists()
    assert not HygieneRank.objects.filter(workspace_id=workspace.pk).exists()
    assert not HygieneRankState.objects.filter(workspace_id=workspace.pk).exists()
    assert HygieneRank.objects.filter(workspace=other_workspace).count() == 1


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite drops triggers with a rebuilt table")
def test_triggers_a_table_rebuild_dropped_come_back_and_the_rank_is_rebuilt(workspace, mixed, now):
    folded(workspace)
    assert rank_triggers.ensure_sqlite() is False
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER hygiene_rank_entry_update")  # as a rebuild of memory_entry would
    Entry.objects.filter(pk=mixed["good"].pk).update(last_feedback="wrong")  # not marked
    assert not HygieneRankDirty.objects.filter(workspace_id=workspace.pk).exists()

    assert rank_triggers.ensure_sqlite() is True
    assert rank_triggers.ensure_sqlite() is False
    assert (mixed["good"].pk, 2) in folded(workspace)  # rebuilt: the missed change is in
    Entry.objects.filter(pk=mixed["good"].pk).update(last_feedback="")
    assert HygieneRankDirty.objects.filter(workspace_id=workspace.pk).exists()  # marked again


def test_a_mark_on_a_content_copied_many_times_rebuilds_instead(workspace, mixed, now):
    copies = [make(workspace, now, GOOD + " Everywhere.", age_days=20 - i) for i in range(6)]
    folded(workspace)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=copies[0].pk, now=now)
    marks = HygieneRankDirty.objects.filter(workspace_id=workspace.pk).count()
    _, patterns = read_policy(workspace)
    # One mark, but its content names six latest entries: more than 4 rebuilds the rank.
    assert hygiene_rank.fold(workspace, patterns, rebuild_over=4)["rebuilt"] == len(fresh(workspace))
    assert marks and not HygieneRankDirty.objects.filter(workspace_id=workspace.pk).exists()
    assert kept(workspace) == fresh(workspace)


def test_a_rebuild_decided_before_the_lock_yields_to_one_made_meanwhile(workspace, mixed, now):
    folded(workspace)
    _, patterns = read_policy(workspace)
    # The rank is current (another fold rebuilt it while this one waited): fold instead.
    assert hygiene_rank.rebuild(workspace, patterns, unless_within=10) is None
    make(workspace, now, JUNK + " meanwhile")
    assert hygiene_rank.rebuild(workspace, patterns, unless_within=10) is None
    assert hygiene_rank.fold(workspace, patterns)["folded"] >= 1
    # A different key (new patterns) rebuilds.
    MaintenancePolicy.objects.filter(workspace=workspace).update(residue_patterns=[r"\bpool\b"])
    _, patterns = read_policy(workspace)
    assert hygiene_rank.rebuild(workspace, patterns, unless_within=10) == len(fresh(workspace))


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite rebuilds a table to alter it")
@pytest.mark.django_db(transaction=True)
def test_a_migration_that_rebuilds_the_entry_table_runs_and_the_triggers_come_back(workspace, now):
    from django.db import models

    from memory.search_index import ensure_sqlite_index

    entry = make(workspace, now, JUNK)
    hygiene.count(workspace)
    title = Entry._meta.get_field("title")
    longer = models.CharField(max_length=title.max_length + 1, blank=True)
    longer.set_attributes_from_name("title")
    # What ``migrate`` does around its migrations when it has some to apply. Without the drop,
    # renaming the rebuilt table fails: the assessment triggers read memory_entry.
    rank_triggers.drop_before_migrate(sender=None, plan=[("a migration", False)])
    with connection.schema_editor() as editor:
        editor.alter_field(Entry, title, longer)
        editor.alter_field(Entry, longer, title)
    rank_triggers.ensure_after_migrate(sender=None)
    ensure_sqlite_index()

    assert rank_triggers.ensure_sqlite() is False  # all back
    assert not HygieneRankState.objects.exists()  # every rank rebuilt at its next fold
    Entry.objects.filter(pk=entry.pk).update(last_feedback="wrong")
    assert HygieneRankDirty.objects.filter(entry_id=entry.pk).exists()
    assert folded(workspace) == {(entry.pk, 6)}


def _marks(workspace):
    return list(
        HygieneRankDirty.objects.filter(workspace_id=workspace.pk)
        .order_by("id")
        .values_list("entry_id", flat=True)
    )


def test_a_mark_for_every_entry_rebuilds_the_rank_whatever_else_is_marked(workspace, mixed, now):
    folded(workspace)
    _, patterns = read_policy(workspace)
    HygieneRank.objects.filter(workspace=workspace).delete()  # rows lost: only a rebuild brings them back
    entry_signals.entry_feedback(workspace=workspace, entry_id=mixed["good"].pk, signal="stale", now=now)
    HygieneRankDirty.objects.create(workspace_id=workspace.pk, entry_id=rank_triggers.EVERY_ENTRY)
    # Claimed in the second batch of one mark: that claim rolls back and the rank is rebuilt.
    assert hygiene_rank.fold(workspace, patterns, batch=1) == {"folded": 1, "rebuilt": len(fresh(workspace))}
    assert not _marks(workspace) and kept(workspace) == fresh(workspace)
    # A rebuild decided before the lock does not yield to a current key while such a mark waits.
    HygieneRankDirty.objects.create(workspace_id=workspace.pk, entry_id=rank_triggers.EVERY_ENTRY)
    assert hygiene_rank.rebuild(workspace, patterns, unless_within=10) == len(fresh(workspace))


def test_changes_inside_unmarked_leave_one_mark_for_every_entry_and_the_setting_ends_with_them(
    workspace, mixed, now
):
    folded(workspace)
    postgresql = connection.vendor == "postgresql"
    junk, good, flagged = (mixed[k].pk for k in ("junk", "good", "flagged"))  # in id order
    with rank_triggers.unmarked(workspace.pk):
        Entry.objects.filter(pk__in=[good, junk]).update(last_feedback="stale")
        assert _marks(workspace) == ([] if postgresql else [junk, good])
    # PostgreSQL: one mark for the workspace instead of the entries' (SQLite marks every row).
    assert _marks(workspace) == ([rank_triggers.EVERY_ENTRY] if postgresql else [junk, good])
    assert kept(workspace) != fresh(workspace)
    Entry.objects.filter(pk=flagged).update(last_feedback="")  # after it: marked again
    assert _marks(workspace)[-1] == flagged
    assert folded(workspace)
    # Undone with its transaction, the setting too: the next change is marked.
    with pytest.raises(RuntimeError), rank_triggers.unmarked(workspace.pk):
        Entry.objects.filter(pk=good).update(last_feedback="")
        raise RuntimeError("the batch fails")
    assert not _marks(workspace)
    Entry.objects.filter(pk=junk).update(last_feedback="")
    assert _marks(workspace) == [junk]
    folded(workspace)


def test_a_pass_changing_more_entries_than_a_fold_takes_marks_the_workspace_once_per_batch(
    workspace, mixed, now, monkeypatch
):
    folded(workspace)
    ids = sorted(mixed[k].pk for k in ("junk", "good", "second copy", "code agent", "flagged"))
    run = MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="cli")
    ctx = RunContext(workspace=workspace, now=now, policy=PolicyValues(), run=run, batch_size=2)

    def stale_then_back(status: str) -> None:
        done = pass_tools.transition(ctx, Entry.objects.filter(pk__in=ids), to_status=status, reason="stale")
        assert done.ids == ids

    monkeypatch.setattr(hygiene_rank, "REBUILD_OVER", 4)  # five entries: more than a fold takes
    stale_then_back(Status.STALE)
    if connection.vendor == "postgresql":  # three batches, one mark each
        assert _marks(workspace) == [rank_triggers.EVERY_ENTRY] * 3
    else:  # SQLite's row triggers mark every entry
        assert sorted(_marks(workspace)) == ids
    assert kept(workspace) != fresh(workspace)
    folded(workspace)
    assert not {pk for pk, _ in kept(workspace)} & set(ids)
    monkeypatch.setattr(hygiene_rank, "REBUILD_OVER", 5)  # no more than a fold takes: one by one
    stale_then_back(Status.ACTIVE)
    assert sorted(_marks(workspace)) == ids
    assert {mixed[k].pk for k in ("junk", "second copy", "flagged")} <= {pk for pk, _ in folded(workspace)}
    # A pass that reports per-row details reads each batch, then writes it: marked the same.
    monkeypatch.setattr(hygiene_rank, "REBUILD_OVER", 4)
    archived = pass_tools.transition(
        ctx,
        Entry.objects.filter(pk__in=ids),
        to_status=Status.ARCHIVED,
        reason="test",
        detail_fields=("tier",),
    )
    assert archived.ids == ids and len(archived.rows) == 5
    if connection.vendor == "postgresql":
        assert _marks(workspace) == [rank_triggers.EVERY_ENTRY] * 3
    else:
        assert sorted(_marks(workspace)) == ids
    assert not {pk for pk, _ in folded(workspace)} & set(ids)


@pytest.mark.parametrize("rebuild_over", [1, 3, 100])
def test_a_restore_marks_its_rows_or_once_it_wrote_many_the_workspace(
    workspace, mixed, now, monkeypatch, rebuild_over
):
    folded(workspace)
    backup = backups.write_backup(workspace, now=now)
    junk, good = mixed["junk"].pk, mixed["good"].pk
    Entry.objects.filter(pk__in=[junk, good]).update(last_feedback="wrong")
    before = folded(workspace)
    # The backup holds 10 entries; the restore writes the 2 changed since.
    monkeypatch.setattr(hygiene_rank, "REBUILD_OVER", rebuild_over)
    restore.restore_backup(backup_path(backup), force=True, now=now)
    if rebuild_over < 2 and connection.vendor == "postgresql":
        assert _marks(workspace) == [rank_triggers.EVERY_ENTRY]
    else:  # a large backup of few changes marks them one by one: a fold, not a rebuild
        assert sorted(_marks(workspace)) == [junk, good]
    after = folded(workspace)
    assert after != before and (good, 2) not in after  # the feedback undone
