"""Journal import and export: the bundled flask sample goes in with exactly the rows
its raw file describes, a second import changes nothing, bad lines are skipped whole, nothing
crosses workspaces, and export → import → export gives the same bytes."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory import entry_changes, new_entries, relationships
from memory.journal_import import SAMPLE_PATH, import_journal
from memory.models import CodeAnchor, Entry, LifecycleEvent, Relationship, Tag, Tombstone, Workspace

pytestmark = pytest.mark.django_db

# --- what the raw sample file says, computed here without the importer's own tables --------

RAW = [json.loads(line) for line in SAMPLE_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]
RAW_IDS = {r["id"] for r in RAW}
OUR_TYPES = {"development_note", "bug_fix", "release"}


def expected_links() -> tuple[set[tuple[str, str, str]], int]:
    """(from id, to id, link type) of commit references inside the sample, and how many point
    outside it."""
    kinds = {"reverts": "caused", "fixes": "resolved"}
    links, outside = set(), 0
    for r in RAW:
        for ref in r["reference_details"]:
            if ref["kind"] != "commit":
                continue
            if ref["ref"] in RAW_IDS:
                links.add((r["id"], ref["ref"], kinds.get(ref["relation"], "references")))
            else:
                outside += 1
    return links, outside


def expected_tags() -> dict[str, set[str]]:
    out = {}
    for r in RAW:
        issues = {ref["ref"] for ref in r["reference_details"] if ref["kind"] == "issue"}
        own_type = set() if r["entry_type"] in OUR_TYPES else {r["entry_type"]}
        out[r["id"]] = set(r["tags"]) | issues | own_type
    return out


# --- helpers ---------------------------------------------------------------------------------


def run_import(path: Path | str, slug: str) -> dict:
    out = StringIO()
    call_command("import_entries", str(path), "--workspace", slug, "--json", stdout=out)
    return json.loads(out.getvalue())


def run_export(slug: str, path: Path) -> bytes:
    call_command("export_entries", "--workspace", slug, "--output", str(path), stdout=StringIO())
    return path.read_bytes()


def write_jsonl(path: Path, records: list) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def table_sizes() -> dict[str, int]:
    return {
        "entries": Entry.objects.count(),
        "tags": Tag.objects.count(),
        "entry_tags": Entry.tags.through.objects.count(),
        "anchors": CodeAnchor.objects.count(),
        "links": Relationship.objects.count(),
        "events": LifecycleEvent.objects.count(),
        "tombstones": Tombstone.objects.count(),
    }


def link_triples(workspace: Workspace) -> set[tuple[str, str, str]]:
    return set(
        Relationship.objects.filter(workspace=workspace).values_list(
            "from_entry__external_id", "to_entry__external_id", "type"
        )
    )


def by_external_id(workspace: Workspace) -> dict[str, Entry]:
    return {e.external_id: e for e in Entry.objects.filter(workspace=workspace, is_latest=True)}


# --- import of the bundled sample -----------------------------------------------------------


def test_the_bundled_sample_is_a_slice_with_reverts_resolvable_links_and_deleted_files():
    links, outside = expected_links()
    assert len(RAW) == 300
    assert sum(r["entry_type"] == "revert" for r in RAW) >= 2
    assert {t for _, _, t in links} >= {"caused", "references"}
    assert outside > 0
    assert any(a["status"] == "D" for r in RAW for a in r["anchors"])


def test_it_imports_the_sample_with_the_counts_of_the_raw_file(workspace):
    links, outside = expected_links()
    tags = expected_tags()
    counts = run_import(SAMPLE_PATH, workspace.slug)

    assert counts == {
        "workspace": workspace.slug,
        "file": str(SAMPLE_PATH),
        "records": len(RAW),
        "created": len(RAW),
        "updated": 0,
        "unchanged": 0,
        "invalid": 0,
        "links_created": len(links),
        "links_unresolved": outside,
        "anchors_created": sum(len(r["anchors"]) for r in RAW),
        "tags_created": len(set().union(*tags.values())),
        "errors": [],
    }
    entries = Entry.objects.filter(workspace=workspace)
    assert entries.count() == len(RAW)
    assert CodeAnchor.objects.filter(workspace=workspace).count() == counts["anchors_created"]
    assert link_triples(workspace) == links
    assert Counter(t for _, _, t in link_triples(workspace)) == Counter(t for _, _, t in links)
    got_tags: dict[str, set[str]] = {}
    for ext, name in Entry.tags.through.objects.filter(entry__workspace=workspace).values_list(
        "entry__external_id", "tag__name"
    ):
        got_tags.setdefault(ext, set()).add(name)
    assert {ext: got_tags.get(ext, set()) for ext in tags} == tags
    issue_tags = {n for names in tags.values() for n in names if "#" in n}
    assert Tag.objects.filter(workspace=workspace, name__contains="#").count() == len(issue_tags)


def test_reverts_become_caused_links_and_other_types_stay_as_tags(workspace):
    run_import(SAMPLE_PATH, workspace.slug)
    entries = by_external_id(workspace)
    reverts = [r for r in RAW if r["entry_type"] == "revert"]
    for r in reverts:
        entry = entries[r["id"]]
        assert entry.entry_type == "other"
        assert "revert" in set(entry.tags.values_list("name", flat=True))
    reverting = {
        (r["id"], ref["ref"])
        for r in RAW
        for ref in r["reference_details"]
        if ref["kind"] == "commit" and ref["relation"] == "reverts" and ref["ref"] in RAW_IDS
    }
    assert reverting
    assert {(f, t) for f, t, kind in link_triples(workspace) if kind == "caused"} == reverting
    for r in RAW:
        if r["entry_type"] in OUR_TYPES:
            assert entries[r["id"]].entry_type == r["entry_type"]


def test_it_keeps_created_at_and_external_ids(workspace, now):
    run_import(SAMPLE_PATH, workspace.slug)
    entries = by_external_id(workspace)
    assert set(entries) == RAW_IDS
    for r in RAW:
        entry = entries[r["id"]]
        assert entry.created_at == datetime.fromisoformat(r["created_at"])
        assert entry.created_at.utcoffset() == timedelta(0)
        assert entry.content == r["content"]
        assert entry.source == "import"
        assert entry.status == "active"
        assert entry.lineage_id == entry.pk
        assert entry.scored_at is not None


def test_it_keeps_journal_fields_without_a_column_in_metadata(workspace):
    run_import(SAMPLE_PATH, workspace.slug)
    first = RAW[0]
    entry = by_external_id(workspace)[first["id"]]
    for name in ("sha", "author", "committed_at", "files_changed", "parents", "is_merge", "source_repo"):
        assert entry.metadata[name] == first[name]


def test_anchors_of_deleted_files_are_invalidated(workspace):
    run_import(SAMPLE_PATH, workspace.slug)
    want = Counter(
        (r["id"], a["path"], a["commit"], "invalidated" if a["status"] == "D" else "valid")
        for r in RAW
        for a in r["anchors"]
    )
    got = Counter(
        CodeAnchor.objects.filter(workspace=workspace).values_list(
            "entry__external_id", "path", "commit", "status"
        )
    )
    assert got == want
    assert got and any(status == "invalidated" for (_, _, _, status) in got)
    assert set(CodeAnchor.objects.filter(workspace=workspace).values_list("repo", flat=True)) == {
        "pallets/flask"
    }


def test_each_created_entry_has_one_import_event(workspace, now):
    import_journal(workspace=workspace, path=SAMPLE_PATH, now=now)
    events = LifecycleEvent.objects.filter(workspace=workspace)
    assert events.count() == len(RAW)
    assert set(events.values_list("from_status", "to_status", "reason")) == {("", "active", "import")}
    assert set(events.values_list("created_at", flat=True)) == {now}


def test_new_records_are_written_with_a_fixed_number_of_queries(workspace, other_workspace, tmp_path, now):
    # A short slice that still holds one resolvable link, so both imports run every step.
    position = {r["id"]: i for i, r in enumerate(RAW)}
    source, target, _ = min(expected_links()[0], key=lambda link: abs(position[link[0]] - position[link[1]]))
    start, end = sorted((position[source], position[target]))
    small = write_jsonl(tmp_path / "small.jsonl", RAW[start : end + 1])
    assert end + 1 - start < len(RAW) // 5

    with CaptureQueriesContext(connection) as few:
        import_journal(workspace=workspace, path=small, now=now)
    with CaptureQueriesContext(connection) as many:
        import_journal(workspace=other_workspace, path=SAMPLE_PATH, now=now)

    assert len(many) == len(few)
    assert len(many) < 40


# --- idempotence and versions ---------------------------------------------------------------


def test_reimporting_the_same_file_adds_nothing(workspace):
    first = run_import(SAMPLE_PATH, workspace.slug)
    before = table_sizes()
    links_before = link_triples(workspace)

    again = run_import(SAMPLE_PATH, workspace.slug)

    assert table_sizes() == before
    assert link_triples(workspace) == links_before
    assert again["unchanged"] == len(RAW)
    assert again["created"] == again["updated"] == again["invalid"] == 0
    assert again["links_created"] == again["anchors_created"] == again["tags_created"] == 0
    assert again["links_unresolved"] == first["links_unresolved"]


def test_changed_content_on_reimport_creates_a_new_version(workspace, tmp_path, now):
    run_import(SAMPLE_PATH, workspace.slug)
    reverting = next(
        r
        for r in RAW
        if any(ref["relation"] == "reverts" and ref["ref"] in RAW_IDS for ref in r["reference_details"])
    )
    old = by_external_id(workspace)[reverting["id"]]
    old_tags = set(old.tags.values_list("name", flat=True))
    changed = [dict(r, content=r["content"] + "\n\nEdited.") if r is reverting else r for r in RAW]
    path = write_jsonl(tmp_path / "changed.jsonl", changed)

    counts = run_import(path, workspace.slug)

    assert counts["updated"] == 1
    assert counts["unchanged"] == len(RAW) - 1
    assert counts["created"] == counts["links_created"] == 0
    new = by_external_id(workspace)[reverting["id"]]
    old.refresh_from_db()
    assert new.pk != old.pk
    assert new.supersedes_id == old.pk
    assert new.lineage_id == old.lineage_id == old.pk
    assert not old.is_latest
    assert new.content.endswith("Edited.")
    assert old.content == reverting["content"]
    assert set(new.tags.values_list("name", flat=True)) == old_tags
    assert Relationship.objects.filter(from_entry=new, type="caused").count() == 1
    assert not Relationship.objects.filter(from_entry=old).exists()
    assert new.anchors.count() == len(reverting["anchors"])


def test_reimport_does_not_change_fields_the_record_does_not_set(workspace, tmp_path):
    entry = new_entries.entry_create(
        workspace=workspace, content="first", external_id="op-1", source="operator", tier="semantic"
    )
    path = write_jsonl(tmp_path / "op.jsonl", [{"id": "op-1", "content": "second"}])
    counts = run_import(path, workspace.slug)
    assert counts["updated"] == 1
    new = by_external_id(workspace)["op-1"]
    assert new.supersedes_id == entry.pk
    assert (new.source, new.tier, new.content) == ("operator", "semantic", "second")


def test_a_tombstoned_entry_is_not_revived_by_a_reimport(workspace, tmp_path):
    entry = new_entries.entry_create(workspace=workspace, content="gone", external_id="t-1")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk)
    same = write_jsonl(tmp_path / "same.jsonl", [{"id": "t-1", "content": "gone"}])
    other = write_jsonl(tmp_path / "other.jsonl", [{"id": "t-1", "content": "changed"}])

    assert run_import(same, workspace.slug)["unchanged"] == 1
    counts = run_import(other, workspace.slug)

    assert counts["invalid"] == 1
    assert "tombstoned" in counts["errors"][0]
    assert Entry.objects.filter(workspace=workspace).count() == 1
    entry.refresh_from_db()
    assert entry.status == "tombstoned"


def test_a_repeated_id_later_in_the_same_file_is_a_new_version_or_nothing(workspace, tmp_path):
    path = write_jsonl(
        tmp_path / "repeat.jsonl",
        [
            {"id": "r-1", "content": "one"},
            {"id": "r-1", "content": "one"},
            {"id": "r-2", "content": "two"},
            {"id": "r-2", "content": "two, corrected"},
        ],
    )
    counts = run_import(path, workspace.slug)
    assert (counts["created"], counts["unchanged"], counts["updated"]) == (2, 1, 1)
    latest = by_external_id(workspace)
    assert latest["r-2"].content == "two, corrected"
    assert latest["r-2"].supersedes is not None
    assert Entry.objects.filter(workspace=workspace).count() == 3


# --- records written by hand ----------------------------------------------------------------


def test_staged_records_get_the_ttl_of_their_class(workspace, tmp_path):
    created = "2026-03-01T10:00:00+02:00"
    path = write_jsonl(
        tmp_path / "staged.jsonl",
        [
            {
                "id": "s-1",
                "created_at": created,
                "content": "maybe",
                "status": "staged",
                "staged_class": "evidence",
            },
            {"id": "s-2", "created_at": created, "content": "maybe too", "status": "staged"},
            {"id": "s-3", "created_at": created, "content": "old", "status": "archived"},
            {"id": "s-4", "created_at": created, "content": "odd", "status": "tombstoned"},
        ],
    )
    counts = run_import(path, workspace.slug)
    assert counts["created"] == 4
    entries = by_external_id(workspace)
    staged = entries["s-1"]
    assert staged.status == "staged"
    assert staged.staged_class == "evidence"
    assert staged.ttl_expires_at == datetime(2026, 3, 1, 8, tzinfo=UTC) + timedelta(
        days=new_entries.STAGED_TTL_DAYS["evidence"]
    )
    assert (entries["s-2"].status, entries["s-2"].ttl_expires_at) == ("active", None)
    assert entries["s-3"].status == "archived"
    assert entries["s-3"].archived_at is not None
    assert entries["s-4"].status == "active"
    assert LifecycleEvent.objects.get(entry=staged).to_status == "staged"


def test_it_takes_writer_settable_fields_of_a_record(workspace, tmp_path):
    path = write_jsonl(
        tmp_path / "fields.jsonl",
        [
            {
                "id": "w-1",
                "content": "Never deploy on Fridays.",
                "entry_type": "rule",
                "title": "Deploys",
                "tier": "constitutional",
                "source": "operator",
                "pinned": True,
                "impact_score": 0.8,
                "trust_score": 0.9,
                "validation_status": "passed",
                "significance_type": "decision",
                "salience": 1.5,
                "expires_at": "2030-01-01T00:00:00Z",
                "project": "ops",
                "session_key": "s-9",
                "metadata": {"ticket": 7},
                "author": "someone",
            }
        ],
    )
    assert run_import(path, workspace.slug)["created"] == 1
    e = by_external_id(workspace)["w-1"]
    assert (e.entry_type, e.title, e.tier, e.source, e.pinned) == (
        "rule",
        "Deploys",
        "constitutional",
        "operator",
        True,
    )
    assert (e.impact_score, e.trust_score, e.validation_status, e.significance_type, e.salience) == (
        0.8,
        0.9,
        "passed",
        "decision",
        1.5,
    )
    assert e.expires_at == datetime(2030, 1, 1, tzinfo=UTC)
    assert (e.project, e.session_key) == ("ops", "s-9")
    assert e.metadata == {"ticket": 7, "author": "someone"}


def test_it_resolves_links_in_any_order_and_maps_their_relations(workspace, tmp_path):
    path = write_jsonl(
        tmp_path / "links.jsonl",
        [
            {
                "id": "fix",
                "content": "Fix the crash",
                "reference_details": [
                    {"kind": "commit", "ref": "abcdef1234", "relation": "fixes"},
                    {"kind": "commit", "ref": "abcdef1234", "relation": "fixes"},
                    {"kind": "commit", "ref": "0000000aaa", "relation": "mentions"},
                    {"kind": "issue", "ref": "pallets/werkzeug#12", "relation": "mentions"},
                ],
                "links": [{"to": "plain", "type": "blocked_by"}],
            },
            {"id": "plain", "content": "See #5 and abcdef1234", "references": ["#5", "abcdef1234", "zzz"]},
            {"id": "abcdef1234", "content": "The crash", "entry_type": "bug_fix"},
        ],
    )
    counts = run_import(path, workspace.slug)
    assert (counts["links_created"], counts["links_unresolved"]) == (3, 1)
    assert link_triples(workspace) == {
        ("fix", "abcdef1234", "resolved"),
        ("fix", "plain", "blocked_by"),
        ("plain", "abcdef1234", "references"),
    }
    entries = by_external_id(workspace)
    assert set(entries["fix"].tags.values_list("name", flat=True)) == {"pallets/werkzeug#12"}
    assert set(entries["plain"].tags.values_list("name", flat=True)) == {"#5"}


def test_invalid_lines_are_counted_and_nothing_of_them_is_written(workspace, tmp_path):
    path = write_jsonl(
        tmp_path / "bad.jsonl",
        [
            {"id": "ok-1", "content": "fine", "tags": ["shared"]},
            '{"id": "broken", "content": ',
            {"id": "x-empty", "content": "   ", "tags": ["only-invalid"]},
            {"id": "x-tier", "content": "ok", "tier": "cosmic", "tags": ["only-invalid"]},
            {"id": "x-score", "content": "ok", "impact_score": 1.5},
            {"id": "x-long", "content": "a" * 50_001},
            {
                "id": "x-anchor",
                "content": "ok",
                "tags": ["only-invalid"],
                "anchors": [{"path": "a.py"}, {"path": "b.py", "line_start": 9, "line_end": 2}],
                "references": ["#99"],
            },
            "",
            "[1, 2]",
            {"id": "x-date", "content": "ok", "created_at": "yesterday"},
            {"id": "x-nul", "content": "ok", "metadata": {"note": "a\u0000b"}},
            {"id": "x-nan", "content": "ok", "trust_score": float("nan")},
            {"id": "x-list", "content": "ok", "tier": ["semantic"], "links": [{"to": "ok-1", "type": {}}]},
            {"id": "ok-2", "content": "fine too", "links": [{"to": "x-anchor"}]},
        ],
    )
    counts = run_import(path, workspace.slug)

    assert counts["records"] == 13
    assert (counts["created"], counts["invalid"], counts["links_unresolved"]) == (2, 11, 1)
    lines = [int(e.split(":")[0].removeprefix("line ")) for e in counts["errors"]]
    assert lines == [2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13]
    assert set(by_external_id(workspace)) == {"ok-1", "ok-2"}
    assert not CodeAnchor.objects.filter(workspace=workspace).exists()
    assert set(Tag.objects.filter(workspace=workspace).values_list("name", flat=True)) == {"shared"}
    assert LifecycleEvent.objects.filter(workspace=workspace).count() == 2


def test_only_the_first_twenty_errors_are_listed(workspace, tmp_path):
    path = write_jsonl(tmp_path / "many.jsonl", ["nope"] * 25)
    counts = run_import(path, workspace.slug)
    assert counts["invalid"] == 25
    assert len(counts["errors"]) == 20


# --- the commands -----------------------------------------------------------------------------


def test_an_unknown_workspace_is_a_command_error(db):
    with pytest.raises(CommandError, match="workspace 'nowhere' not found"):
        call_command("import_entries", str(SAMPLE_PATH), "--workspace", "nowhere", stdout=StringIO())
    with pytest.raises(CommandError, match="not found"):
        call_command("export_entries", "--workspace", "nowhere", stdout=StringIO())


def test_a_missing_file_is_a_command_error(workspace, tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        call_command("import_entries", str(tmp_path / "none.jsonl"), "--workspace", workspace.slug)


def test_json_output_is_exactly_the_counts(workspace, other_workspace, now):
    out = StringIO()
    call_command("import_entries", str(SAMPLE_PATH), "--workspace", workspace.slug, "--json", stdout=out)
    printed = json.loads(out.getvalue())
    direct = import_journal(workspace=other_workspace, path=SAMPLE_PATH, now=now).as_dict()
    assert printed == {**direct, "workspace": workspace.slug}
    assert list(printed) == [
        "workspace",
        "file",
        "records",
        "created",
        "updated",
        "unchanged",
        "invalid",
        "links_created",
        "links_unresolved",
        "anchors_created",
        "tags_created",
        "errors",
    ]


def test_without_json_it_prints_a_summary(workspace):
    out = StringIO()
    call_command("import_entries", str(SAMPLE_PATH), "--workspace", workspace.slug, stdout=out)
    assert f"{len(RAW)} created" in out.getvalue()
    assert "unresolved" in out.getvalue()


# --- export ----------------------------------------------------------------------------------


def test_export_then_import_then_export_is_byte_identical(workspace, other_workspace, tmp_path, now):
    run_import(SAMPLE_PATH, workspace.slug)
    flask = by_external_id(workspace)
    rule = new_entries.entry_create(
        workspace=workspace,
        content="Always run the tests",
        entry_type="rule",
        title="Tests",
        tier="constitutional",
        source="operator",
        pinned=True,
        impact_score=0.7,
        trust_score=0.25,
        validation_status="passed",
        significance_type="decision",
        salience=1.75,
        expires_at=datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
        project="flask",
        session_key="s-1",
        metadata={"b": 1, "a": {"z": [1, {"y": 2, "x": 3}]}},
        tags=["policy"],
        created_at=now,
        now=now,
        links=[{"to_id": flask[RAW[0]["id"]].pk, "type": "implements"}],
    )
    new_entries.entry_create(
        workspace=workspace, content="A hunch", staged_class="reference", created_at=now, now=now
    )
    relationships.relationship_create(
        workspace=workspace, from_id=flask[RAW[1]["id"]].pk, to_id=rule.pk, type="clarifies"
    )
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=flask[RAW[2]["id"]].pk, status="archived", reason="test"
    )
    relationships.relationship_create(workspace=workspace, from_id=rule.pk, to_id=flask[RAW[3]["id"]].pk)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=flask[RAW[3]["id"]].pk)

    first = run_export(workspace.slug, tmp_path / "first.jsonl")
    counts = run_import(tmp_path / "first.jsonl", other_workspace.slug)
    second = run_export(other_workspace.slug, tmp_path / "second.jsonl")

    assert first == second
    assert counts["invalid"] == counts["links_unresolved"] == 0
    records = [json.loads(line) for line in first.decode().splitlines()]
    assert len(records) == len(RAW) + 2 - 1  # two written by hand, one tombstoned
    assert RAW[3]["id"] not in {r["id"] for r in records}
    by_id = {r["id"]: r for r in records}
    exported_rule = by_id[f"entry-{rule.pk}"]
    assert exported_rule["links"] == [{"to": RAW[0]["id"], "type": "implements"}]
    assert exported_rule["reference_details"] == []  # the link to the tombstoned entry is not written
    assert by_id[RAW[1]["id"]]["links"] == [{"to": f"entry-{rule.pk}", "type": "clarifies"}]
    assert by_id[RAW[2]["id"]]["status"] == "archived"
    assert exported_rule["metadata"] == {"a": {"z": [1, {"x": 3, "y": 2}]}, "b": 1}
    assert [r["created_at"] for r in records] == sorted(r["created_at"] for r in records)


def test_export_writes_commit_links_as_references(workspace):
    run_import(SAMPLE_PATH, workspace.slug)
    out = StringIO()
    call_command("export_entries", "--workspace", workspace.slug, stdout=out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(records) == len(RAW)
    relation = {"caused": "reverts", "resolved": "fixes", "references": "mentions"}
    got = {(r["id"], d["ref"], d["relation"]) for r in records for d in r["reference_details"]}
    assert got == {(f, t, relation[kind]) for f, t, kind in expected_links()[0]}
    assert all(
        set(d) == {"kind", "ref", "relation"} and d["kind"] == "commit"
        for r in records
        for d in r["reference_details"]
    )
    assert all(r["references"] == [d["ref"] for d in r["reference_details"]] for r in records)


def test_export_json_summary_counts_what_was_written(workspace, tmp_path):
    run_import(SAMPLE_PATH, workspace.slug)
    out = StringIO()
    target = tmp_path / "out.jsonl"
    call_command(
        "export_entries", "--workspace", workspace.slug, "--output", str(target), "--json", stdout=out
    )
    summary = json.loads(out.getvalue())
    assert summary["entries"] == len(RAW) == len(target.read_text().splitlines())
    assert summary["anchors"] == sum(len(r["anchors"]) for r in RAW)
    assert summary["links"] == len(expected_links()[0])


# --- workspaces -----------------------------------------------------------------------------


def snapshot(workspace: Workspace) -> dict[str, list]:
    return {
        "entries": list(Entry.objects.filter(workspace=workspace).order_by("pk").values()),
        "links": list(Relationship.objects.filter(workspace=workspace).order_by("pk").values()),
        "tags": list(Tag.objects.filter(workspace=workspace).order_by("pk").values()),
        "entry_tags": list(
            Entry.tags.through.objects.filter(entry__workspace=workspace).order_by("pk").values()
        ),
        "anchors": list(CodeAnchor.objects.filter(workspace=workspace).order_by("pk").values()),
        "events": list(LifecycleEvent.objects.filter(workspace=workspace).order_by("pk").values()),
    }


def test_import_never_touches_another_workspace(workspace, other_workspace):
    links, _ = expected_links()
    linked_ids = sorted({f for f, _, _ in links} | {t for _, t, _ in links})
    others = {}
    for ext in [*linked_ids, RAW[0]["id"]]:
        others[ext] = new_entries.entry_create(
            workspace=other_workspace,
            content=f"other {ext}",
            external_id=ext,
            tags=["#1"],
            anchors=[{"path": "x.py"}],
        )
    relationships.relationship_create(
        workspace=other_workspace, from_id=others[linked_ids[0]].pk, to_id=others[linked_ids[1]].pk
    )
    before = snapshot(other_workspace)

    counts = run_import(SAMPLE_PATH, workspace.slug)
    run_import(SAMPLE_PATH, workspace.slug)

    assert counts["created"] == len(RAW)
    assert snapshot(other_workspace) == before
    assert link_triples(workspace) == links
    ours = Relationship.objects.filter(workspace=workspace)
    assert not ours.exclude(from_entry__workspace=workspace).exists()
    assert not ours.exclude(to_entry__workspace=workspace).exists()
    assert not Relationship.objects.filter(
        from_entry__workspace=workspace, to_entry__workspace=other_workspace
    ).exists()
    assert not Relationship.objects.filter(
        from_entry__workspace=other_workspace, to_entry__workspace=workspace
    ).exists()
