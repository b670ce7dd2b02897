"""The write services of memory.services: entries, versions, tombstones, restore,
links, access, feedback, pinning, and workspace scoping. Every invalid call writes nothing."""

import hashlib
import math
from datetime import timedelta

import pytest
from django.db import connection, transaction

from memory import entry_changes, entry_signals, new_entries, relationships, scoring, write_input, writes
from memory.errors import Conflict, InvalidInput, NotFound
from memory.models import CodeAnchor, Entry, EntryAccess, LifecycleEvent, Relationship, Tag, Tombstone
from memory.policy_model import MaintenancePolicy
from memory.scoring_db import refresh_scores

pytestmark = pytest.mark.django_db

TABLES = (Entry, Entry.tags.through, Tag, CodeAnchor, Relationship, LifecycleEvent, Tombstone, EntryAccess)


# --- helpers -------------------------------------------------------------------------------------


def table_counts():
    return {model.__name__: model.objects.count() for model in TABLES}


def snapshot():
    """Every row of every table the services write, to prove a failed call changed nothing."""
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in TABLES}


def make(workspace, now, content="A memory worth keeping", **kwargs):
    return new_entries.entry_create(workspace=workspace, content=content, now=now, **kwargs)


def reload(entry):
    return Entry.objects.get(pk=entry.pk)


def hand_importance(entry, *, links=0, causal=0, age_days=0.0, anchor="valid"):
    return scoring.importance(
        impact_score=entry.impact_score,
        significance_type=entry.significance_type,
        relationship_count=links,
        causal_count=causal,
        age_days=age_days,
        trust_score=entry.trust_score,
        validation_status=entry.validation_status,
        anchor_status=anchor,
    )


def events_of(entry):
    return list(
        LifecycleEvent.objects.filter(entry_ref=entry.pk)
        .order_by("created_at", "pk")
        .values_list("from_status", "to_status", "reason")
    )


def set_policy(workspace, **values):
    row = MaintenancePolicy.objects.get(workspace=workspace)
    for name, value in values.items():
        setattr(row, name, value)
    row.save()


# --- create --------------------------------------------------------------------------------------


def test_create_stores_tags_anchors_and_links(workspace, now):
    target = make(workspace, now, "the target")
    entry = make(
        workspace,
        now,
        "the source",
        title="Source",
        tags=["infra", " infra ", "db", ""],
        anchors=[
            {"repo": "acme/api", "path": "src/app.py", "commit": "abc123", "line_start": 3, "line_end": 9},
            {"path": "README.md", "status": "stale"},
        ],
        links=[{"to_id": target.pk, "type": "implements"}],
        actor="key:msk_abc",
    )
    assert entry.title == "Source"
    assert sorted(entry.tags.values_list("name", flat=True)) == ["db", "infra"]
    assert set(Tag.objects.filter(workspace=workspace).values_list("name", flat=True)) == {"db", "infra"}
    anchors = {a.path: a for a in entry.anchors.all()}
    assert set(anchors) == {"src/app.py", "README.md"}
    assert (anchors["src/app.py"].repo, anchors["src/app.py"].commit) == ("acme/api", "abc123")
    assert (anchors["src/app.py"].line_start, anchors["src/app.py"].line_end) == (3, 9)
    assert anchors["README.md"].status == "stale"
    assert all(a.workspace_id == workspace.pk for a in anchors.values())
    link = Relationship.objects.get()
    assert (link.from_entry_id, link.to_entry_id, link.type) == (entry.pk, target.pk, "implements")
    assert (link.workspace_id, link.created_by, link.created_at) == (workspace.pk, "key:msk_abc", now)


def test_create_reuses_the_workspace_tag_rows(workspace, now):
    make(workspace, now, "one", tags=["shared"])
    make(workspace, now, "two", tags=["shared", "new"])
    assert Tag.objects.filter(workspace=workspace).count() == 2


def test_create_stores_the_sha256_of_the_normalised_content(workspace, now):
    entry = make(workspace, now, "  line one  \r\nline two\t\r\n\r\n")
    assert entry.content == "  line one  \r\nline two\t\r\n\r\n"  # kept as written
    assert entry.content_hash == hashlib.sha256(b"line one\nline two").hexdigest()


def test_crlf_and_trailing_spaces_hash_the_same_as_lf(workspace, now):
    a = make(workspace, now, "first line\nsecond line")
    b = make(workspace, now, "first line   \r\nsecond line  ")
    c = make(workspace, now, "first line\rsecond line\n")
    assert a.content_hash == b.content_hash == c.content_hash
    assert make(workspace, now, "first line\nsecond  line").content_hash != a.content_hash


def test_a_created_entry_is_its_own_lineage_and_the_latest_version(workspace, now):
    entry = make(workspace, now)
    assert entry.lineage_id == entry.pk
    assert entry.is_latest is True
    assert entry.supersedes_id is None
    assert (entry.status, entry.created_at, entry.updated_at, entry.status_changed_at) == (
        "active",
        now,
        now,
        now,
    )


def test_create_records_a_create_lifecycle_event(workspace, now):
    entry = make(workspace, now, actor="user:ada")
    event = LifecycleEvent.objects.get(entry_ref=entry.pk)
    assert (event.from_status, event.to_status, event.reason) == ("", "active", "create")
    assert (event.actor, event.created_at, event.workspace_id, event.automatic) == (
        "user:ada",
        now,
        workspace.pk,
        False,
    )


@pytest.mark.parametrize(
    "staged_class, days",
    [("procedural", 60), ("conceptual", 60), ("reference", 45), ("analogical", 30), ("evidence", 14)],
)
def test_a_staged_class_makes_a_staged_entry_with_the_class_ttl(workspace, now, staged_class, days):
    entry = make(workspace, now, staged_class=staged_class)
    assert entry.status == "staged"
    assert entry.staged_class == staged_class
    assert entry.ttl_expires_at == entry.created_at + timedelta(days=days)
    assert events_of(entry) == [("", "staged", "create")]


def test_the_staged_ttl_counts_from_an_imported_created_at(workspace, now):
    created = now - timedelta(days=10)
    entry = make(workspace, now, staged_class="evidence", created_at=created)
    assert entry.created_at == created
    assert entry.ttl_expires_at == created + timedelta(days=14)


def test_a_plain_entry_has_no_staged_class_or_ttl(workspace, now):
    entry = make(workspace, now)
    assert (entry.staged_class, entry.ttl_expires_at) == (None, None)


def test_a_bare_new_entry_stores_the_hand_computed_scores(workspace, now):
    entry = make(workspace, now)
    assert entry.importance == pytest.approx(0.15, abs=1e-12)  # recency only, trust × 1.0
    assert entry.retention == pytest.approx(1.0, abs=1e-12)
    assert entry.scored_at == now


def test_stored_scores_use_every_writer_supplied_input(workspace, now):
    entry = make(
        workspace,
        now,
        impact_score=0.8,
        trust_score=0.9,
        validation_status="passed",
        salience=1.5,
        anchors=[{"path": "a.py"}, {"path": "b.py", "status": "stale"}],
    )
    expected = (0.8 * 0.30 + 0.15) * 0.8 * (0.5 + 0.9 + 0.5)
    assert entry.importance == pytest.approx(min(expected, 1.0), abs=1e-9)
    assert entry.importance == pytest.approx(hand_importance(entry, anchor="stale"), abs=1e-9)
    assert entry.retention == pytest.approx(1.5, abs=1e-12)


def test_an_invalidated_anchor_cuts_importance_to_a_tenth(workspace, now):
    entry = make(workspace, now, anchors=[{"path": "gone.py", "status": "invalidated"}, {"path": "ok.py"}])
    assert entry.importance == pytest.approx(0.015, abs=1e-12)


def test_an_old_imported_entry_is_scored_by_its_age(workspace, now):
    entry = make(workspace, now, created_at=now - timedelta(days=45), significance_type="milestone")
    assert entry.importance == pytest.approx((0.5 * 0.30 + 0.5 * 0.15), abs=1e-9)
    assert entry.retention == pytest.approx(math.exp(-0.02 * 45), abs=1e-9)


def test_a_link_raises_the_importance_of_both_ends(workspace, now):
    target = make(workspace, now, "target")
    assert target.importance == pytest.approx(0.15, abs=1e-12)
    source = make(workspace, now, "source", links=[{"to_id": target.pk}])
    expected = 0.15 + 0.35 / 5
    assert source.importance == pytest.approx(expected, abs=1e-9)
    assert reload(target).importance == pytest.approx(expected, abs=1e-9)
    assert reload(target).importance == pytest.approx(hand_importance(target, links=1), abs=1e-9)


def test_a_causal_link_counts_as_a_link_and_as_causal(workspace, now):
    target = make(workspace, now, "the bug")
    source = make(workspace, now, "the fix", links=[{"to_id": target.pk, "type": "resolved"}])
    expected = 0.15 + 0.35 / 5 + 0.20 / 3
    assert source.importance == pytest.approx(expected, abs=1e-9)
    assert reload(target).importance == pytest.approx(hand_importance(target, links=1, causal=1), abs=1e-9)


def test_several_links_at_create_are_all_counted(workspace, now):
    targets = [make(workspace, now, f"target {i}") for i in range(3)]
    source = make(
        workspace,
        now,
        "hub",
        links=[
            {"to_id": t.pk, "type": kind}
            for t, kind in zip(targets, ["caused", "blocked_by", "clarifies"], strict=True)
        ],
    )
    assert source.importance == pytest.approx(hand_importance(source, links=3, causal=2), abs=1e-9)
    for t in targets:
        assert reload(t).scored_at == now


def test_a_link_at_create_to_an_old_version_goes_to_the_latest(workspace, now):
    target = make(workspace, now, "v1")
    latest = entry_changes.entry_update(workspace=workspace, entry_id=target.pk, content="v2", now=now).entry
    source = make(workspace, now, "source", links=[{"to_id": target.pk}])
    link = Relationship.objects.get(from_entry=source)
    assert link.to_entry_id == latest.pk


def test_the_same_link_twice_at_create_is_stored_once(workspace, now):
    target = make(workspace, now, "target")
    make(workspace, now, "source", links=[{"to_id": target.pk}, {"to_id": target.pk, "type": "references"}])
    assert Relationship.objects.count() == 1


def test_content_and_title_at_their_limits_are_accepted(workspace, now):
    entry = make(workspace, now, "x" * 50_000, title="t" * 200)
    assert (len(entry.content), len(entry.title)) == (50_000, 200)


def test_significance_type_empty_string_means_none(workspace, now):
    assert make(workspace, now, significance_type="").significance_type is None


# Each case: (keyword arguments given the ids of a live, another workspace's and a tombstoned
# entry) → the error. None of them may write anything.
INVALID_CREATES = {
    "empty content": (lambda ids: {"content": ""}, InvalidInput),
    "blank content": (lambda ids: {"content": " \n\t "}, InvalidInput),
    "content of 50001 chars": (lambda ids: {"content": "x" * 50_001}, InvalidInput),
    "content not a string": (lambda ids: {"content": 42}, InvalidInput),
    "content with NUL": (lambda ids: {"content": "a\x00b"}, InvalidInput),
    "title of 201 chars": (lambda ids: {"title": "t" * 201}, InvalidInput),
    "impact 1.5": (lambda ids: {"impact_score": 1.5}, InvalidInput),
    "impact -0.1": (lambda ids: {"impact_score": -0.1}, InvalidInput),
    "impact NaN": (lambda ids: {"impact_score": math.nan}, InvalidInput),
    "impact a string": (lambda ids: {"impact_score": "0.5"}, InvalidInput),
    "impact a bool": (lambda ids: {"impact_score": True}, InvalidInput),
    "impact too big for a float": (lambda ids: {"impact_score": 10**400}, InvalidInput),
    "trust -0.1": (lambda ids: {"trust_score": -0.1}, InvalidInput),
    "trust inf": (lambda ids: {"trust_score": math.inf}, InvalidInput),
    "salience 0.1": (lambda ids: {"salience": 0.1}, InvalidInput),
    "salience 2.5": (lambda ids: {"salience": 2.5}, InvalidInput),
    "unknown entry_type": (lambda ids: {"entry_type": "poem"}, InvalidInput),
    "unknown tier": (lambda ids: {"tier": "eternal"}, InvalidInput),
    "unknown source": (lambda ids: {"source": "oracle"}, InvalidInput),
    "unknown significance": (lambda ids: {"significance_type": "huge"}, InvalidInput),
    "unknown validation_status": (lambda ids: {"validation_status": "maybe"}, InvalidInput),
    "unknown staged_class": (lambda ids: {"staged_class": "rumour"}, InvalidInput),
    "unknown field": (lambda ids: {"colour": "blue"}, InvalidInput),
    "status is not writable": (lambda ids: {"status": "archived"}, InvalidInput),
    "importance is not writable": (lambda ids: {"importance": 1.0}, InvalidInput),
    "lineage is not writable": (lambda ids: {"lineage_id": 1}, InvalidInput),
    "pinned a string": (lambda ids: {"pinned": "yes"}, InvalidInput),
    "pinned an int": (lambda ids: {"pinned": 1}, InvalidInput),
    "expires_at a string": (lambda ids: {"expires_at": "2027-01-01"}, InvalidInput),
    "metadata a list": (lambda ids: {"metadata": [1, 2]}, InvalidInput),
    "external_id blank": (lambda ids: {"external_id": "  "}, InvalidInput),
    "tag not a string": (lambda ids: {"tags": ["ok", 3]}, InvalidInput),
    "tag too long": (lambda ids: {"tags": ["x" * 101]}, InvalidInput),
    "too many tags": (lambda ids: {"tags": [f"t{i}" for i in range(51)]}, InvalidInput),
    "anchor without path": (lambda ids: {"anchors": [{"repo": "r"}]}, InvalidInput),
    "anchor not an object": (lambda ids: {"anchors": ["src/a.py"]}, InvalidInput),
    "anchor lines reversed": (
        lambda ids: {"anchors": [{"path": "a", "line_start": 9, "line_end": 2}]},
        InvalidInput,
    ),
    "anchor line zero": (lambda ids: {"anchors": [{"path": "a", "line_start": 0}]}, InvalidInput),
    "anchor unknown status": (lambda ids: {"anchors": [{"path": "a", "status": "fine"}]}, InvalidInput),
    "link not an object": (lambda ids: {"links": [ids["live"]]}, InvalidInput),
    "link id a string": (lambda ids: {"links": [{"to_id": str(ids["live"])}]}, InvalidInput),
    "link unknown type": (lambda ids: {"links": [{"to_id": ids["live"], "type": "loves"}]}, InvalidInput),
    "link to a missing id": (lambda ids: {"links": [{"to_id": 10**9}]}, NotFound),
    "link to another workspace": (lambda ids: {"links": [{"to_id": ids["theirs"]}]}, NotFound),
    "one good and one foreign link": (
        lambda ids: {"links": [{"to_id": ids["live"]}, {"to_id": ids["theirs"]}]},
        NotFound,
    ),
    "link to a tombstoned entry": (lambda ids: {"links": [{"to_id": ids["dead"]}]}, Conflict),
    "duplicate external_id": (lambda ids: {"external_id": "ext-1"}, Conflict),
}


@pytest.mark.parametrize("case", sorted(INVALID_CREATES))
def test_an_invalid_create_raises_and_writes_nothing(workspace, other_workspace, now, case):
    live = make(workspace, now, "live", external_id="ext-1", tags=["existing"])
    theirs = make(other_workspace, now, "theirs")
    dead = make(workspace, now, "dead")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=dead.pk, now=now)
    build, error = INVALID_CREATES[case]
    kwargs = {
        "content": "valid content",
        "tags": ["fresh-tag"],
        "anchors": [{"path": "x.py"}],
        **build({"live": live.pk, "theirs": theirs.pk, "dead": dead.pk}),
    }
    before = snapshot()
    with pytest.raises(error):
        new_entries.entry_create(workspace=workspace, now=now + timedelta(hours=1), **kwargs)
    assert snapshot() == before


def test_the_same_external_id_may_be_used_in_another_workspace(workspace, other_workspace, now):
    make(workspace, now, "mine", external_id="shared")
    assert make(other_workspace, now, "theirs", external_id="shared").external_id == "shared"


# --- update --------------------------------------------------------------------------------------


def test_changed_content_creates_a_new_version(workspace, now):
    old = make(workspace, now, "first text", title="T", external_id="e-1", impact_score=0.4)
    later = now + timedelta(days=30)
    result = entry_changes.entry_update(
        workspace=workspace, entry_id=old.pk, content="second text", now=later
    )
    new = result.entry
    assert result.new_version is True
    assert result.supersedes == old.pk
    assert new.pk != old.pk
    assert (new.supersedes_id, new.lineage_id, new.is_latest) == (old.pk, old.pk, True)
    assert (new.content, new.content_hash) == ("second text", write_input.content_hash("second text"))
    assert (new.title, new.external_id, new.impact_score) == ("T", "e-1", 0.4)
    assert (new.created_at, new.updated_at) == (later, later)
    stored_old = reload(old)
    assert stored_old.is_latest is False
    assert (stored_old.content, stored_old.content_hash) == ("first text", old.content_hash)
    assert (stored_old.created_at, stored_old.lineage_id) == (now, old.pk)


def test_a_new_version_restarts_the_decay_clock(workspace, now):
    old = make(workspace, now, "first text")
    later = now + timedelta(days=60)
    new = entry_changes.entry_update(
        workspace=workspace, entry_id=old.pk, content="second text", now=later
    ).entry
    assert new.retention == pytest.approx(1.0, abs=1e-12)
    assert new.importance == pytest.approx(0.15, abs=1e-12)
    assert new.scored_at == later


def test_other_fields_are_changed_on_the_new_version_too(workspace, now):
    old = make(workspace, now, "first text", trust_score=0.2)
    new = entry_changes.entry_update(
        workspace=workspace, entry_id=old.pk, content="second", trust_score=1.0, title="New", now=now
    ).entry
    assert (new.trust_score, new.title) == (1.0, "New")
    assert reload(old).trust_score == 0.2
    assert new.importance == pytest.approx(0.15 * 1.5, abs=1e-12)


def test_links_anchors_and_tags_move_to_the_new_version(workspace, now):
    out_target = make(workspace, now, "out target")
    in_source = make(workspace, now, "in source")
    old = make(
        workspace,
        now,
        "first",
        tags=["a", "b"],
        anchors=[{"path": "x.py"}],
        links=[{"to_id": out_target.pk, "type": "caused"}],
    )
    relationships.relationship_create(workspace=workspace, from_id=in_source.pk, to_id=old.pk, now=now)
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="second", now=now).entry
    assert sorted(new.tags.values_list("name", flat=True)) == ["a", "b"]
    assert list(new.anchors.values_list("path", flat=True)) == ["x.py"]
    assert not CodeAnchor.objects.filter(entry_id=old.pk).exists()
    links = set(Relationship.objects.values_list("from_entry_id", "to_entry_id", "type"))
    assert links == {(new.pk, out_target.pk, "caused"), (in_source.pk, new.pk, "references")}
    assert new.importance == pytest.approx(hand_importance(new, links=2, causal=1), abs=1e-9)


def test_a_neighbour_keeps_its_importance_value_but_is_rescored(workspace, now):
    neighbour = make(workspace, now, "neighbour")
    old = make(workspace, now, "first", links=[{"to_id": neighbour.pk}])
    before = reload(neighbour).importance
    later = now + timedelta(days=9)
    entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="second", now=later)
    after = reload(neighbour)
    assert after.scored_at == later
    # Still one counted link (now to the new version); only its own recency moved.
    assert after.importance == pytest.approx(hand_importance(after, links=1, age_days=9), abs=1e-9)
    assert before - after.importance == pytest.approx(0.15 * 9 / 90, abs=1e-9)


def test_given_tags_and_anchors_replace_those_of_the_new_version(workspace, now):
    old = make(workspace, now, "first", tags=["a"], anchors=[{"path": "old.py"}])
    new = entry_changes.entry_update(
        workspace=workspace,
        entry_id=old.pk,
        content="second",
        tags=["b"],
        anchors=[{"path": "new.py", "status": "stale"}],
        now=now,
    ).entry
    assert list(new.tags.values_list("name", flat=True)) == ["b"]
    assert list(new.anchors.values_list("path", flat=True)) == ["new.py"]
    assert list(CodeAnchor.objects.filter(entry_id=old.pk).values_list("path", flat=True)) == ["old.py"]
    assert new.importance == pytest.approx(0.15 * 0.8, abs=1e-12)


def test_readers_and_access_counts_are_shared_across_versions(workspace, now):
    set_policy(workspace, breadth_weight=1.0)
    old = make(workspace, now, "first")
    entry_signals.entry_record_access(workspace=workspace, entry_id=old.pk, actor="agent-a", now=now)
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="second", now=now).entry
    assert new.access_count == 1
    new = entry_signals.entry_record_access(workspace=workspace, entry_id=new.pk, actor="agent-b", now=now)
    assert new.access_count == 2
    assert EntryAccess.objects.filter(lineage_id=old.pk).count() == 2
    assert not EntryAccess.objects.exclude(lineage_id=old.pk).exists()
    expected = scoring.retention(
        age_days=0,
        access_count=2,
        days_since_access=0,
        salience=None,
        readers=2,
        params=scoring.DecayParams(breadth_weight=1.0),
    )
    assert new.retention == pytest.approx(expected, abs=1e-9)


def test_a_chain_of_versions_keeps_the_first_id_as_lineage(workspace, now):
    v1 = make(workspace, now, "one")
    v2 = entry_changes.entry_update(workspace=workspace, entry_id=v1.pk, content="two", now=now).entry
    v3 = entry_changes.entry_update(workspace=workspace, entry_id=v2.pk, content="three", now=now).entry
    assert (v3.lineage_id, v3.supersedes_id, v2.supersedes_id) == (v1.pk, v2.pk, v1.pk)
    assert list(Entry.objects.filter(lineage_id=v1.pk, is_latest=True)) == [v3]
    assert Entry.objects.filter(lineage_id=v1.pk).count() == 3


@pytest.mark.parametrize("same", ["hello world", "hello world   ", "hello world\r\n", "  hello world\n\n"])
def test_identical_content_makes_no_version_and_keeps_the_decay_clock(workspace, now, same):
    entry = make(workspace, now, "hello world", title="Old title")
    later = now + timedelta(days=20)
    result = entry_changes.entry_update(
        workspace=workspace, entry_id=entry.pk, content=same, title="New title", impact_score=0.6, now=later
    )
    assert (result.new_version, result.supersedes) == (False, None)
    stored = result.entry
    assert stored.pk == entry.pk
    assert Entry.objects.count() == 1
    assert stored.content == "hello world"
    assert stored.created_at == now
    assert (stored.title, stored.impact_score, stored.updated_at) == ("New title", 0.6, later)
    assert stored.retention == pytest.approx(math.exp(-0.02 * 20), abs=1e-9)
    assert stored.importance == pytest.approx(hand_importance(stored, age_days=20), abs=1e-9)


def test_an_update_without_content_changes_fields_in_place(workspace, now):
    entry = make(workspace, now, "text", tags=["a"])
    stored = entry_changes.entry_update(
        workspace=workspace, entry_id=entry.pk, tags=["b", "c"], anchors=[{"path": "z.py"}], now=now
    ).entry
    assert stored.pk == entry.pk
    assert sorted(stored.tags.values_list("name", flat=True)) == ["b", "c"]
    assert list(stored.anchors.values_list("path", flat=True)) == ["z.py"]


def test_updating_an_old_version_is_a_conflict(workspace, now):
    old = make(workspace, now, "one")
    entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="two", now=now)
    before = snapshot()
    with pytest.raises(Conflict):
        entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="three", now=now)
    with pytest.raises(Conflict):
        entry_changes.entry_update(workspace=workspace, entry_id=old.pk, title="x", now=now)
    assert snapshot() == before


def test_updating_a_tombstoned_entry_is_a_conflict(workspace, now):
    entry = make(workspace, now, "one")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now)
    before = snapshot()
    with pytest.raises(Conflict):
        entry_changes.entry_update(workspace=workspace, entry_id=entry.pk, content="two", now=now)
    with pytest.raises(Conflict):
        entry_changes.entry_update(workspace=workspace, entry_id=entry.pk, title="t", now=now)
    assert snapshot() == before


def test_a_stale_entry_updated_with_new_content_becomes_active(workspace, now):
    old = make(workspace, now, "one")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=old.pk, status="stale", reason="stale", now=now
    )
    later = now + timedelta(days=1)
    new = entry_changes.entry_update(
        workspace=workspace, entry_id=old.pk, content="two", now=later, actor="user:ada"
    ).entry
    assert (new.status, new.status_changed_at) == ("active", later)
    assert reload(old).status == "stale"
    event = LifecycleEvent.objects.get(entry_ref=new.pk)
    assert (event.from_status, event.to_status, event.reason, event.actor) == (
        "stale",
        "active",
        "update",
        "user:ada",
    )


def test_a_staged_entry_stays_staged_when_its_content_changes(workspace, now):
    old = make(workspace, now, "one", staged_class="reference")
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="two", now=now).entry
    assert (new.status, new.staged_class, new.ttl_expires_at) == ("staged", "reference", old.ttl_expires_at)
    assert not LifecycleEvent.objects.filter(entry_ref=new.pk).exists()


def test_external_id_stays_unique_among_latest_versions(workspace, now):
    a = make(workspace, now, "a", external_id="ext-a")
    a2 = entry_changes.entry_update(workspace=workspace, entry_id=a.pk, content="a2", now=now).entry
    assert a2.external_id == "ext-a"  # the old version keeps it too, but is not latest
    with pytest.raises(Conflict):
        make(workspace, now, "b", external_id="ext-a")
    b = make(workspace, now, "b", external_id="ext-b")
    with pytest.raises(Conflict):
        entry_changes.entry_update(workspace=workspace, entry_id=b.pk, external_id="ext-a", now=now)
    with pytest.raises(Conflict):
        entry_changes.entry_update(
            workspace=workspace, entry_id=b.pk, content="b2", external_id="ext-a", now=now
        )
    assert reload(b).external_id == "ext-b"
    # Setting its own external id again is fine, with or without new content.
    entry_changes.entry_update(workspace=workspace, entry_id=a2.pk, external_id="ext-a", now=now)
    a3 = entry_changes.entry_update(
        workspace=workspace, entry_id=a2.pk, content="a3", external_id="ext-a", now=now
    ).entry
    assert a3.external_id == "ext-a"
    assert Entry.objects.filter(external_id="ext-a", is_latest=True).count() == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"content": ""},
        {"content": "x" * 50_001},
        {"title": "t" * 201},
        {"impact_score": 1.5},
        {"salience": 0.1},
        {"tier": "eternal"},
        {"status": "archived"},
        {"pinned": "no"},
        {"tags": [None]},
        {"anchors": [{"path": ""}]},
        {"content": "new text", "trust_score": 2},
    ],
    ids=repr,
)
def test_an_invalid_update_raises_and_writes_nothing(workspace, now, kwargs):
    entry = make(workspace, now, "text", tags=["a"], anchors=[{"path": "a.py"}])
    before = snapshot()
    with pytest.raises(InvalidInput):
        entry_changes.entry_update(
            workspace=workspace, entry_id=entry.pk, now=now + timedelta(days=1), **kwargs
        )
    assert snapshot() == before


def test_updating_a_missing_entry_is_not_found(workspace, now):
    with pytest.raises(NotFound):
        entry_changes.entry_update(workspace=workspace, entry_id=10**9, content="x", now=now)
    with pytest.raises(NotFound):
        entry_changes.entry_update(workspace=workspace, entry_id="abc", content="x", now=now)


# --- tombstone -----------------------------------------------------------------------------------


def test_tombstone_records_the_soft_deletion_and_keeps_the_row(workspace, now):
    entry = make(workspace, now, "to forget")
    tombstone = entry_changes.entry_tombstone(
        workspace=workspace, entry_id=entry.pk, reason="api", actor="key:msk_1", now=now
    )
    assert (tombstone.entry_id, tombstone.entry_ref, tombstone.lineage_ref) == (entry.pk, entry.pk, entry.pk)
    assert (tombstone.reason, tombstone.actor, tombstone.previous_status) == ("api", "key:msk_1", "active")
    assert tombstone.content_hash == entry.content_hash
    assert (tombstone.created_at, tombstone.purge_after) == (now, now + timedelta(days=180))
    assert (tombstone.restored_at, tombstone.purged_at, tombstone.workspace_id) == (None, None, workspace.pk)
    stored = reload(entry)
    assert (stored.status, stored.status_changed_at, stored.content) == ("tombstoned", now, "to forget")
    assert events_of(entry) == [("", "active", "create"), ("active", "tombstoned", "api")]
    assert (
        LifecycleEvent.objects.filter(entry_ref=entry.pk, to_status="tombstoned").get().actor == "key:msk_1"
    )


def test_tombstone_uses_the_policy_tombstone_grace(workspace, now):
    set_policy(workspace, tombstone_grace_days=30)
    entry = make(workspace, now)
    assert entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now).purge_after == (
        now + timedelta(days=30)
    )


def test_tombstone_uses_hard_delete_older_than_days_when_it_is_set(workspace, now):
    set_policy(workspace, hard_delete_older_than_days=7, tombstone_grace_days=30)
    entry = make(workspace, now)
    assert entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now).purge_after == (
        now + timedelta(days=7)
    )


def test_tombstoning_an_archived_entry_records_archived_as_previous_status(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status="archived", reason="manual", now=now
    )
    later = now + timedelta(days=1)
    tombstone = entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=later)
    assert tombstone.previous_status == "archived"
    assert reload(entry).archived_at == now


def test_tombstoning_twice_is_a_conflict(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now)
    before = snapshot()
    with pytest.raises(Conflict):
        entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now + timedelta(days=1))
    assert snapshot() == before
    assert Tombstone.objects.count() == 1


def test_tombstoning_an_old_version_is_a_conflict(workspace, now):
    old = make(workspace, now, "one")
    entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="two", now=now)
    with pytest.raises(Conflict):
        entry_changes.entry_tombstone(workspace=workspace, entry_id=old.pk, now=now)
    assert not Tombstone.objects.exists()


def test_an_unknown_tombstone_reason_is_invalid(workspace, now):
    entry = make(workspace, now)
    before = snapshot()
    with pytest.raises(InvalidInput):
        entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, reason="boredom", now=now)
    assert snapshot() == before


def test_a_neighbour_loses_importance_when_its_only_linked_entry_is_tombstoned(workspace, now):
    neighbour = make(workspace, now, "neighbour")
    entry = make(workspace, now, "entry", links=[{"to_id": neighbour.pk, "type": "caused"}])
    assert reload(neighbour).importance == pytest.approx(0.15 + 0.07 + 0.2 / 3, abs=1e-9)
    later = now + timedelta(hours=1)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=later)
    after = reload(neighbour)
    assert after.scored_at == later
    assert after.importance == pytest.approx(hand_importance(after, age_days=1 / 24), abs=1e-9)
    assert Relationship.objects.count() == 1  # the link itself is kept until purge


# --- restore -------------------------------------------------------------------------------------


def test_restoring_a_tombstoned_entry_returns_it_to_active_and_closes_the_tombstone(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now + timedelta(days=1))
    later = now + timedelta(days=2)
    restored = entry_changes.entry_restore(
        workspace=workspace, entry_id=entry.pk, actor="user:ops", now=later
    )
    assert (restored.status, restored.status_changed_at) == ("active", later)
    tombstone = Tombstone.objects.get()
    assert (tombstone.restored_at, tombstone.purged_at) == (later, None)
    assert events_of(entry) == [
        ("", "active", "create"),
        ("active", "tombstoned", "manual"),
        ("tombstoned", "active", "restore"),
    ]
    assert LifecycleEvent.objects.filter(entry_ref=entry.pk).latest("created_at").actor == "user:ops"


def test_restoring_brings_back_the_neighbours_importance(workspace, now):
    neighbour = make(workspace, now, "neighbour")
    entry = make(workspace, now, "entry", links=[{"to_id": neighbour.pk}])
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now)
    assert reload(neighbour).importance == pytest.approx(0.15, abs=1e-12)
    entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, now=now)
    assert reload(neighbour).importance == pytest.approx(0.22, abs=1e-12)


def test_restoring_an_archived_entry_makes_it_active(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status="archived", reason="manual", now=now
    )
    assert reload(entry).archived_at == now
    restored = entry_changes.entry_restore(
        workspace=workspace, entry_id=entry.pk, now=now + timedelta(days=1)
    )
    assert (restored.status, restored.archived_at) == ("active", None)
    assert events_of(entry)[-2:] == [("active", "archived", "manual"), ("archived", "active", "restore")]


def test_restoring_a_stale_entry_makes_it_active(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status="stale", reason="stale", now=now
    )
    assert entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, now=now).status == "active"


def test_a_staged_entry_that_was_archived_returns_to_staged(workspace, now):
    entry = make(workspace, now, staged_class="evidence")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status="archived", reason="ttl", now=now
    )
    restored = entry_changes.entry_restore(
        workspace=workspace, entry_id=entry.pk, now=now + timedelta(days=1)
    )
    assert restored.status == "staged"


def test_a_staged_entry_archived_then_tombstoned_returns_to_staged(workspace, now):
    entry = make(workspace, now, staged_class="evidence")
    t = now
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status="archived", reason="ttl", now=t
    )
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=t + timedelta(days=1))
    restored = entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, now=t + timedelta(days=2))
    assert restored.status == "staged"
    assert events_of(entry) == [
        ("", "staged", "create"),
        ("staged", "archived", "ttl"),
        ("archived", "tombstoned", "manual"),
        ("tombstoned", "staged", "restore"),
    ]


def test_a_staged_entry_edited_while_archived_still_returns_to_staged(workspace, now):
    old = make(workspace, now, "one", staged_class="reference")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=old.pk, status="archived", reason="ttl", now=now
    )
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="two", now=now).entry
    assert new.status == "archived"
    restored = entry_changes.entry_restore(workspace=workspace, entry_id=new.pk, now=now + timedelta(days=1))
    assert restored.status == "staged"


@pytest.mark.parametrize("staged", [False, True])
def test_restoring_a_live_entry_is_a_conflict(workspace, now, staged):
    entry = make(workspace, now, staged_class="evidence" if staged else None)
    before = snapshot()
    with pytest.raises(Conflict):
        entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, now=now)
    assert snapshot() == before


def test_an_entry_can_be_tombstoned_again_after_a_restore(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now)
    entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, now=now + timedelta(days=1))
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now + timedelta(days=2))
    assert Tombstone.objects.filter(entry=entry).count() == 2
    assert Tombstone.objects.filter(entry=entry, restored_at__isnull=True).count() == 1


def test_set_status_refuses_tombstoned_entries_and_unknown_statuses(workspace, now):
    entry = make(workspace, now)
    with pytest.raises(InvalidInput):
        entry_changes.entry_set_status(
            workspace=workspace, entry_id=entry.pk, status="tombstoned", reason="x", now=now
        )
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now)
    with pytest.raises(Conflict):
        entry_changes.entry_set_status(
            workspace=workspace, entry_id=entry.pk, status="active", reason="x", now=now
        )
    assert reload(entry).status == "tombstoned"


# --- relationships -------------------------------------------------------------------------------


def test_link_creates_a_relationship_and_rescores_both_ends(workspace, now):
    a, b = make(workspace, now, "a"), make(workspace, now, "b")
    rel, created = relationships.relationship_create(
        workspace=workspace, from_id=a.pk, to_id=b.pk, type="blocked_by", actor="user:x", now=now
    )
    assert created is True
    assert (rel.from_entry_id, rel.to_entry_id, rel.type, rel.created_by) == (
        a.pk,
        b.pk,
        "blocked_by",
        "user:x",
    )
    for e in (a, b):
        assert reload(e).importance == pytest.approx(0.15 + 0.07 + 0.2 / 3, abs=1e-9)


def test_a_duplicate_link_returns_the_existing_one(workspace, now):
    a, b = make(workspace, now, "a"), make(workspace, now, "b")
    first, _ = relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=b.pk, now=now)
    again, created = relationships.relationship_create(
        workspace=workspace, from_id=a.pk, to_id=b.pk, type="references", now=now
    )
    assert (again.pk, created) == (first.pk, False)
    assert Relationship.objects.count() == 1
    assert reload(a).importance == pytest.approx(0.22, abs=1e-12)


def test_the_reverse_direction_and_another_type_are_different_links(workspace, now):
    a, b = make(workspace, now, "a"), make(workspace, now, "b")
    relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=b.pk, now=now)
    _, reverse = relationships.relationship_create(workspace=workspace, from_id=b.pk, to_id=a.pk, now=now)
    _, other_type = relationships.relationship_create(
        workspace=workspace, from_id=a.pk, to_id=b.pk, type="clarifies", now=now
    )
    assert (reverse, other_type) == (True, True)
    assert Relationship.objects.count() == 3
    assert reload(a).importance == pytest.approx(hand_importance(a, links=3), abs=1e-9)


def test_linking_again_revives_a_pruned_link(workspace, now):
    a, b = make(workspace, now, "a"), make(workspace, now, "b")
    rel, _ = relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=b.pk, now=now)
    Relationship.objects.filter(pk=rel.pk).update(pruned_at=now)
    again, created = relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=b.pk, now=now)
    assert (again.pk, created, again.pruned_at) == (rel.pk, False, None)
    assert Relationship.objects.get().pruned_at is None


def test_a_self_link_is_invalid(workspace, now):
    a = make(workspace, now, "a")
    before = snapshot()
    with pytest.raises(InvalidInput):
        relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=a.pk, now=now)
    assert snapshot() == before


def test_a_link_between_two_versions_of_one_entry_is_a_self_link(workspace, now):
    old = make(workspace, now, "one")
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="two", now=now).entry
    with pytest.raises(InvalidInput):
        relationships.relationship_create(workspace=workspace, from_id=old.pk, to_id=new.pk, now=now)
    assert not Relationship.objects.exists()


def test_an_old_version_id_resolves_to_the_latest_version(workspace, now):
    old = make(workspace, now, "one")
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="two", now=now).entry
    other = make(workspace, now, "other")
    rel, _ = relationships.relationship_create(workspace=workspace, from_id=other.pk, to_id=old.pk, now=now)
    assert rel.to_entry_id == new.pk
    rel2, _ = relationships.relationship_create(workspace=workspace, from_id=old.pk, to_id=other.pk, now=now)
    assert rel2.from_entry_id == new.pk


@pytest.mark.parametrize("foreign_end", ["from", "to"])
def test_linking_another_workspaces_entry_is_not_found(workspace, other_workspace, now, foreign_end):
    mine = make(workspace, now, "mine")
    theirs = make(other_workspace, now, "theirs")
    ends = (theirs.pk, mine.pk) if foreign_end == "from" else (mine.pk, theirs.pk)
    before = snapshot()
    with pytest.raises(NotFound):
        relationships.relationship_create(workspace=workspace, from_id=ends[0], to_id=ends[1], now=now)
    assert snapshot() == before


@pytest.mark.parametrize("missing", [10**9, 0, -1, 2**63, 2**70, -(2**63) - 1])
def test_linking_a_missing_entry_is_not_found(workspace, now, missing):
    # Ids no row can have (beyond 64 bits too) are not found, never a driver's overflow.
    mine = make(workspace, now, "mine")
    before = snapshot()
    with pytest.raises(NotFound):
        relationships.relationship_create(workspace=workspace, from_id=mine.pk, to_id=missing, now=now)
    with pytest.raises(NotFound):
        relationships.relationship_create(workspace=workspace, from_id=missing, to_id=mine.pk, now=now)
    with pytest.raises(NotFound):
        make(workspace, now, "linked", links=[{"to_id": missing}])
    assert snapshot() == before


@pytest.mark.parametrize("dead_end", ["from", "to"])
def test_linking_a_tombstoned_entry_is_a_conflict(workspace, now, dead_end):
    live, dead = make(workspace, now, "live"), make(workspace, now, "dead")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=dead.pk, now=now)
    ends = (dead.pk, live.pk) if dead_end == "from" else (live.pk, dead.pk)
    before = snapshot()
    with pytest.raises(Conflict):
        relationships.relationship_create(workspace=workspace, from_id=ends[0], to_id=ends[1], now=now)
    assert snapshot() == before


def test_linking_an_archived_entry_is_allowed(workspace, now):
    live, archived = make(workspace, now, "live"), make(workspace, now, "archived")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual", now=now
    )
    _, created = relationships.relationship_create(
        workspace=workspace, from_id=live.pk, to_id=archived.pk, now=now
    )
    assert created


@pytest.mark.parametrize(
    "from_id, to_id, type_",
    [("1", 2, "references"), (1, None, "references"), (True, 2, "references"), (1, 2, "likes")],
)
def test_malformed_link_requests_are_invalid(workspace, now, from_id, to_id, type_):
    make(workspace, now, "a")
    make(workspace, now, "b")
    with pytest.raises(InvalidInput):
        relationships.relationship_create(
            workspace=workspace, from_id=from_id, to_id=to_id, type=type_, now=now
        )
    assert not Relationship.objects.exists()


def test_deleting_a_link_removes_it_and_lowers_importance(workspace, now):
    a, b = make(workspace, now, "a"), make(workspace, now, "b")
    rel, _ = relationships.relationship_create(
        workspace=workspace, from_id=a.pk, to_id=b.pk, type="caused", now=now
    )
    later = now + timedelta(hours=2)
    relationships.relationship_delete(workspace=workspace, relationship_id=rel.pk, now=later)
    assert not Relationship.objects.exists()
    for e in (a, b):
        stored = reload(e)
        assert stored.scored_at == later
        assert stored.importance == pytest.approx(hand_importance(stored, age_days=2 / 24), abs=1e-9)
    assert Entry.objects.count() == 2


def test_deleting_another_workspaces_link_is_not_found(workspace, other_workspace, now):
    a, b = make(other_workspace, now, "a"), make(other_workspace, now, "b")
    rel, _ = relationships.relationship_create(workspace=other_workspace, from_id=a.pk, to_id=b.pk, now=now)
    before = snapshot()
    with pytest.raises(NotFound):
        relationships.relationship_delete(workspace=workspace, relationship_id=rel.pk, now=now)
    assert snapshot() == before


@pytest.mark.parametrize("bad_id", [10**9, "abc", None])
def test_deleting_a_missing_link_is_not_found(workspace, now, bad_id):
    with pytest.raises(NotFound):
        relationships.relationship_delete(workspace=workspace, relationship_id=bad_id, now=now)


# --- access --------------------------------------------------------------------------------------


def test_an_access_counts_and_stamps_the_entry(workspace, now):
    entry = make(workspace, now)
    later = now + timedelta(days=3)
    stored = entry_signals.entry_record_access(
        workspace=workspace, entry_id=entry.pk, actor="agent-a", now=later
    )
    assert (stored.access_count, stored.retrieval_count, stored.last_accessed_at) == (1, 0, later)
    row = EntryAccess.objects.get()
    assert (row.lineage_id, row.actor, row.count, row.first_at, row.last_at, row.workspace_id) == (
        entry.pk,
        "agent-a",
        1,
        later,
        later,
        workspace.pk,
    )


def test_only_a_dispatch_counts_as_a_retrieval(workspace, now):
    entry = make(workspace, now)
    entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor="a", now=now)
    stored = entry_signals.entry_record_access(
        workspace=workspace, entry_id=entry.pk, actor="a", dispatch=True, now=now
    )
    assert (stored.access_count, stored.retrieval_count) == (2, 1)


def test_two_actors_make_two_readers_and_one_actor_twice_makes_one_row(workspace, now):
    entry = make(workspace, now)
    t1, t2 = now + timedelta(hours=1), now + timedelta(hours=2)
    entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor="agent-a", now=t1)
    entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor="agent-a", now=t2)
    entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor="agent-b", now=t2)
    rows = {r.actor: r for r in EntryAccess.objects.all()}
    assert set(rows) == {"agent-a", "agent-b"}
    assert (rows["agent-a"].count, rows["agent-a"].first_at, rows["agent-a"].last_at) == (2, t1, t2)
    assert rows["agent-b"].count == 1
    assert reload(entry).access_count == 3


def test_retention_rises_after_an_access(workspace, now):
    set_policy(workspace, breadth_weight=0.5)
    entry = make(workspace, now, created_at=now - timedelta(days=30))
    before = entry.retention
    assert before == pytest.approx(math.exp(-0.6), abs=1e-9)
    entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor="a", now=now)
    stored = entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor="b", now=now)
    expected = math.exp(-0.6) + 0.6 * math.log(3) * 1.0 * (1 + 0.5 * math.log(2))
    assert stored.retention == pytest.approx(expected, abs=1e-9)
    assert stored.retention > before


def test_a_stale_entry_becomes_active_on_access(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status="stale", reason="stale", now=now
    )
    later = now + timedelta(days=1)
    stored = entry_signals.entry_record_access(
        workspace=workspace, entry_id=entry.pk, actor="agent-a", now=later
    )
    assert (stored.status, stored.status_changed_at) == ("active", later)
    event = LifecycleEvent.objects.filter(entry_ref=entry.pk).latest("created_at")
    assert (event.from_status, event.to_status, event.reason, event.actor) == (
        "stale",
        "active",
        "access",
        "agent-a",
    )


def test_an_access_does_not_change_a_staged_or_archived_status(workspace, now):
    staged = make(workspace, now, "s", staged_class="procedural")
    archived = make(workspace, now, "a")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual", now=now
    )
    for entry, status in ((staged, "staged"), (archived, "archived")):
        stored = entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor="x", now=now)
        assert stored.status == status


def test_accessing_a_tombstoned_entry_is_a_conflict(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now)
    before = snapshot()
    with pytest.raises(Conflict):
        entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor="a", now=now)
    assert snapshot() == before


@pytest.mark.parametrize("actor", ["", "   ", None, 7, "x" * 201])
def test_an_access_needs_an_actor(workspace, now, actor):
    entry = make(workspace, now)
    before = snapshot()
    with pytest.raises(InvalidInput):
        entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor=actor, now=now)
    assert snapshot() == before


# --- reinforce, feedback, pin --------------------------------------------------------------------


def test_reinforce_sets_reinforced_at(workspace, now):
    entry = make(workspace, now)
    later = now + timedelta(days=2)
    stored = entry_signals.entry_reinforce(workspace=workspace, entry_id=entry.pk, now=later)
    assert (stored.reinforced_at, stored.updated_at, stored.scored_at) == (later, later, later)
    assert reload(entry).reinforced_at == later


def test_reinforcing_a_tombstoned_entry_is_a_conflict(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now)
    with pytest.raises(Conflict):
        entry_signals.entry_reinforce(workspace=workspace, entry_id=entry.pk, now=now)
    assert reload(entry).reinforced_at is None


@pytest.mark.parametrize(
    "start, signal, expected",
    [
        (None, "helpful", 1.25),
        (None, "not_helpful", 0.75),
        (1.5, "helpful", 1.75),
        (2.0, "helpful", 2.0),
        (1.0, "not_helpful", 0.75),
        (0.25, "not_helpful", 0.25),
        (0.4, "not_helpful", 0.25),
        (1.9, "stale", 0.25),
        (1.9, "wrong", 0.25),
        (None, "wrong", 0.25),
    ],
)
def test_feedback_steps_salience_within_its_bounds(workspace, now, start, signal, expected):
    entry = make(workspace, now, salience=start)
    later = now + timedelta(minutes=5)
    stored = entry_signals.entry_feedback(workspace=workspace, entry_id=entry.pk, signal=signal, now=later)
    assert stored.salience == pytest.approx(expected, abs=1e-12)
    assert (stored.last_feedback, stored.feedback_at) == (signal, later)
    # A fresh entry's retention is its salience: the new salience is scored at once.
    assert stored.retention == pytest.approx(expected * math.exp(-0.02 * 5 / 1440), abs=1e-9)


def test_repeated_helpful_feedback_stops_at_the_ceiling(workspace, now):
    entry = make(workspace, now)
    for _ in range(10):
        entry = entry_signals.entry_feedback(
            workspace=workspace, entry_id=entry.pk, signal="helpful", now=now
        )
    assert entry.salience == 2.0


def test_feedback_on_a_null_salience_starts_from_the_policy_default(workspace, now):
    set_policy(workspace, salience_default=1.5)
    entry = make(workspace, now)
    stored = entry_signals.entry_feedback(workspace=workspace, entry_id=entry.pk, signal="helpful", now=now)
    assert stored.salience == 1.75


@pytest.mark.parametrize("signal", ["great", "", None, "HELPFUL"])
def test_an_unknown_feedback_signal_is_invalid(workspace, now, signal):
    entry = make(workspace, now)
    before = snapshot()
    with pytest.raises(InvalidInput):
        entry_signals.entry_feedback(workspace=workspace, entry_id=entry.pk, signal=signal, now=now)
    assert snapshot() == before


def test_feedback_on_a_tombstoned_entry_is_a_conflict(workspace, now):
    entry = make(workspace, now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=now)
    with pytest.raises(Conflict):
        entry_signals.entry_feedback(workspace=workspace, entry_id=entry.pk, signal="helpful", now=now)


def test_pin_and_unpin(workspace, now):
    entry = make(workspace, now)
    later = now + timedelta(days=1)
    assert entry_changes.entry_set_pinned(
        workspace=workspace, entry_id=entry.pk, pinned=True, now=later
    ).pinned
    stored = reload(entry)
    assert (stored.pinned, stored.updated_at) == (True, later)
    entry_changes.entry_set_pinned(workspace=workspace, entry_id=entry.pk, pinned=False, now=later)
    assert reload(entry).pinned is False


def test_pinning_an_already_pinned_entry_changes_nothing(workspace, now):
    entry = make(workspace, now, pinned=True)
    before = snapshot()
    entry_changes.entry_set_pinned(
        workspace=workspace, entry_id=entry.pk, pinned=True, now=now + timedelta(days=1)
    )
    assert snapshot() == before


@pytest.mark.parametrize("pinned", ["yes", 1, None])
def test_pinned_must_be_a_boolean(workspace, now, pinned):
    entry = make(workspace, now)
    before = snapshot()
    with pytest.raises(InvalidInput):
        entry_changes.entry_set_pinned(workspace=workspace, entry_id=entry.pk, pinned=pinned, now=now)
    assert snapshot() == before


# --- workspace scoping ---------------------------------------------------------------------------


def _scoped_calls():
    """Each service, called in the other workspace with ids of this workspace's rows."""
    return {
        "entry_get": lambda ws, ids, now: writes.entry_get(workspace=ws, entry_id=ids["live"]),
        "update content": lambda ws, ids, now: entry_changes.entry_update(
            workspace=ws, entry_id=ids["live"], content="hijacked", now=now
        ),
        "update fields": lambda ws, ids, now: entry_changes.entry_update(
            workspace=ws, entry_id=ids["live"], title="hijacked", now=now
        ),
        "tombstone": lambda ws, ids, now: entry_changes.entry_tombstone(
            workspace=ws, entry_id=ids["live"], now=now
        ),
        "restore": lambda ws, ids, now: entry_changes.entry_restore(
            workspace=ws, entry_id=ids["dead"], now=now
        ),
        "set status": lambda ws, ids, now: entry_changes.entry_set_status(
            workspace=ws, entry_id=ids["live"], status="archived", reason="manual", now=now
        ),
        "link mine to theirs": lambda ws, ids, now: relationships.relationship_create(
            workspace=ws, from_id=ids["live"], to_id=ids["theirs"], now=now
        ),
        "link theirs to mine": lambda ws, ids, now: relationships.relationship_create(
            workspace=ws, from_id=ids["theirs"], to_id=ids["live"], now=now
        ),
        "unlink": lambda ws, ids, now: relationships.relationship_delete(
            workspace=ws, relationship_id=ids["link"], now=now
        ),
        "access": lambda ws, ids, now: entry_signals.entry_record_access(
            workspace=ws, entry_id=ids["live"], actor="intruder", dispatch=True, now=now
        ),
        "reinforce": lambda ws, ids, now: entry_signals.entry_reinforce(
            workspace=ws, entry_id=ids["live"], now=now
        ),
        "feedback": lambda ws, ids, now: entry_signals.entry_feedback(
            workspace=ws, entry_id=ids["live"], signal="wrong", now=now
        ),
        "pin": lambda ws, ids, now: entry_changes.entry_set_pinned(
            workspace=ws, entry_id=ids["live"], pinned=True, now=now
        ),
        "create linking mine": lambda ws, ids, now: new_entries.entry_create(
            workspace=ws, content="x", links=[{"to_id": ids["live"]}], now=now
        ),
    }


@pytest.mark.parametrize("call", sorted(_scoped_calls()))
def test_another_workspaces_ids_are_not_found_and_nothing_changes(workspace, other_workspace, now, call):
    live = make(workspace, now, "mine", tags=["t"], anchors=[{"path": "a.py"}])
    helper = make(workspace, now, "helper", links=[{"to_id": live.pk}])
    dead = make(workspace, now, "dead")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=dead.pk, now=now)
    theirs = make(other_workspace, now, "theirs")
    link = Relationship.objects.get(from_entry=helper)
    ids = {"live": live.pk, "dead": dead.pk, "theirs": theirs.pk, "link": link.pk}
    before = snapshot()
    with pytest.raises(NotFound):
        _scoped_calls()[call](other_workspace, ids, now + timedelta(days=1))
    assert snapshot() == before


# --- nothing is deleted --------------------------------------------------------------------------


def test_a_sequence_of_writes_never_removes_an_entry(workspace, now):
    seen = []

    def step():
        count = Entry.objects.count()
        assert not seen or count >= seen[-1]
        seen.append(count)

    t = now
    a = make(workspace, t, "a", tags=["x"])
    step()
    b = make(workspace, t, "b", links=[{"to_id": a.pk, "type": "caused"}], staged_class="conceptual")
    step()
    a2 = entry_changes.entry_update(workspace=workspace, entry_id=a.pk, content="a two", now=t).entry
    step()
    entry_changes.entry_update(workspace=workspace, entry_id=a2.pk, content="a two  ", title="same", now=t)
    step()
    entry_signals.entry_record_access(workspace=workspace, entry_id=b.pk, actor="x", dispatch=True, now=t)
    step()
    entry_signals.entry_feedback(workspace=workspace, entry_id=a2.pk, signal="wrong", now=t)
    step()
    entry_signals.entry_reinforce(workspace=workspace, entry_id=b.pk, now=t)
    step()
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=b.pk, status="archived", reason="manual", now=t
    )
    step()
    entry_changes.entry_tombstone(workspace=workspace, entry_id=b.pk, now=t)
    step()
    entry_changes.entry_tombstone(workspace=workspace, entry_id=a2.pk, now=t)
    step()
    entry_changes.entry_restore(workspace=workspace, entry_id=a2.pk, now=t)
    step()
    entry_changes.entry_restore(workspace=workspace, entry_id=b.pk, now=t)
    step()
    rel, _ = relationships.relationship_create(workspace=workspace, from_id=a2.pk, to_id=b.pk, now=t)
    step()
    links_before = Relationship.objects.count()
    relationships.relationship_delete(workspace=workspace, relationship_id=rel.pk, now=t)
    step()
    assert Relationship.objects.count() == links_before - 1
    entry_changes.entry_set_pinned(workspace=workspace, entry_id=a2.pk, pinned=True, now=t)
    step()
    assert seen[-1] == 3  # a, its new version a2, b
    assert Tombstone.objects.count() == 2
    assert EntryAccess.objects.count() == 1
    assert CodeAnchor.objects.count() == 0
    assert Relationship.objects.count() == 1  # b → a2 (caused) survived everything


def test_a_page_read_names_its_tags_until_the_entry_is_read_again(workspace):
    from memory.selectors import with_tag_names

    entry = new_entries.entry_create(workspace=workspace, content="Tagged note", tags=["alpha"])
    page = with_tag_names(list(Entry.objects.filter(pk=entry.pk)))
    page[0].tags.set([])  # written behind the attached names

    assert page[0].tag_names == ["alpha"]  # as the page read them
    page[0].refresh_from_db()
    assert page[0].tag_names == []


# --- the one-statement write (PostgreSQL) --------------------------------------------------------


def _written(entry):
    """What a create wrote, without the ids it drew: the row, its tags, anchors and event."""
    row = Entry.objects.filter(pk=entry.pk).values().get()
    drop = {"id", "lineage_id", "content", "content_hash", "external_id"}
    if "search_vector" in row:
        row["search_vector"] = str(row["search_vector"]).replace(entry.content, "")
    anchors = list(entry.anchors.order_by("pk").values())
    for anchor in anchors:
        anchor.pop("created_at")  # the clock when the row object was made, in both routes
    events = list(LifecycleEvent.objects.filter(entry=entry).values())
    links = list(Relationship.objects.filter(from_entry=entry).order_by("to_entry_id", "type").values())
    for item in (*anchors, *events, *links):
        for key in ("id", "entry_id", "entry_ref", "from_entry_id"):
            item.pop(key, None)
    return (
        {k: v for k, v in row.items() if k not in drop},
        sorted(entry.tags.values_list("name", flat=True)),
        anchors,
        events,
        links,
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement write is PostgreSQL's")
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"tags": ["a", "b"], "title": "t", "impact_score": 0.7, "salience": 2.0, "expires_at": None},
        {
            "tags": ["a"],
            "anchors": [
                {"path": "x.py", "line_start": 3, "line_end": 9, "status": "stale"},
                {"path": "y.py"},
            ],
            "staged_class": "evidence",
            "metadata": {"k": [1, "two", None]},
            "significance_type": "security",
            "session_key": "s-1",
        },
        {"links": [("first", "caused"), ("second", "references"), ("first", "references")]},
        {
            "tags": ["b"],
            "links": [("first", "resolved"), ("first", "resolved")],
            "anchors": [{"path": "z.py"}],
        },
    ],
)
def test_the_one_statement_write_stores_what_the_orm_write_stores(workspace, now, monkeypatch, fields):
    writes.tags_for_names(workspace, ["a", "b"])  # existing tags: the one-statement route
    targets = {
        name: make(workspace, now, f"target {name}", created_at=now - timedelta(days=3))
        for name in ("first", "second")
    }
    if "links" in fields:
        fields = {**fields, "links": [{"to_id": targets[n].pk, "type": t} for n, t in fields["links"]]}
    routes = []
    real = new_entries._in_one_statement

    def one_statement(*args):
        routes.append(real(*args))
        return routes[-1]

    def scores_as_a_refresh_computes():
        # The write rescored the targets it linked to: their stored scores are what a full
        # refresh computes.
        stored = [(reload(t).importance, reload(t).retention) for t in targets.values()]
        refresh_scores(workspace, now=now)
        refreshed = [(reload(t).importance, reload(t).retention) for t in targets.values()]
        assert [pytest.approx(pair, abs=1e-9) for pair in refreshed] == stored

    monkeypatch.setattr(new_entries, "_in_one_statement", one_statement)
    fast = make(workspace, now, "written in one statement", external_id="fast", **fields)
    scores_as_a_refresh_computes()
    monkeypatch.setattr(new_entries, "_in_one_statement", lambda *args: False)
    slow = make(workspace, now, "written in one statement", external_id="slow", **fields)
    scores_as_a_refresh_computes()
    assert routes == [True]
    assert fast.lineage_id == fast.pk and reload(fast).lineage_id == fast.pk
    assert _written(fast) == _written(slow)
    assert fast.tag_names == slow.tag_names  # the response names the same tags


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement write is PostgreSQL's")
def test_a_write_with_a_new_tag_or_a_checked_rule_goes_through_the_orm(workspace, now, monkeypatch):
    target = make(workspace, now, "target")
    routes = []
    real = new_entries._in_one_statement
    monkeypatch.setattr(
        new_entries, "_in_one_statement", lambda *args: routes.append(real(*args)) or routes[-1]
    )
    make(workspace, now, "new tag", tags=["brand-new"])
    make(workspace, now, "linked", links=[{"to_id": target.pk}])
    make(workspace, now, "rule", entry_type="rule", tier="constitutional")
    make(workspace, now, "plain", tags=["brand-new"])
    assert routes == [False, True, False, True]


@pytest.mark.parametrize("in_callers_transaction", [False, True])
def test_a_linked_create_that_fails_after_its_insert_leaves_nothing(
    workspace, now, monkeypatch, in_callers_transaction
):
    # The entry, its tags, anchor, links and event are written before the targets' rescore:
    # a failure there must take them all back, and leave a caller's transaction usable.
    target = make(workspace, now, "target")
    writes.tags_for_names(workspace, ["a"])
    before = snapshot()

    def broken(*args, **kwargs):
        raise RuntimeError("rescore failed")

    monkeypatch.setattr(new_entries, "rescore_written", broken)
    fields = {"tags": ["a"], "anchors": [{"path": "x.py"}], "links": [{"to_id": target.pk, "type": "caused"}]}
    if in_callers_transaction:
        with transaction.atomic():
            with pytest.raises(RuntimeError):
                make(workspace, now, "linked", **fields)
            assert snapshot() == before
            kept = make(workspace, now, "written after the failure")  # the transaction still works
        assert Entry.objects.filter(pk=kept.pk).exists()
    else:
        with pytest.raises(RuntimeError):
            make(workspace, now, "linked", **fields)
        assert snapshot() == before


@pytest.mark.parametrize("order", ["missing first", "tombstoned first"])
def test_a_missing_link_target_is_reported_before_a_tombstoned_one(workspace, now, order):
    dead = make(workspace, now, "dead")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=dead.pk, now=now)
    ids = [10**9, dead.pk] if order == "missing first" else [dead.pk, 10**9]
    with pytest.raises(NotFound):
        make(workspace, now, "linked", links=[{"to_id": i} for i in ids])


def test_a_concurrent_duplicate_external_id_is_a_conflict_not_an_error(workspace, now, monkeypatch):
    # Another writer takes the id between the check and the insert: the unique index answers,
    # and the service says 409 as for a duplicate it saw.
    make(workspace, now, "first", external_id="dup")
    real_filter = Entry.objects.filter

    class Unseen:
        def exists(self):
            return False

    monkeypatch.setattr(
        Entry.objects,
        "filter",
        lambda *a, **k: Unseen() if k.get("external_id") == "dup" else real_filter(*a, **k),
    )
    before = snapshot()
    with pytest.raises(Conflict):
        make(workspace, now, "second", external_id="dup")
    assert snapshot() == before
