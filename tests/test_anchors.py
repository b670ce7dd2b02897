"""Code anchor checks against a real git checkout and against files reported by a client
(the CodeAnchor model, POST /anchors/check and the check_anchors command)."""

from __future__ import annotations

import json
import subprocess
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from maintenance.anchors import check_anchor_files, check_anchors, normalise_path
from memory import new_entries, scoring
from memory.errors import InvalidInput
from memory.models import CodeAnchor, Entry

pytestmark = pytest.mark.django_db


# --- a small real repository -----------------------------------------------------------------------


def git(repo, *args):
    result = subprocess.run(
        [
            "git",
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "init.defaultBranch=main",
            "-C",
            str(repo),
            *args,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip()


def commit_all(repo, message):
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


class Checkout(type(Path())):  # type: ignore[misc]
    """A path that also remembers the first commit of the repository it points at."""

    first: str


@pytest.fixture
def repo(tmp_path):
    """Commit 1 adds keep.py, change.py, gone.py and docs/guide.md; commit 2 modifies change.py,
    deletes gone.py and adds later.py. ``repo.first`` is the first commit's hash."""
    path = Checkout(tmp_path / "checkout")
    path.mkdir()
    git(path, "init", "-q")
    (path / "docs").mkdir()
    for name, text in {
        "keep.py": "KEEP = 1\n",
        "change.py": "VALUE = 1\n",
        "gone.py": "OLD = 1\n",
        "docs/guide.md": "# Guide\n",
    }.items():
        (path / name).write_text(text)
    first = commit_all(path, "first")
    (path / "change.py").write_text("VALUE = 2\n")
    (path / "gone.py").unlink()
    (path / "later.py").write_text("LATER = 1\n")
    commit_all(path, "second")
    path.first = first
    return path


def anchored(workspace, now, path, commit, *, repo="", content_hash="", content=None):
    return new_entries.entry_create(
        workspace=workspace,
        content=content or f"A note about {path} that is long enough to matter",
        now=now,
        anchors=[{"path": path, "commit": commit, "repo": repo, "content_hash": content_hash}],
    )


def anchor_of(entry):
    return CodeAnchor.objects.get(entry=entry)


def expected_importance(entry, anchor_status):
    return scoring.importance(
        impact_score=entry.impact_score,
        significance_type=entry.significance_type,
        relationship_count=0,
        causal_count=0,
        age_days=0.0,
        trust_score=entry.trust_score,
        validation_status=entry.validation_status,
        anchor_status=anchor_status,
    )


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


# --- check_anchors against git ---------------------------------------------------------------------


def test_it_marks_unchanged_valid_modified_stale_and_deleted_invalidated(workspace, now, repo):
    keep = anchored(workspace, now, "keep.py", repo.first)
    change = anchored(workspace, now, "change.py", repo.first)
    gone = anchored(workspace, now, "gone.py", repo.first)
    guide = anchored(workspace, now, "docs/guide.md", repo.first)

    counts = check_anchors(workspace, repo, now=now)

    assert counts == {"checked": 4, "valid": 2, "stale": 1, "invalidated": 1, "changed": 2}
    assert [anchor_of(e).status for e in (keep, change, gone, guide)] == [
        "valid",
        "stale",
        "invalidated",
        "valid",
    ]
    assert all(anchor_of(e).checked_at == now for e in (keep, change, gone, guide))


def test_stale_and_invalidated_anchors_cut_importance(workspace, now, repo):
    keep = anchored(workspace, now, "keep.py", repo.first)
    change = anchored(workspace, now, "change.py", repo.first)
    gone = anchored(workspace, now, "gone.py", repo.first)
    before = {e.pk: Entry.objects.get(pk=e.pk).importance for e in (keep, change, gone)}

    check_anchors(workspace, repo, now=now)

    after = {e.pk: Entry.objects.get(pk=e.pk).importance for e in (keep, change, gone)}
    assert after[keep.pk] == pytest.approx(expected_importance(keep, "valid"), abs=1e-9)
    assert after[change.pk] == pytest.approx(expected_importance(change, "stale"), abs=1e-9)
    assert after[gone.pk] == pytest.approx(expected_importance(gone, "invalidated"), abs=1e-9)
    assert after[keep.pk] == pytest.approx(before[keep.pk], abs=1e-9)
    assert after[change.pk] == pytest.approx(before[change.pk] * 0.8, abs=1e-9)
    assert after[gone.pk] == pytest.approx(before[gone.pk] * 0.1, abs=1e-9)


def test_a_commit_the_repository_does_not_know_makes_an_existing_file_stale(workspace, now, repo):
    unknown = anchored(workspace, now, "keep.py", "deadbeef" * 5)
    unknown_gone = anchored(workspace, now, "gone.py", "deadbeef" * 5)

    check_anchors(workspace, repo, now=now)

    assert anchor_of(unknown).status == "stale"
    assert anchor_of(unknown_gone).status == "invalidated"


def test_an_anchor_without_a_commit_is_valid_while_its_file_exists(workspace, now, repo):
    entry = anchored(workspace, now, "change.py", "")

    check_anchors(workspace, repo, now=now)

    assert anchor_of(entry).status == "valid"


def test_an_anchor_at_head_or_with_a_short_hash_is_compared_too(workspace, now, repo):
    head = git(repo, "rev-parse", "HEAD")
    at_head = anchored(workspace, now, "change.py", head)
    short = anchored(
        workspace, now, "change.py", repo.first[:10], content="Another note about change.py here"
    )

    check_anchors(workspace, repo, now=now)

    assert anchor_of(at_head).status == "valid"
    assert anchor_of(short).status == "stale"


def test_paths_are_compared_in_their_repository_relative_form(workspace, now, repo):
    entry = anchored(workspace, now, "./docs/guide.md", repo.first)

    check_anchors(workspace, repo, now=now)

    assert anchor_of(entry).status == "valid"
    assert normalise_path("/src\\app.py") == "src/app.py"


def test_a_commit_that_looks_like_an_option_never_reaches_git(workspace, now, repo):
    # Given to git diff, this would write the diff to a file (relative to the checkout).
    entry = anchored(workspace, now, "keep.py", "--output=pwned")

    check_anchors(workspace, repo, now=now)

    assert anchor_of(entry).status == "stale"
    assert not (repo / "pwned").exists()


def test_uncommitted_edits_do_not_count(workspace, now, repo):
    entry = anchored(workspace, now, "keep.py", repo.first)
    (repo / "keep.py").write_text("KEEP = 2\n")
    (repo / "docs" / "guide.md").unlink()

    check_anchors(workspace, repo, now=now)

    assert anchor_of(entry).status == "valid"


def test_a_second_check_changes_nothing(workspace, now, repo):
    anchored(workspace, now, "change.py", repo.first)
    check_anchors(workspace, repo, now=now)

    again = check_anchors(workspace, repo, now=now)

    assert again == {"checked": 1, "valid": 0, "stale": 1, "invalidated": 0, "changed": 0}


def test_a_file_restored_unchanged_makes_its_anchor_valid_again(workspace, now, repo):
    entry = anchored(workspace, now, "gone.py", repo.first)
    check_anchors(workspace, repo, now=now)
    (repo / "gone.py").write_text("OLD = 1\n")
    commit_all(repo, "restore")

    counts = check_anchors(workspace, repo, now=now)

    assert anchor_of(entry).status == "valid"
    assert counts["changed"] == 1
    assert Entry.objects.get(pk=entry.pk).importance == pytest.approx(
        expected_importance(entry, "valid"), abs=1e-9
    )


def test_another_workspaces_anchors_are_untouched(workspace, other_workspace, now, repo):
    anchored(workspace, now, "gone.py", repo.first)
    theirs = anchored(other_workspace, now, "gone.py", repo.first)
    importance = Entry.objects.get(pk=theirs.pk).importance

    check_anchors(workspace, repo, now=now)

    anchor = anchor_of(theirs)
    assert (anchor.status, anchor.checked_at) == ("valid", None)
    assert Entry.objects.get(pk=theirs.pk).importance == importance


def test_a_repo_name_limits_the_check_to_that_repo_and_blank_ones(workspace, now, repo):
    mine = anchored(workspace, now, "gone.py", repo.first, repo="mine")
    blank = anchored(workspace, now, "gone.py", repo.first, content="Another note about gone.py here")
    elsewhere = anchored(
        workspace, now, "gone.py", repo.first, repo="elsewhere", content="A third gone.py note"
    )

    counts = check_anchors(workspace, repo, repo_name="mine", now=now)

    assert counts["checked"] == 2
    assert [anchor_of(e).status for e in (mine, blank, elsewhere)] == ["invalidated", "invalidated", "valid"]


def test_a_path_that_is_not_a_git_checkout_is_refused(workspace, now, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()

    with pytest.raises(InvalidInput, match="not a git checkout"):
        check_anchors(workspace, plain, now=now)
    with pytest.raises(InvalidInput, match="not a directory"):
        check_anchors(workspace, tmp_path / "missing", now=now)


def test_the_check_reads_and_writes_set_based(workspace, now, repo, django_assert_max_num_queries):
    for i in range(30):
        anchored(
            workspace, now, ("keep.py", "change.py", "gone.py")[i % 3], repo.first, content=f"Note {i} " * 5
        )

    # policy, anchors, one UPDATE per status, the rescore (plus savepoints): never one per anchor
    with django_assert_max_num_queries(12):
        counts = check_anchors(workspace, repo, now=now)

    assert counts == {"checked": 30, "valid": 10, "stale": 10, "invalidated": 10, "changed": 20}


# --- the check_anchors command ----------------------------------------------------------------------


def test_the_command_prints_the_counts_as_json(workspace, now, repo):
    anchored(workspace, now, "keep.py", repo.first)
    anchored(workspace, now, "gone.py", repo.first)

    data = json.loads(run("check_anchors", "--repo", str(repo), "--workspace", "acme", "--json"))

    assert data == {"checked": 2, "valid": 1, "stale": 0, "invalidated": 1, "changed": 1}


def test_the_command_prints_a_summary_line(workspace, now, repo):
    anchored(workspace, now, "change.py", repo.first)

    output = run("check_anchors", "--repo", str(repo), "--workspace", "acme")

    assert "1 anchor(s) of acme: 0 valid, 1 stale, 0 invalidated" in output


def test_the_command_refuses_a_path_that_is_not_a_git_checkout(workspace, tmp_path):
    with pytest.raises(CommandError, match="not a git checkout"):
        run("check_anchors", "--repo", str(tmp_path), "--workspace", "acme")


def test_the_command_refuses_an_unknown_workspace(db, repo):
    with pytest.raises(CommandError):
        run("check_anchors", "--repo", str(repo), "--workspace", "nobody")


# --- check_anchor_files (POST /anchors/check) -----------------------------------------------------


def test_reported_files_mark_anchors_by_their_content_hash(workspace, now):
    same = anchored(workspace, now, "a.py", "", repo="app", content_hash="h-a")
    edited = anchored(workspace, now, "b.py", "", repo="app", content_hash="h-b")
    deleted = anchored(workspace, now, "c.py", "", repo="app", content_hash="h-c")
    untouched = anchored(workspace, now, "d.py", "", repo="app", content_hash="h-d")

    counts = check_anchor_files(
        workspace,
        "app",
        [
            {"path": "a.py", "content_hash": "h-a"},
            {"path": "./b.py", "content_hash": "h-b2"},
            {"path": "c.py", "content_hash": None},
        ],
        now=now,
    )

    assert counts == {"checked": 3, "valid": 1, "stale": 1, "invalidated": 1, "changed": 2}
    assert [anchor_of(e).status for e in (same, edited, deleted, untouched)] == [
        "valid",
        "stale",
        "invalidated",
        "valid",
    ]
    assert anchor_of(untouched).checked_at is None
    assert Entry.objects.get(pk=edited.pk).importance == pytest.approx(
        expected_importance(edited, "stale"), abs=1e-9
    )
    assert Entry.objects.get(pk=deleted.pk).importance == pytest.approx(
        expected_importance(deleted, "invalidated"), abs=1e-9
    )


def test_without_a_stored_hash_only_a_deletion_or_a_reappearance_says_something(workspace, now):
    present = anchored(workspace, now, "a.py", "", repo="app")
    back = anchored(workspace, now, "b.py", "", repo="app")
    CodeAnchor.objects.filter(entry=back).update(status="invalidated")
    removed = anchored(workspace, now, "c.py", "", repo="app")

    check_anchor_files(
        workspace,
        "app",
        [{"path": "a.py", "content_hash": "x"}, {"path": "b.py", "content_hash": "y"}, {"path": "c.py"}],
        now=now,
    )

    assert [anchor_of(e).status for e in (present, back, removed)] == ["valid", "stale", "invalidated"]


def test_reported_files_touch_only_that_repo_blank_repos_and_this_workspace(workspace, other_workspace, now):
    mine = anchored(workspace, now, "a.py", "", repo="app", content_hash="h")
    blank = anchored(workspace, now, "a.py", "", content_hash="h", content="Another note about a.py here")
    elsewhere = anchored(
        workspace, now, "a.py", "", repo="lib", content_hash="h", content="A third a.py note"
    )
    theirs = anchored(other_workspace, now, "a.py", "", repo="app", content_hash="h")

    counts = check_anchor_files(workspace, "app", [{"path": "a.py", "content_hash": None}], now=now)

    assert counts["checked"] == 2
    assert [anchor_of(e).status for e in (mine, blank, elsewhere, theirs)] == [
        "invalidated",
        "invalidated",
        "valid",
        "valid",
    ]


def test_an_empty_report_changes_nothing(workspace, now):
    anchored(workspace, now, "a.py", "", repo="app", content_hash="h")

    assert check_anchor_files(workspace, "app", [], now=now)["checked"] == 0


def test_a_reported_file_needs_a_path(workspace, now):
    with pytest.raises(InvalidInput, match="path"):
        check_anchor_files(workspace, "app", [{"content_hash": "h"}], now=now)


def test_reported_files_are_checked_set_based(workspace, now, django_assert_max_num_queries):
    for i in range(40):
        anchored(workspace, now, f"f{i}.py", "", repo="app", content_hash="h")
    files = [{"path": f"f{i}.py", "content_hash": ("h", "other", None)[i % 3]} for i in range(40)]

    with django_assert_max_num_queries(12):
        counts = check_anchor_files(workspace, "app", files, now=now)

    assert (counts["valid"], counts["stale"], counts["invalidated"]) == (14, 13, 13)
