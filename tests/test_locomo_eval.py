"""The LoCoMo evaluation's own logic (bench/locomo_eval.py) on a tiny conversation written here,
so that a bug in the evaluation cannot pass as a good result: the evidence mapping, the coverage
rule, hit@10, the simulated clock, and a whole evaluation recounted from its database."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memory import accounts
from memory.models import Entry, Relationship
from memory.models.choices import Status

_PATH = Path(__file__).resolve().parent.parent / "bench" / "locomo_eval.py"
_spec = importlib.util.spec_from_file_location("locomo_eval", _PATH)
assert _spec and _spec.loader
le = importlib.util.module_from_spec(_spec)
sys.modules["locomo_eval"] = le  # dataclasses look their module up
_spec.loader.exec_module(le)

# Two sessions of two speakers, in the corpus's format (invented text).
SESSIONS = [
    {"conversation": "conv-t", "session": 1, "created_at": "2023-05-08T13:56:00"},
    {"conversation": "conv-t", "session": 2, "created_at": "2023-05-10T09:00:00"},
    {"conversation": "conv-u", "session": 1, "created_at": "2023-01-01T10:00:00"},
]
TURNS = [
    ("conv-t", 1, "D1:1", "Ann", "Hello Bob, long time no see"),
    ("conv-t", 1, "D1:2", "Bob", "I adopted a tabby kitten named Pixel yesterday"),
    ("conv-t", 1, "D1:3", "Ann", "Lovely, I started pottery classes on Tuesdays"),
    ("conv-t", 2, "D2:1", "Bob", "Pixel broke my favourite vase this morning"),
    ("conv-t", 2, "D2:2", "Ann", "My pottery teacher says my bowls improve"),
    ("conv-u", 1, "D1:1", "Cy", "A conversation that the filter leaves out"),
]
OBSERVATIONS = [
    ("conv-t", 1, "Bob adopted a tabby kitten called Pixel.", ["D1:2"]),
    ("conv-t", 2, "Ann's pottery is improving.", ["D2:2", "D9:9"]),  # D9:9 does not exist
]
SUMMARIES = [("conv-t", 1, "Ann and Bob caught up: a kitten and pottery.")]
QA = [
    ("conv-t", 1, "What is the name of Bob's kitten?", 4, ["D1:2"]),
    ("conv-t", 2, "When did Ann start pottery classes?", 2, ["D1:3"]),
    ("conv-t", 3, "What did Pixel break and what does the teacher say?", 1, ["D2:1", "D2:2"]),
    ("conv-t", 4, "An adversarial question", 5, ["D1:1"]),
    ("conv-t", 5, "A question without evidence", 3, []),
]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    def write(name: str, rows: list[dict]) -> None:
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("locomo_sessions.jsonl", SESSIONS)
    write(
        "locomo_turns.jsonl",
        [
            {"conversation": c, "session": s, "dia_id": d, "speaker": sp, "content": t}
            for c, s, d, sp, t in TURNS
        ],
    )
    write(
        "locomo_observations.jsonl",
        [{"conversation": c, "session": s, "content": t, "evidence": e} for c, s, t, e in OBSERVATIONS],
    )
    write(
        "locomo_session_summaries.jsonl",
        [{"conversation": c, "session": s, "content": t} for c, s, t in SUMMARIES],
    )
    write(
        "locomo_qa.jsonl",
        [
            {"conversation": c, "qa_index": i, "question": q, "category": cat, "evidence": e}
            for c, i, q, cat, e in QA
        ],
    )
    return tmp_path


def test_the_corpus_loads_in_time_order_and_a_filter_keeps_only_its_conversations(corpus):
    convs = le.load(corpus, {"conv-t"})
    assert list(convs) == ["conv-t"]
    conv = convs["conv-t"]
    assert [s.number for s in conv.sessions] == [1, 2]
    assert conv.sessions[0].at == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert [t.dia_id for t in conv.sessions[0].turns] == ["D1:1", "D1:2", "D1:3"]
    assert conv.sessions[0].turns[1].content == "Bob: I adopted a tabby kitten named Pixel yesterday"
    assert conv.sessions[1].observations == [("Ann's pottery is improving.", ("D2:2", "D9:9"))]
    assert conv.sessions[0].summary.startswith("Ann and Bob")
    # Adversarial (5) and evidence-less questions are not scored.
    assert [q.index for q in conv.scored_questions()] == [1, 2, 3]
    assert set(le.load(corpus)) == {"conv-t", "conv-u"}


def test_the_simulated_clock_runs_daily_between_sessions_and_ends_with_the_checkpoints(corpus):
    conv = le.load(corpus, {"conv-t"})["conv-t"]
    events = le.timeline(conv, tail_days=90)
    times = [at for at, _, _ in events]
    assert times == sorted(times)
    days = [at for at, kind, _ in events if kind == "day"]
    # From the day after the first session (it started after 03:00) to the last checkpoint, daily.
    assert days[0] == datetime(2023, 5, 9, 3, 0, tzinfo=UTC)
    assert all(b - a == timedelta(days=1) for a, b in itertools.pairwise(days))
    last = conv.last_session_at
    assert [(at, p) for at, kind, p in events if kind == "checkpoint"] == [
        (last + timedelta(days=30), 30),
        (last + timedelta(days=90), 90),
    ]
    assert days[-1] <= last + timedelta(days=90) < days[-1] + timedelta(days=1)
    sessions = [p.number for _, kind, p in events if kind == "session"]
    assert sessions == [1, 2]
    # The second session happens between the runs of its own day's night and the next.
    i = next(i for i, (_, kind, p) in enumerate(events) if kind == "session" and p.number == 2)
    assert events[i - 1][0] == datetime(2023, 5, 10, 3, 0, tzinfo=UTC)


def test_or_query_joins_each_word_once_within_the_limit():
    assert le.or_query(["Hi there, hi!", "there or here"], 500) == "hi or there or here"
    assert le.or_query(["alpha beta gamma"], 13) == "alpha or beta"
    assert le.or_query(["", "!!"], 500) == ""


def test_evidence_is_kept_live_or_through_a_live_consolidated_entry_and_coverage_needs_all_of_it():
    covers = {100: ("D1:2",), 101: ("D2:2", "D2:1")}
    # D1:2's turn is gone but entry 100 covers it; D2:1/D2:2 are covered only by 101, which is gone.
    kept = le.kept_evidence({"D1:3"}, covers, live_consolidated={100})
    assert kept == {"D1:3", "D1:2"}
    qs = [
        le.Question(1, "q1", 4, ("D1:2",)),
        le.Question(2, "q2", 2, ("D1:3",)),
        le.Question(3, "q3", 1, ("D2:1", "D2:2")),
        le.Question(4, "q4", 1, ("D1:2", "D2:1")),
    ]
    evidence_kept, covered = le.coverage(qs, kept)
    assert evidence_kept == pytest.approx(2 / 4)  # distinct turns: D1:2, D1:3 of D1:2, D1:3, D2:1, D2:2
    assert covered == pytest.approx(2 / 4)  # q4 has one of its two turns only


def test_a_hit_is_an_evidence_turn_or_an_entry_covering_one():
    turn_of = {1: "D1:1", 2: "D1:2"}
    covers = {10: ("D1:3",)}
    assert le.is_hit([1, 2], ("D1:2",), turn_of, covers)
    assert le.is_hit([10], ("D1:3", "D9:9"), turn_of, covers)
    assert not le.is_hit([1, 10], ("D1:2",), turn_of, covers)
    assert not le.is_hit([], ("D1:2",), turn_of, covers)


@pytest.mark.django_db(transaction=True)
def test_an_evaluation_writes_through_the_product_and_its_numbers_recount_from_the_database(corpus, settings):
    conv = le.load(corpus, {"conv-t"})["conv-t"]
    # A short tail keeps the test quick: 4 simulated days, a full run and a sweep each; a steep
    # decay makes turns go cold within them (retention e^-t: below 0.2 after 1.6 days).
    result = le.evaluate(
        conv, tail_days=2, log=lambda msg: None, checkpoints=(2,), policy={"decay_lambda": 1.0}
    )
    assert set(result["checkpoints"]) == {"+2d"}
    cp = result["checkpoints"]["+2d"]
    untouched, maintained = cp["untouched"], cp["maintained"]

    # What was written: per store 5 turns + 2 observations + 1 summary, with their links.
    for variant in le.VARIANTS:
        ws = accounts.workspace_get(f"conv-t-{variant}")
        rows = Entry.objects.filter(workspace=ws)
        assert rows.count() == 8
        turns = rows.filter(tier="episodic")
        assert sorted(turns.values_list("external_id", flat=True)) == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2"]
        assert set(turns.values_list("session_key", flat=True)) == {"conv-t-session-1", "conv-t-session-2"}
        pottery = rows.get(content="Ann's pottery is improving.")
        assert pottery.metadata == {"locomo_evidence": ["D2:2"]}  # the unknown D9:9 is dropped
        assert list(
            Relationship.objects.filter(from_entry=pottery).values_list("type", "to_entry__external_id")
        ) == [("evolves_from", "D2:2")]
        summary = rows.get(content__startswith="Ann and Bob")
        assert Relationship.objects.filter(from_entry=summary, type="evolves_from").count() == 3
    # The untouched store got no run; the others a full run and a decay sweep a day.
    assert not accounts.workspace_get("conv-t-untouched").runs.exists()
    days = sum(1 for _, kind, _ in le.timeline(conv, 2, (2,)) if kind == "day")
    assert days == 4
    assert accounts.workspace_get("conv-t-maintained").runs.count() == 2 * days == result["runs"]

    # Recount the maintained checkpoint's numbers from the database as it is now (no day passed
    # after the last checkpoint, so the state is the checkpoint's).
    ws = accounts.workspace_get("conv-t-maintained")
    live = Entry.objects.filter(workspace=ws).exclude(status=Status.TOMBSTONED)
    live_turns = set(live.filter(tier="episodic").values_list("external_id", flat=True))
    live_covers = [
        set(e["locomo_evidence"]) for e in live.filter(tier="semantic").values_list("metadata", flat=True)
    ]
    kept = live_turns.union(*live_covers)
    assert 0 < len(live_turns) < 5, live_turns  # some decayed, some were read or are too young
    assert maintained["turn_rows_reclaimed"] == pytest.approx(1 - len(live_turns) / 5)
    evidence = {"D1:2", "D1:3", "D2:1", "D2:2"}
    assert maintained["evidence_kept"] == pytest.approx(len(evidence & kept) / 4)
    assert set(maintained["lost_evidence"]) == evidence - kept
    observations = live.filter(tier="semantic").exclude(content__startswith="Ann and Bob")
    strict = live_turns.union(
        *(set(e["locomo_evidence"]) for e in observations.values_list("metadata", flat=True))
    )
    assert maintained["evidence_kept_strict"] == pytest.approx(len(evidence & strict) / 4)
    assert maintained["live_rows"] == live.count()
    assert maintained["rows_written"] == 8
    # The untouched store lost nothing, and its search finds the kitten question's evidence.
    assert (untouched["turn_rows_reclaimed"], untouched["evidence_kept"], untouched["questions_covered"]) == (
        0,
        1,
        1,
    )
    assert untouched["by_category"]["single-hop"]["hit10"] == 1.0
    assert le.metric(cp)["hit10_untouched"] == untouched["hit10"]
