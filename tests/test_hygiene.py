"""Hygiene and the low-quality pass (pass 6): every detector with its
boundaries, the preview's filters and order, apply and keep, and pass 6 in a full run."""

import json
import unicodedata
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from maintenance import hygiene, hygiene_actions, hygiene_text
from maintenance.hygiene_text import (
    Reason,
    assess,
    code_heavy,
    code_share,
    compile_residue_patterns,
    exact_duplicate,
    flagged_by_feedback,
    implementation_residue,
    incomplete_fragment,
    is_code_line,
    legacy_import,
    recommend,
    score,
    truncated_or_unbalanced,
)
from maintenance.models import HygieneAssessment, MaintenanceRun
from maintenance.pass_tools import RunContext
from maintenance.revert import revert_run
from maintenance.run_start import run_maintenance
from memory import entry_changes, entry_signals, new_entries
from memory.models import Entry, LifecycleEvent
from memory.policy import clean_residue_patterns
from memory.policy_model import MaintenancePolicy
from tests.helpers_scores import set_scores

pytestmark = pytest.mark.django_db

# Nine content words and nothing a detector objects to: scores 0 from an agent.
GOOD = "The connection pool keeps twelve sockets open between deploys and retries failed handshakes."
# Fragment (2) + truncated (2) = 4: recommended for archive when never accessed.
JUNK = "half done..."


def codes(reasons):
    return [r.code for r in reasons]


def only(reason, code):
    assert reason is not None and reason.code == code
    return reason


# --- incomplete_fragment -------------------------------------------------------------------

EIGHT = "alpha bravo charlie delta echo foxtrot golf hotel"


def test_fewer_than_nine_content_words_is_a_fragment():
    reason = only(incomplete_fragment("", EIGHT), "incomplete_fragment")
    assert reason.points == 2
    assert reason.detail == "8 content words (fewer than 9)"
    assert incomplete_fragment("", EIGHT + " india") is None


def test_title_words_count_with_the_content():
    assert incomplete_fragment("india", EIGHT) is None


def test_stop_words_and_short_words_are_not_content_words():
    assert "8 content words" in incomplete_fragment("", "the and for with ab cd ef 42 " + EIGHT).detail
    assert incomplete_fragment("", "pool").detail == "1 content word (fewer than 9)"


def test_cjk_text_counts_each_character():
    assert incomplete_fragment("", "数据库连接池在高负载下耗尽") is None


def test_accented_words_count_also_when_decomposed():
    text = "café résumé naïve élan straße façade garçon émigré déjà"
    assert incomplete_fragment("", text) is None
    assert incomplete_fragment("", unicodedata.normalize("NFD", text)) is None
    assert incomplete_fragment("", unicodedata.normalize("NFD", "café résumé naïve élan")).detail.startswith(
        "4 "
    )


# --- truncated_or_unbalanced ---------------------------------------------------------------


def problem(content, title=""):
    reason = truncated_or_unbalanced(title, content)
    return reason.detail if reason else None


@pytest.mark.parametrize(
    ("title", "content", "detail"),
    [
        ("", "We stopped here…", "content ends in '…'"),
        ("", "We stopped here...  \n", "content ends in '...'"),
        ("Cut off…", GOOD, "title ends in '…'"),
        ("Cut off...", GOOD, "title ends in '...'"),
    ],
)
def test_an_ellipsis_at_the_end_is_truncation(title, content, detail):
    reason = only(truncated_or_unbalanced(title, content), "truncated_or_unbalanced")
    assert reason.points == 2 and reason.detail == detail


def test_an_ellipsis_inside_or_after_etc_is_not_truncation():
    assert problem("Wait... then it worked.") is None
    assert problem("Caches, queues, sessions etc...") is None


def test_unclosed_code_fence():
    assert problem("Example:\n```python\nx = 1\n") == "unclosed code fence"
    assert problem("Example:\n```python\nx = (1\n```\nDone.") is None
    # a closing fence at the end of a line still closes (the ``` count is even)
    assert problem("```\ntraceback (most recent call last)\nImportError: x```") is None


def test_stray_inline_backtick_but_balanced_inline_code_is_fine():
    assert problem("Use `url_for to build links.") == "unmatched inline backtick"
    assert problem("Use `url_for()` to build links.") is None
    assert problem("Use ``url_for()`` (reStructuredText) and `g`.") is None


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        ("Retries (three of them are enough.", "unclosed '('"),
        ("Retries three of them] are enough.", "unmatched ']'"),
        ("Mixed [up (order] here).", "unmatched ']'"),
        ("Restored 2.5 compatibility{", "unclosed '{'"),
    ],
)
def test_unbalanced_brackets(content, detail):
    assert problem(content) == detail


@pytest.mark.parametrize(
    "content",
    [
        "Balanced (round [square {curly}]) brackets.",
        "Code is ignored: `f(` and ``g[`` and\n```\nh{\n```",
        "Steps:\n1) install\n2) configure (carefully)\na) first\n  iv) fourth and 10) tenth",
        "As noted (see 1) it works.",
        "So far just the stable parts :) and :-( and ;)",
        "Merge pull request #123 from x/y",
        "Fix the session cookie (#1234)",
        "(see https://example.com/a_(b)) and (https://fishshell.com): ok",
        "Read [the docs](https://en.wikipedia.org/wiki/Foo_(bar)).",
        "Bump tox from 3.15.1 to 3.15.2\n- [Commits](https://github.com/tox-dev/tox/compare/3.15.1...3.15.2)",
        "Signed-off-by: Someone <email> for release 2.0.1",
        "Compute x =(a+b) and (so far :))",
    ],
)
def test_things_that_are_not_unbalanced(content):
    assert problem(content) is None


def test_quotes():
    assert problem('He said "use the pool.') == 'odd number of " quotes (1)'
    assert problem('He said "use the pool."') is None
    assert problem("He said “use the pool.") == "odd number of “ ” „ quotes (1)"
    assert problem("Er sagte „nimm den Pool“.") is None
    assert problem("Il a dit «utilise le pool.") == "odd number of « » quotes (1)"
    assert problem("Il a dit «utilise le pool».") is None
    assert problem("Don't count apostrophes: it's the pool's job, 'quoted' too.") is None
    assert problem('A quote in code `"` is code.') is None


def test_the_title_is_checked_too():
    assert problem(GOOD, title="Retry policy (part 1") == "title: unclosed '('"
    assert problem(GOOD, title="Retry policy (part 1)") is None


def test_all_problems_are_named():
    assert problem('Broken `tick (and "quote...') == (
        "content ends in '...'; unmatched inline backtick; unclosed '('; odd number of \" quotes (1)"
    )


# --- code_heavy ------------------------------------------------------------------------------


def test_backtick_branch_needs_four_backticks_and_density():
    reason = only(code_heavy("`alpha` `bravo` and `charlie`"), "code_heavy")
    assert reason.points == 1
    assert reason.detail.startswith("6 backticks, density ")
    # rST double backticks are backticks too
    assert code_heavy("``alpha`` ``bravo`` and ``charlie``").detail.startswith("12 backticks")
    # a short note naming two identifiers is code-heavy by the product's rule (one point only)
    assert code_heavy("Fix type annotation for `before_request` and `before_app_request` decorators")


def test_backtick_branch_just_below_each_threshold():
    # three backticks only
    assert code_heavy("`a` `") is None
    # density exactly at the boundary: 4 backticks in 266 characters is above 0.015, in 267 not
    at = "`" + "a" * 130 + "` `" + "b" * 131 + "`"
    assert len(at) == 266 and code_heavy(at) is not None  # 4/266 > 0.015
    at = "`" + "a" * 131 + "` `" + "b" * 131 + "`"
    assert len(at) == 267 and code_heavy(at) is None  # 4/267 < 0.015


def test_line_branch_counts_fenced_and_code_like_lines():
    fenced = "Example:\n```python\nimport os\nprint(os.getcwd())\n```"
    assert only(code_heavy(fenced), "code_heavy").points == 1  # 6 backticks: the first branch
    assert code_share(fenced) > 0.5
    three_of_four = "x = 1\ny = compute(x)\nprint(y)\nThis prose line explains it."
    assert code_heavy(three_of_four).detail == "3 of 4 lines are code"
    half = "x = 1\nprint(x)\nThis prose line explains it.\nAnd so does this one."
    assert code_heavy(half) is None  # 2 of 4 is not more than half


@pytest.mark.parametrize(
    "line",
    [
        "def handler(request):",
        "async def handler(request):",
        "class Config(object):",
        "import os",
        "import os, sys as system",
        "from flask import Flask",
        "import React from 'react'",
        "return x;",
        "return self.app(environ)",
        "const pool = createPool()",
        "function connect() {",
        "$ pip install flask",
        ">>> app.config['DEBUG']",
        "#include <stdio.h>",
        "@app.route('/')",
        "app.config['SECRET_KEY'] = 'dev'",
        "counter += 1",
        "app.run(debug=True)",
        "});",
        "if (x) {",
    ],
)
def test_code_like_lines(line):
    assert is_code_line(line)


@pytest.mark.parametrize(
    "line",
    [
        "Return the value to the caller.",
        "return a response object instead",
        "import the module lazily so startup stays fast",
        "class of errors we did not expect",
        "py.test => pytest",
        "x == y is what the test checks",
        "Merge pull request #123 from x/y",
        "@davidism reviewed it",
        "",
    ],
)
def test_prose_lines(line):
    assert not is_code_line(line)


# --- implementation_residue ------------------------------------------------------------------


DEFAULTS = compile_residue_patterns(None)


@pytest.mark.parametrize(
    ("content", "found"),
    [
        ("Implementation Plan: add retries to the pool", "'Implementation Plan'"),
        ("This follows the masterplan", "'masterplan'"),
        ("See the master plan", "'master plan'"),
        ("Added after user feedback: shorter timeouts", "'Added after user feedback'"),
        ("Changed services/x.ts to retry", "source path services/x.ts"),
        (
            "Touched ./src/app/main.py and 'lib/util.js'",
            "source path ./src/app/main.py, source path lib/util.js",
        ),
    ],
)
def test_default_residue_patterns(content, found):
    reason = only(implementation_residue("", content, DEFAULTS), "implementation_residue")
    assert reason.points == 2 and reason.detail == f"found {found}"


@pytest.mark.parametrize(
    "content",
    [
        "Changed `services/x.ts` to retry",
        "```\nvim services/x.ts\n```",
        "See https://github.com/pallets/flask/blob/main/src/flask/app.py",
        "See github.com/pallets/flask/blob/main/src/flask/app.py for details",
        "Write to me at someone@example.org/x.py",
        "Updated docs/api.rst and the README",
        "Works with TCP/IP and and/or flask.app.py",
        "We planned the implementation carefully",
    ],
)
def test_no_residue(content):
    assert implementation_residue("", content, DEFAULTS) is None


def test_residue_in_the_title():
    assert implementation_residue("Implementation plan", GOOD, DEFAULTS) is not None


def test_custom_patterns_replace_the_defaults_and_bad_ones_are_skipped():
    patterns = compile_residue_patterns([r"\bTODO\b", "([", 42, "  "])
    assert len(patterns) == 1
    assert implementation_residue("", "todo: finish it", patterns).detail == "found 'todo'"
    assert implementation_residue("", "Implementation plan for services/x.ts", patterns) is None
    with_paths = compile_residue_patterns([r"\bTODO\b", "<source-path>"])
    assert implementation_residue("", "see services/x.ts", with_paths) is not None
    assert compile_residue_patterns([]) == DEFAULTS


def test_clean_residue_patterns():
    assert clean_residue_patterns(None) == []
    assert clean_residue_patterns([" wip ", "wip", "", "<source-path>"]) == ["wip", "<source-path>"]
    with pytest.raises(ValueError, match="must be a list"):
        clean_residue_patterns("implementation plan")
    with pytest.raises(ValueError, match="is not a string"):
        clean_residue_patterns(["ok", 3])
    with pytest.raises(ValueError, match=r"'\(\[' is not a valid regular expression"):
        clean_residue_patterns(["(["])
    with pytest.raises(ValueError, match="at most 50"):
        clean_residue_patterns(["x"] * 51)
    with pytest.raises(ValueError, match="longer than 200"):
        clean_residue_patterns(["x" * 201])


# --- the small reasons, score and recommendation --------------------------------------------


def test_duplicate_feedback_and_import_reasons():
    assert exact_duplicate(None) is None
    assert exact_duplicate(7) == Reason("exact_duplicate", 4, "same content as older entry 7")
    assert flagged_by_feedback("stale").points == 2
    assert flagged_by_feedback("wrong").detail == "feedback: wrong"
    assert flagged_by_feedback("helpful") is None
    assert flagged_by_feedback("not_helpful") is None
    assert flagged_by_feedback("") is None
    assert legacy_import("import") == Reason("legacy_import", 1, "imported (source import)")
    assert legacy_import("agent") is None


def test_score_is_the_sum_and_reasons_follow_the_spec_order():
    reasons = assess(title="", content="half done...", source="import", last_feedback="wrong", duplicate_of=3)
    assert codes(reasons) == [
        "incomplete_fragment",
        "truncated_or_unbalanced",
        "exact_duplicate",
        "flagged_by_feedback",
        "legacy_import",
    ]
    assert score(reasons) == 2 + 2 + 4 + 2 + 1
    assert assess(title="", content=GOOD, source="agent") == []


def test_recommendation():
    assert recommend(4, 0) == "archive"
    assert recommend(11, 1) == "review"
    assert recommend(3, 0) == "review"


# --- database: helpers -----------------------------------------------------------------------


def make(workspace, now, content=GOOD, *, age_days=40.0, tags=None, **fields):
    """An entry created age_days before now; fields the writer cannot set go straight to the row."""
    writable = {k: fields.pop(k) for k in list(fields) if k in ("title", "source", "tier", "pinned")}
    when = now - timedelta(days=age_days)
    entry = new_entries.entry_create(
        workspace=workspace, content=content, created_at=when, now=when, tags=tags, **writable
    )
    if fields:
        Entry.objects.filter(pk=entry.pk).update(**fields)
    entry.refresh_from_db()
    return entry


def count_assessments(monkeypatch, field="content"):
    """The title or content of every entry the text detectors assess from now on."""
    assessed: list[str] = []
    real = hygiene.text_reasons

    def counting(title, content, patterns):
        assessed.append(title if field == "title" else content)
        return real(title, content, patterns)

    monkeypatch.setattr(hygiene, "text_reasons", counting)
    return assessed


def queue(workspace, **kwargs):
    return hygiene.preview(workspace, **kwargs)


def ids(workspace, **kwargs):
    return [c["id"] for c in queue(workspace, **kwargs)["candidates"]]


def set_policy(workspace, **values):
    row = MaintenancePolicy.objects.get(workspace=workspace)
    for k, v in values.items():
        setattr(row, k, v)
    row.save()


# --- duplicates ---------------------------------------------------------------------------------


def test_the_older_copy_is_kept_and_the_newer_flagged(workspace, now):
    older = make(workspace, now, GOOD, age_days=10)
    newer = make(workspace, now, GOOD + "\n", age_days=5)  # same normalised content, same hash
    assert older.content_hash == newer.content_hash
    [candidate] = queue(workspace)["candidates"]
    assert candidate["id"] == newer.pk
    assert candidate["reasons"] == [
        {"code": "exact_duplicate", "points": 4, "detail": f"same content as older entry {older.pk}"}
    ]


def test_a_created_at_tie_keeps_the_lower_id(workspace, now):
    first = make(workspace, now, GOOD, age_days=5)
    second = make(workspace, now, GOOD, age_days=5)
    assert ids(workspace) == [second.pk] and first.pk < second.pk


@pytest.mark.parametrize("status", ["archived", "tombstoned"])
def test_an_older_copy_that_is_not_live_does_not_count(workspace, now, status):
    make(workspace, now, GOOD, age_days=10, status=status)
    make(workspace, now, GOOD, age_days=5)
    assert queue(workspace)["count"] == 0


def test_an_older_staged_or_protected_copy_counts(workspace, now):
    make(workspace, now, GOOD, age_days=10, status="staged", pinned=True)
    newer = make(workspace, now, GOOD, age_days=5)
    assert ids(workspace) == [newer.pk]


def test_another_workspace_s_copy_does_not_count(workspace, other_workspace, now):
    make(other_workspace, now, GOOD, age_days=10)
    make(workspace, now, GOOD, age_days=5)
    assert queue(workspace)["count"] == 0


# --- preview -------------------------------------------------------------------------------


def test_preview_candidate_shape(workspace, now):
    entry = make(workspace, now, "x" * 400, title="Short", source="import", access_count=2)
    entry_signals.entry_feedback(workspace=workspace, entry_id=entry.pk, signal="stale", now=now)
    result = queue(workspace)
    assert result["count"] == 1
    [c] = result["candidates"]
    assert list(c) == [
        "id",
        "title",
        "content_excerpt",
        "entry_type",
        "source",
        "created_at",
        "access_count",
        "score",
        "reasons",
        "recommendation",
    ]
    assert c["content_excerpt"] == "x" * 300
    assert (c["title"], c["entry_type"], c["source"], c["access_count"]) == (
        "Short",
        "observation",
        "import",
        2,
    )
    assert c["created_at"] == entry.created_at
    assert [r["code"] for r in c["reasons"]] == [
        "incomplete_fragment",
        "flagged_by_feedback",
        "legacy_import",
    ]
    assert c["score"] == 5
    assert c["recommendation"] == "review"  # accessed


def test_preview_leaves_out_protected_inactive_and_clean_entries(workspace, now):
    set_policy(workspace, exclude_tags=["keep-me"])
    make(workspace, now, JUNK, pinned=True)
    make(workspace, now, JUNK, source="operator")
    make(workspace, now, JUNK, source="system")
    make(workspace, now, JUNK, tier="constitutional")
    make(workspace, now, JUNK, status="staged")
    make(workspace, now, JUNK, status="stale")
    make(workspace, now, JUNK, status="archived")
    make(workspace, now, JUNK, tags=["keep-me", "other"])
    make(workspace, now, GOOD)
    shown = make(workspace, now, JUNK, tags=["other"], source="platform")
    assert ids(workspace) == [shown.pk]


def test_old_versions_are_not_candidates(workspace, now):
    entry = make(workspace, now, JUNK)
    entry_changes.entry_update(workspace=workspace, entry_id=entry.pk, content=GOOD, now=now)
    assert queue(workspace)["count"] == 0


def test_the_policy_is_read_fresh_on_each_call(workspace, now):
    make(workspace, now, GOOD + " Implementation plan.", tags=["plans"])
    assert queue(workspace)["count"] == 1
    set_policy(workspace, residue_patterns=[r"\bnothing-matches\b"])
    assert queue(workspace)["count"] == 0
    set_policy(workspace, residue_patterns=None)
    assert queue(workspace)["count"] == 1
    set_policy(workspace, exclude_tags=["plans"])
    assert queue(workspace)["count"] == 0


def test_an_invalid_stored_pattern_is_ignored(workspace, now):
    MaintenancePolicy.objects.filter(workspace=workspace).update(residue_patterns=["([", r"\bwip\b"])
    make(workspace, now, GOOD + " wip")
    [c] = queue(workspace)["candidates"]
    assert c["reasons"][0]["detail"] == "found 'wip'"


def test_keep_hides_until_the_content_changes(workspace, other_workspace, now):
    entry = make(workspace, now, JUNK)
    foreign = make(other_workspace, now, JUNK)
    assert hygiene_actions.keep(workspace, [entry.pk, entry.pk, foreign.pk, 999999], actor="user:ann") == {
        "kept": [entry.pk],
        "skipped": [foreign.pk, 999999],
    }
    assert queue(workspace)["count"] == 0
    assert Entry.objects.get(pk=foreign.pk).review_kept_hash == ""
    # a change that keeps the content keeps the decision
    entry_changes.entry_update(workspace=workspace, entry_id=entry.pk, title="still junk", now=now)
    assert queue(workspace)["count"] == 0
    # new content: back in the queue
    result = entry_changes.entry_update(
        workspace=workspace, entry_id=entry.pk, content="other half...", now=now
    )
    assert ids(workspace) == [result.entry.pk]


def test_order_is_score_then_age_then_id(workspace, now):
    low = make(workspace, now, "brief remark", source="import", age_days=50)  # 3
    mid_new = make(workspace, now, "short note", age_days=5)  # 2
    mid_old = make(workspace, now, "other note", age_days=9)  # 2
    high = make(workspace, now, JUNK, age_days=1)  # 4
    tie_a = make(workspace, now, "third note", age_days=9)  # 2, same created_at as mid_old
    assert ids(workspace) == [high.pk, low.pk, mid_old.pk, tie_a.pk, mid_new.pk]


def test_an_entry_is_a_candidate_only_from_score_two(workspace, now):
    # Candidates start at score 2: legacy_import (1) alone never lists an entry, nor does
    # code_heavy (1) alone; together (2) they do, and legacy_import adds to the other reasons.
    imported = make(workspace, now, GOOD, source="import")
    code = make(workspace, now, f"{GOOD} Use `alpha` and `bravo` here.")
    both = make(workspace, now, f"{GOOD} Use `charlie` and `delta` now.", source="import")
    short = make(workspace, now, "short note", source="import")
    listed = {c["id"]: c["score"] for c in queue(workspace)["candidates"]}
    assert listed == {both.pk: 2, short.pk: 3}
    assert imported.pk not in {c.id for c in hygiene.candidates(workspace)}
    assert code.pk not in listed
    assert hygiene_actions.apply(workspace, [imported.pk], actor="user:ann") == {
        "archived": [],
        "skipped": [imported.pk],
    }


def test_an_imported_journal_is_not_a_queue_of_every_entry(workspace):
    from memory import journal_import

    counts = journal_import.import_journal(workspace=workspace, path=journal_import.SAMPLE_PATH)
    found = hygiene.candidates(workspace)
    assert counts.created == 300
    # Every entry of the journal carries legacy_import (the whole journal was listed before);
    # only those with another reason are candidates.
    assert 0 < len(found) < counts.created
    assert all(c.score >= 2 and any(r.code != "legacy_import" for r in c.reasons) for c in found)


def test_limit_offset_and_count(workspace, now):
    made = [make(workspace, now, f"note {i}", age_days=30 - i) for i in range(7)]
    assert queue(workspace, limit=3)["count"] == 7
    assert ids(workspace, limit=3) == [e.pk for e in made[:3]]
    assert ids(workspace, limit=3, offset=6) == [made[6].pk]
    assert ids(workspace, limit=3, offset=7) == []
    assert ids(workspace, limit=0) == []


def test_preview_query_count_does_not_grow_with_entries(workspace, now):
    def queries(n):
        Entry.objects.filter(workspace=workspace).delete()
        for i in range(n):
            make(workspace, now, f"note {i}" if i % 2 else JUNK)
        queue(workspace)  # assesses every entry and stores the verdicts
        with CaptureQueriesContext(connection) as ctx:
            result = queue(workspace)
        assert result["count"] == n
        return len(ctx.captured_queries)

    small = queries(10)
    # The policy, whether the kept rank has marks to fold (none: the first call folded them),
    # the ranked page, its rows and verdicts, the duplicates' older ids, the listing.
    assert queries(200) == small <= 7


def test_stored_assessments_are_reused_until_title_content_or_patterns_change(workspace, now, monkeypatch):
    junk = make(workspace, now, JUNK, title="notes")
    plain = make(workspace, now, GOOD, title="plain")
    first = queue(workspace)
    assessed = count_assessments(monkeypatch, "title")
    assert queue(workspace) == first and assessed == []  # nothing assessed again
    # A new title (same content: changed in place) is assessed again, and only that entry.
    entry_changes.entry_update(workspace=workspace, entry_id=plain.pk, title="an implementation plan")
    again = queue(workspace)
    assert assessed == ["an implementation plan"]
    assert plain.pk in [c["id"] for c in again["candidates"]]
    # New residue patterns: every entry is assessed again, with them.
    MaintenancePolicy.objects.filter(workspace=workspace).update(residue_patterns=[r"\bnotes\b"])
    assessed.clear()
    listed = {c["id"]: c for c in queue(workspace)["candidates"]}
    assert sorted(assessed) == ["an implementation plan", "notes"]
    assert plain.pk not in listed  # the default patterns no longer apply
    assert "implementation_residue" in [r["code"] for r in listed[junk.pk]["reasons"]]
    # What is stored is exactly what the detectors say.
    fresh = {
        e.pk: hygiene_text.assess(
            title=e.title, content=e.content, source=e.source, patterns=hygiene.read_policy(workspace)[1]
        )
        for e in Entry.objects.filter(pk__in=listed)
    }
    assert {pk: [r["code"] for r in c["reasons"]] for pk, c in listed.items()} == {
        pk: [r.code for r in reasons] for pk, reasons in fresh.items()
    }


# --- apply -----------------------------------------------------------------------------------


def test_apply_archives_only_fresh_candidates(workspace, other_workspace, now):
    junk = make(workspace, now, JUNK)
    dup = make(workspace, now, "second note", source="import")
    clean = make(workspace, now, GOOD)
    foreign = make(other_workspace, now, JUNK)
    pinned_since = make(workspace, now, "pinned note")
    assert set(ids(workspace)) == {junk.pk, dup.pk, pinned_since.pk}
    entry_changes.entry_set_pinned(workspace=workspace, entry_id=pinned_since.pk, pinned=True)

    result = hygiene_actions.apply(
        workspace,
        [junk.pk, dup.pk, junk.pk, clean.pk, foreign.pk, pinned_since.pk],
        actor="user:ann",
        now=now,
    )
    assert result == {
        "archived": sorted([junk.pk, dup.pk]),
        "skipped": [clean.pk, foreign.pk, pinned_since.pk],
    }
    statuses = dict(Entry.objects.values_list("pk", "status"))
    assert statuses[junk.pk] == statuses[dup.pk] == "archived"
    assert statuses[clean.pk] == statuses[pinned_since.pk] == "active"
    assert statuses[foreign.pk] == "active"
    archived = Entry.objects.get(pk=junk.pk)
    assert archived.archived_at == now and archived.status_changed_at == now

    event = LifecycleEvent.objects.get(entry_id=junk.pk, reason="hygiene")
    assert (event.from_status, event.to_status, event.actor, event.automatic) == (
        "active",
        "archived",
        "user:ann",
        False,
    )
    assert event.details["score"] == 4
    assert [r["code"] for r in event.details["reasons"]] == ["incomplete_fragment", "truncated_or_unbalanced"]

    # already archived: skipped, never an error
    assert hygiene_actions.apply(workspace, [junk.pk], actor="user:ann", now=now) == {
        "archived": [],
        "skipped": [junk.pk],
    }
    assert hygiene_actions.apply(workspace, [], actor="user:ann", now=now) == {"archived": [], "skipped": []}


def test_apply_refreshes_scores_of_the_archived_and_their_neighbours(workspace, now):
    target = make(workspace, now, GOOD + " neighbour")
    junk = new_entries.entry_create(workspace=workspace, content=JUNK, links=[{"to_id": target.pk}], now=now)
    set_scores([target.pk], scored_at=None)
    hygiene_actions.apply(workspace, [junk.pk], actor="user:ann", now=now + timedelta(hours=1))
    assert Entry.objects.get(pk=target.pk).scored_at == now + timedelta(hours=1)


# --- pass 6 ----------------------------------------------------------------------------------


def context(workspace, now, **kwargs):
    run = MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="cli")
    return RunContext(
        workspace=workspace, now=now, policy=MaintenancePolicy.for_workspace(workspace), run=run, **kwargs
    )


def test_pass_six_direct(workspace, other_workspace, now):
    """archive_low_quality on its own (does not need passes.py wired)."""
    junk = make(workspace, now, JUNK, age_days=31)
    young = make(workspace, now, JUNK + " ", age_days=29)
    accessed = make(workspace, now, "other half...", age_days=31, access_count=1)
    review = make(workspace, now, "short note", age_days=31, source="import")  # 3 points
    foreign = make(other_workspace, now, JUNK, age_days=31)
    ctx = context(workspace, now)
    result = hygiene_actions.archive_low_quality(ctx)
    assert result.ids == [junk.pk] and result.count == 1
    statuses = dict(Entry.objects.values_list("pk", "status"))
    assert statuses[junk.pk] == "archived"
    assert {statuses[e.pk] for e in (young, accessed, review, foreign)} == {"active"}
    event = LifecycleEvent.objects.get(entry_id=junk.pk, reason="low_quality")
    assert event.automatic and event.run == ctx.run
    assert event.details == {
        "score": 4,
        "reasons": [
            {"code": "incomplete_fragment", "points": 2, "detail": "1 content word (fewer than 9)"},
            {"code": "truncated_or_unbalanced", "points": 2, "detail": "content ends in '...'"},
        ],
    }


def test_pass_six_reads_into_python_only_the_entries_that_may_be_archived(workspace, now, monkeypatch):
    """The database scores the entries the pass considers from their stored verdicts: only
    those reaching the archive score (a duplicate among them) and those without a verdict yet
    are scanned in Python; the rest — a review candidate, a clean entry — are not read."""
    junk = make(workspace, now, JUNK, age_days=31)
    review = make(workspace, now, "short note", age_days=31, source="import")  # 3 points
    clean = make(workspace, now, GOOD, age_days=33)
    copy = make(workspace, now, GOOD, age_days=31)  # an older live copy: 4 points
    hygiene.count(workspace)  # the verdicts stored, as the worker's schedule does
    unassessed = make(workspace, now, "also " + JUNK, age_days=31)
    scanned = []
    scan = hygiene_actions.scan

    def spy(ws, qs, patterns, **kwargs):
        found = list(scan(ws, qs, patterns, **kwargs))
        scanned.extend(qs.values_list("pk", flat=True))
        return iter(found)

    monkeypatch.setattr(hygiene_actions, "scan", spy)
    result = hygiene_actions.archive_low_quality(context(workspace, now))
    assert sorted(result.ids) == sorted([junk.pk, copy.pk, unassessed.pk])
    assert sorted(scanned) == sorted([junk.pk, copy.pk, unassessed.pk])
    assert review.pk not in scanned and clean.pk not in scanned


def test_pass_six_query_count_is_bounded(workspace, now):
    def queries(n):
        Entry.objects.filter(workspace=workspace).delete()
        for i in range(n):
            make(workspace, now, f"half done {i}...", age_days=40)
        ctx = context(workspace, now)
        with CaptureQueriesContext(connection) as captured:
            result = hygiene_actions.archive_low_quality(ctx)
        assert result.count == n
        return len(captured.captured_queries)

    # 60: SQLite's bulk INSERT of the events splits above about 76 rows (999 parameters)
    assert queries(5) == queries(60)


def test_pass_six_reads_each_text_s_oldest_copy_once_across_its_chunks(workspace, now, monkeypatch):
    """Copies of one text in several of the pass's chunks (batch size 2: chunks of 4): the
    oldest live copy of each content hash is read once for them all, and every newer copy is
    still a duplicate of it (its event names the oldest)."""
    oldest = make(workspace, now, GOOD, age_days=60)
    copies = [make(workspace, now, GOOD, age_days=50 - i) for i in range(9)]
    other = make(workspace, now, GOOD + " Twice.", age_days=59)
    other_copy = make(workspace, now, GOOD + " Twice.", age_days=31)
    read: list[set[str]] = []
    real = hygiene._oldest_live

    def spy(ws, hashes, known=None):
        read.append(hashes - (known or {}).keys())
        return real(ws, hashes, known)

    monkeypatch.setattr(hygiene, "_oldest_live", spy)
    result = hygiene_actions.archive_low_quality(context(workspace, now, batch_size=2))
    assert result.ids == sorted([c.pk for c in copies] + [other_copy.pk])
    # The 10 newer copies are scanned (the oldest ones score too low), 4 a chunk: the first
    # chunk reads the first text's oldest copy, the last chunk the second text's.
    assert [len(hashes) for hashes in read] == [1, 0, 1]
    for copy in copies:
        [reason] = LifecycleEvent.objects.get(entry_id=copy.pk, reason="low_quality").details["reasons"]
        assert reason["detail"] == f"same content as older entry {oldest.pk}"
    assert Entry.objects.get(pk=other.pk).status == "active"


# The tests below go through run_maintenance: they need passes.archive_low_quality to call
# hygiene_actions.archive_low_quality (the lead's wiring in maintenance/passes.py).


def full_run(workspace, now, **kwargs):
    return run_maintenance(workspace=workspace, now=now, **kwargs)


def test_full_run_archives_low_quality_entries(workspace, now):
    junk = make(workspace, now, JUNK, age_days=40)
    dup_old = make(workspace, now, GOOD, age_days=45)
    dup_new = make(workspace, now, GOOD, age_days=40)
    result = full_run(workspace, now)
    assert result["status"] == "succeeded"
    assert result["counts"]["low_quality_archived"] == 2
    assert result["affected"]["archived"] == sorted([junk.pk, dup_new.pk])
    statuses = dict(Entry.objects.values_list("pk", "status"))
    assert (statuses[junk.pk], statuses[dup_new.pk], statuses[dup_old.pk]) == (
        "archived",
        "archived",
        "active",
    )


def test_a_real_run_s_apply_re_checks_only_the_entries_its_plan_archives(workspace, now, monkeypatch):
    """The plan reads every entry the pass may archive; the apply re-checks, through the same
    rule, only the ones the plan picked (as the other passes walk their plan's ids)."""
    junk = make(workspace, now, JUNK, age_days=40)
    kept = make(workspace, now, GOOD, age_days=40)
    read: list[tuple[bool, set[int]]] = []
    original = hygiene_actions._low_quality_picks

    def spy(ctx, qs, oldest):
        read.append((ctx.planning, set(qs.values_list("pk", flat=True))))
        return original(ctx, qs, oldest)

    monkeypatch.setattr(hygiene_actions, "_low_quality_picks", spy)
    result = full_run(workspace, now)
    assert result["counts"]["low_quality_archived"] == 1
    assert Entry.objects.get(pk=junk.pk).status == "archived"
    planned = set().union(*(ids for planning, ids in read if planning))
    applied = set().union(*(ids for planning, ids in read if not planning))
    assert planned == {junk.pk, kept.pk} and applied == {junk.pk}


def test_a_held_entry_hygiene_would_archive_counts_as_skipped_in_a_real_run(workspace, now):
    """The apply re-checks only the plan's picks, which leave held entries out: the run still
    counts the held entry the plan saw hygiene wanting (as a dry run does)."""
    from memory import holds

    junk = make(workspace, now, JUNK, age_days=40)
    holds.hold(workspace, [junk.pk], reason="reject", actor="user:ops", now=now)
    dry = full_run(workspace, now, dry_run=True)
    result = full_run(workspace, now)
    assert dry["counts"]["held_skipped"] == result["counts"]["held_skipped"] == 1
    assert result["counts"]["low_quality_archived"] == 0
    assert Entry.objects.get(pk=junk.pk).status == "active"


def test_a_run_assesses_each_entry_once_and_its_plan_leaves_the_verdicts_stored(workspace, now, monkeypatch):
    """The plan cannot store the verdicts it makes inside its rolled-back transaction; they are
    stored once it is over, so the apply reads them instead of running the detectors again —
    and a dry run leaves them for the next run and the queue (a cache: no entry changes)."""
    entries = [make(workspace, now, JUNK, age_days=40), make(workspace, now, GOOD, age_days=40)]
    assessed = count_assessments(monkeypatch)
    before = list(Entry.objects.order_by("pk").values())
    dry = full_run(workspace, now, dry_run=True)
    assert dry["counts"]["low_quality_archived"] == 1
    assert sorted(assessed) == sorted([JUNK, GOOD])
    assert list(Entry.objects.order_by("pk").values()) == before
    stored = dict(HygieneAssessment.objects.values_list("entry_id", "points"))
    assert set(stored) == {e.pk for e in entries} and stored[entries[0].pk] >= hygiene_text.CANDIDATE_SCORE
    assessed.clear()
    result = full_run(workspace, now)
    assert result["counts"]["low_quality_archived"] == 1 and assessed == []  # plan and apply read them
    HygieneAssessment.objects.all().delete()
    make(workspace, now, JUNK + " again", age_days=40)
    full_run(workspace, now, dry_run=True)
    assert sorted(assessed) == sorted([GOOD, JUNK + " again"])  # the archived one is not scanned


def test_the_worker_makes_the_missing_verdicts_within_its_budget(
    workspace, other_workspace, now, monkeypatch
):
    """The ``maintenance.hygiene_verdicts`` schedule assesses active entries without a valid
    verdict (whatever door wrote them, or after new residue patterns), a batch at a time and no
    longer than its budget, so the queue and the low-quality pass find them made."""
    from maintenance import tasks

    mine = [make(workspace, now, f"note {i} half...") for i in range(5)]
    theirs = make(other_workspace, now, JUNK)
    make(workspace, now, JUNK + " gone", status="archived")  # not active: the queue never lists it
    HygieneAssessment.objects.all().delete()
    monkeypatch.setattr(hygiene, "BATCH_SIZE", 2)
    first = min(workspace, other_workspace, key=lambda w: w.pk)

    # Out of time at once: one batch of the first workspace, the rest waits for the next call.
    assert tasks.assess_hygiene_verdicts(budget_seconds=0) == {
        "assessed": {first.slug: 2 if first == workspace else 1},
        "ranked": {},
        "done": False,
    }
    done = tasks.assess_hygiene_verdicts()
    assert done["done"]
    # Each workspace's kept rank is built once its verdicts are made.
    assert done["ranked"] == {
        workspace.slug: {"folded": 0, "rebuilt": 5},
        other_workspace.slug: {"folded": 0, "rebuilt": 1},
    }
    assert set(HygieneAssessment.objects.values_list("entry_id", flat=True)) == {
        *(e.pk for e in mine),
        theirs.pk,
    }
    assessed = count_assessments(monkeypatch)
    assert len(ids(workspace)) == 5 and assessed == []  # the queue reads what the worker made
    set_policy(workspace, residue_patterns=[r"\bnote\b"])
    assert tasks.assess_hygiene_verdicts() == {
        "assessed": {workspace.slug: 5},
        "ranked": {workspace.slug: {"folded": 0, "rebuilt": 5}},  # other patterns: rebuilt
        "done": True,
    }
    assert tasks.assess_hygiene_verdicts() == {"assessed": {}, "ranked": {}, "done": True}


def test_full_run_min_age_boundary(workspace, now):
    set_policy(workspace, low_quality_min_age_days=10)
    at = make(workspace, now, JUNK, age_days=10)
    older = make(workspace, now, "other half...", age_days=10 + 1 / 86400)
    result = full_run(workspace, now)
    assert result["counts"]["low_quality_archived"] == 1
    assert Entry.objects.get(pk=older.pk).status == "archived"
    assert Entry.objects.get(pk=at.pk).status == "active"


def test_full_run_spares_accessed_kept_and_protected_entries(workspace, now):
    set_policy(workspace, exclude_tags=["keep-me"])
    make(workspace, now, "a half...", access_count=1)
    make(workspace, now, "b half...", pinned=True)
    make(workspace, now, "c half...", source="operator")
    make(workspace, now, "d half...", tier="constitutional")
    make(workspace, now, "e half...", tags=["keep-me"])
    kept = make(workspace, now, "f half...")
    hygiene_actions.keep(workspace, [kept.pk], actor="user:ann")
    result = full_run(workspace, now)
    assert result["counts"]["low_quality_archived"] == 0
    assert not Entry.objects.filter(status="archived").exists()


def test_full_run_dry_run_changes_nothing(workspace, now):
    junk = make(workspace, now, JUNK)
    result = full_run(workspace, now, dry_run=True)
    assert result["counts"]["low_quality_archived"] == 1
    assert junk.pk in result["affected"]["archived"]
    assert Entry.objects.get(pk=junk.pk).status == "active"
    assert not LifecycleEvent.objects.filter(reason="low_quality").exists()


def test_reverting_the_run_brings_them_back(workspace, now):
    junk = make(workspace, now, JUNK)
    result = full_run(workspace, now)
    assert Entry.objects.get(pk=junk.pk).status == "archived"
    reverted = revert_run(workspace, result["run_id"], actor="user:ann", now=now + timedelta(minutes=5))
    assert junk.pk in reverted["reverted"]
    assert Entry.objects.get(pk=junk.pk).status == "active"


# --- the command -----------------------------------------------------------------------------


def command(*args):
    out = StringIO()
    call_command("hygiene", *args, stdout=out)
    return out.getvalue()


def test_command_preview_apply_and_keep(workspace, now):
    junk = make(workspace, now, JUNK)
    other = make(workspace, now, "short note")
    text = command("--workspace", "acme")
    assert f"{junk.pk:>8}" in text and "archive" in text and "incomplete_fragment" in text
    assert "1–2 of 2 candidates" in text
    data = json.loads(command("--workspace", "acme", "--json", "--limit", "1"))
    assert data["count"] == 2 and [c["id"] for c in data["candidates"]] == [junk.pk]
    assert json.loads(command("--workspace", "acme", "--json", "--keep", str(other.pk))) == {
        "kept": [other.pk],
        "skipped": [],
    }
    assert command("--workspace", "acme", "--apply", str(junk.pk), "12345") == (
        f"archived: {junk.pk}\nskipped: 12345\n"
    )
    assert LifecycleEvent.objects.get(entry_id=junk.pk, reason="hygiene").actor == "cli"
    assert command("--workspace", "acme") == "0 candidates; none on this page\n"


# --- the database's score and the detectors' agree ---------------------------------------------

_TEXTS = [
    GOOD,
    JUNK,
    "short note",
    "An implementation plan for the cache layer, with every step the team agreed on today...",
    "Call `a()` then `b()` and `c()` before `d()` on every `e()` run.",
    "Deploy through the blue/green switch (never straight to prod",
]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(
    rows=[
        (0, 30.0, "agent", "", "active", True),  # a pinned older copy still counts
        (0, 2.0, "agent", "", "active", False),  # duplicate of it: 4 points
        (0, 2.0, "agent", "", "active", False),  # same age: the higher id is the duplicate
        (1, 30.0, "import", "", "archived", False),  # not live: no copy, not eligible
        (1, 1.0, "operator", "", "active", False),
        (2, 1.0, "import", "", "active", False),  # fragment 2 + import 1
        (0, 30.0, "operator", "stale", "staged", False),  # staged: a copy, not eligible
        (3, 1.0, "agent", "wrong", "active", False),
        (4, 2.0, "import", "useful", "active", False),
        (5, 1.0, "agent", "", "active", False),
    ]
)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(range(len(_TEXTS))),
            st.sampled_from([1.0, 2.0, 2.0, 30.0]),  # equal ages: ties broken by id
            st.sampled_from(["agent", "import", "operator"]),
            st.sampled_from(["", "useful", "stale", "wrong"]),
            st.sampled_from(["active", "active", "active", "staged", "archived"]),
            st.booleans(),  # pinned
        ),
        min_size=1,
        max_size=14,
    )
)
def test_the_database_ranks_exactly_the_candidates_the_detectors_find(workspace, now, rows):
    """The SQL score (stored text points plus the column reasons) lists and orders the very
    candidates that assessing every eligible entry in Python does."""
    Entry.objects.filter(workspace=workspace).delete()
    for text, age, source, feedback, status, pinned in rows:
        make(
            workspace,
            now,
            _TEXTS[text],
            age_days=age,
            source=source,
            pinned=pinned,
            last_feedback=feedback,
            status=status,
        )
    policy, patterns = hygiene.read_policy(workspace)
    by_python = sorted(
        hygiene.scan(workspace, hygiene.eligible_entries(workspace, policy), patterns),
        key=lambda c: (-c.score, c.created_at, c.id),
    )
    assert hygiene.candidates(workspace) == by_python
    assert hygiene.count(workspace) == len(by_python)
    page = hygiene.preview(workspace, limit=3, offset=1)
    assert [c["id"] for c in page["candidates"]] == [c.id for c in by_python[1:4]]
    assert page["count"] == len(by_python)


def test_every_door_of_the_queue_assesses_new_entries_before_it_answers(workspace, now):
    first = make(workspace, now, JUNK, title="one")
    assert hygiene.count(workspace) == 1  # the count assessed it
    second = make(workspace, now, JUNK, title="two")
    past = hygiene.preview(workspace, limit=5, offset=5)  # a page past the end
    assert (past["count"], past["candidates"]) == (2, [])
    third = make(workspace, now, JUNK, title="three")
    assert {c["id"] for c in hygiene.preview(workspace, limit=5)["candidates"]} == {
        first.pk,
        second.pk,
        third.pk,
    }
    fourth = make(workspace, now, JUNK, title="four")
    assert {c.id for c in hygiene.candidates(workspace)} == {first.pk, second.pk, third.pk, fourth.pk}
    assert hygiene.preview(workspace, limit=2, offset=3)["count"] == 4


# --- the queue filtered and paged by the database -----------------------------------------------


def test_filtered_pages_are_the_candidates_the_rules_pick(workspace, now):
    """``hygiene.page`` filters by recommendation and reason, counts and pages in SQL: the same
    candidates, in the same order, as the rules applied to every candidate in Python."""
    fence = "```python\nx = 1\ny = 2\nprint(x)\nz = 3\n```"
    residue = "Implementation plan for the cache layer of the billing service and its retries."
    make(workspace, now, JUNK)  # fragment + truncated: archive
    make(workspace, now, JUNK + " again", access_count=3)  # the same, accessed: review
    make(workspace, now, fence + "\n" + fence)  # code heavy (+ a fragment)
    make(workspace, now, residue, source="import")  # residue + import
    make(workspace, now, "tiny", source="import", last_feedback="wrong")
    make(workspace, now, GOOD, age_days=50)
    make(workspace, now, GOOD, age_days=45)  # the newer copy: exact duplicate
    make(workspace, now, GOOD + " And then some.", last_feedback="stale", access_count=1)
    make(workspace, now, GOOD + " Clean.")  # no reason
    everything = hygiene.candidates(workspace)
    assert len(everything) >= 7
    for recommendation in (None, "archive", "review"):
        for reason in (None, *hygiene_text.POINTS):
            expected = [
                c.id
                for c in everything
                if (not recommendation or c.recommendation == recommendation)
                and (not reason or any(r.code == reason for r in c.reasons))
            ]
            total, found = hygiene.page(workspace, limit=100, recommendation=recommendation, reason=reason)
            assert (total, [c.id for c in found]) == (len(expected), expected), (recommendation, reason)
            pages = [
                c.id
                for start in range(0, max(total, 1), 2)
                for c in hygiene.page(
                    workspace, limit=2, offset=start, recommendation=recommendation, reason=reason
                )[1]
            ]
            assert pages == expected, (recommendation, reason)
    # Some filter leaves some out, every reason is met at least once.
    assert {r.code for c in everything for r in c.reasons} == set(hygiene_text.POINTS)
    assert hygiene.page(workspace, limit=5, offset=1000) == (len(everything), [])
