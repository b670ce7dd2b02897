"""Contradictions: polarity, signatures, the sweep (pass 14) and resolving disputes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from maintenance import contradictions
from maintenance.contradictions import conflict, jaccard, polarity, signature
from maintenance.models import Dispute, MaintenanceRun
from maintenance.pass_tools import RunContext
from maintenance.run_results import effective_policy
from maintenance.run_start import run_maintenance
from memory import entry_changes, new_entries, relationships
from memory.errors import Conflict, InvalidInput, NotFound
from memory.models import Entry, LifecycleEvent, Relationship
from memory.models.choices import Status
from memory.policy_model import MaintenancePolicy

# --- polarity ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Always run the tests before merging.", 1),
        ("You must pin every dependency.", 1),
        ("Ensure the build passes; prefer small commits.", 1),
        ("Make sure the changelog is updated.", 1),
        ("Never push to main.", -1),
        ("Do not commit secrets.", -1),
        ("Don't commit secrets.", -1),
        ("Don\u2019t commit secrets.", -1),  # a typographic apostrophe
        ("Avoid global state.", -1),
        ("Stop using print for logging.", -1),
        ("Raw SQL is forbidden here.", -1),
        ("Force pushes are disallowed and prohibited.", -1),
        ("DO NOT EDIT generated files.", -1),
    ],
)
def test_english_markers(text, expected):
    assert polarity(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Always avoid global state.",  # the intensifier belongs to the prohibition
        "You must not commit secrets.",  # "must not" is negative only
        "You should not commit secrets.",
        "Commits must never contain secrets.",
        "You should avoid global state.",
        "Make sure to never push to main.",
        "Ensure you don't log tokens.",
        "Always try to avoid global state.",
    ],
)
def test_a_positive_word_inside_a_prohibition_is_not_positive(text):
    assert polarity(text) == -1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Portuguese
        ("Nunca use print em produção.", -1),
        ("Não use print em produção.", -1),
        ("Você não deve usar eval.", -1),  # "não deve" is one prohibition
        ("Evite variáveis globais.", -1),
        ("É proibido commitar segredos.", -1),
        ("Sempre rode os testes.", 1),
        ("Garanta que os testes passem.", 1),
        ("Prefira funções puras.", 1),
        # Spanish
        ("Nunca uses print en el código.", -1),
        ("No uses print en el código.", -1),
        ("No debes usar eval en el servidor.", -1),
        ("Jamás subas secretos al repositorio.", -1),
        ("Evita el estado global.", -1),
        ("Siempre ejecuta las pruebas.", 1),
        ("Asegúrate de que las pruebas pasen.", 1),
        ("Debes fijar las dependencias.", 1),
        # French
        ("Ne modifiez pas les fichiers générés.", -1),
        ("N'utilisez jamais eval.", -1),
        ("Ne jamais pousser sur main.", -1),
        ("Évitez l'état global.", -1),
        ("Il est interdit de committer des secrets.", -1),
        ("Vous ne devez pas committer de secrets.", -1),
        ("Toujours lancer les tests.", 1),
        ("Assurez-vous que les tests passent.", 1),
        ("Préférez les fonctions pures.", 1),
        # German
        ("Verwende niemals eval.", -1),
        ("Pushe nie direkt auf main.", -1),
        ("Das ist nicht erlaubt.", -1),
        ("Keine globalen Variablen verwenden.", -1),
        ("Vermeide globalen Zustand.", -1),
        ("Direkte Pushes sind verboten.", -1),
        ("Du darfst nicht auf main pushen.", -1),
        ("Du solltest nicht über die API gehen.", -1),  # "sollte(st) nicht" is one prohibition
        ("Führe immer die Tests aus.", 1),
        ("Stelle sicher, dass die Tests grün sind.", 1),
        ("Bevorzuge reine Funktionen.", 1),
        ("Übergib immer einen Zeitstempel.", 1),  # an umlaut at the start of a word
        # Chinese and Japanese: no spaces, so no word boundaries to check
        ("不要使用全局变量。", -1),
        ("禁止提交密钥。", -1),
        ("务必避免全局变量。", -1),  # "be sure to avoid": one prohibition
        ("总是运行测试。", 1),
        ("必须固定依赖版本。", 1),
        ("不得不这样做。", 1),  # "have to": not a prohibition
        ("グローバル変数を使わないでください。", -1),
        ("必ずテストを実行してください。", 1),
    ],
)
def test_markers_in_other_languages(text, expected):
    assert polarity(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Let it snow in the stopwatch demo.",  # "no", "stop" inside longer words
        "Nothing here needs a mustache.",  # "no", "must"
        "The shoulder of the neverland chart.",  # "should", "never"
        "O anão usa o cache no servidor.",  # "não" inside "anão"; Portuguese "no" = "in the"
        "Niemand kennt die Nieren; keineswegs immerhin.",  # nie, kein, immer inside words
        "Ele é inevitável.",  # evita inside a word
        "Toujoursmieux est un nom.",
    ],
)
def test_markers_do_not_match_inside_words(text):
    assert polarity(text) == 0


@pytest.mark.parametrize(
    "text",
    [
        "Always use uv, never pip.",
        "Prefer small commits; avoid force pushes.",
        "Sempre use ruff, nunca black.",
        "Run the tests.",
        "",
    ],
)
def test_ties_and_no_markers_give_zero(text):
    assert polarity(text) == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # English "no" is rarely a prohibition; Spanish "no" counts only in Spanish-looking text.
        ("No need to add tests for typos.", 0),
        ("Imports: ES module style, no `.js` extension (the project uses a bundler).", 0),
        # "do not" / "don't" forbid wherever they stand: both are listed prohibition markers
        ("We do not squash commits before merging.", -1),
        ("You don't commit generated files.", -1),
        ("No uses variables globales.", -1),
        ("Keep it short; do not narrate the code.", -1),
        ("Keep it short and do not narrate the code.", -1),
        ("mcpcurl is secondary - don't break it.", -1),
        # "never" after "is" describes
        ("The line is never executed.", 0),
        ("Pin facts in the test body, never in the cassette.", -1),
        # "to avoid" states a purpose, unless someone tries
        ("The script sets CI=1 to avoid watch mode.", 0),
        ("Try hard to avoid panics.", -1),
        # "stop" forbids only with a gerund
        ("If no test exists, stop and tell the user.", 0),
        ("Stop extending the current design.", -1),
        # a negated requirement is neither; a negated omission asks for something
        ("Not required for typical contributions.", 0),
        ("NEVER skip `script/lint` before committing.", 1),
        ("Do not omit the summary.", 1),
        ("Don't forget to read the topic guides.", 1),
        ("N'oubliez pas les tests.", 1),
        # words inside inline code are code, not language
        ("Token revocation runs in a separate `always()` step.", 0),
        ("Use `require` for critical checks.", 0),
    ],
)
def test_markers_count_where_they_forbid_and_not_where_they_describe(text, expected):
    assert polarity(text) == expected


# --- signature and similarity -----------------------------------------------------------------

NATO = """
    alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa
    quebec romeo sierra tango uniform victor whiskey xray yankee zulu
"""
WORDS = NATO.split()


def test_signature_is_the_first_24_content_words_without_polarity_words():
    text = "Never " + " ".join(WORDS)  # 26 content words after the marker
    assert signature(text) == frozenset(WORDS[:24])
    assert signature("Always avoid the global state!") == {"global", "state"}
    assert signature("Make sure to never push to main") == {"push", "main"}
    assert signature("Make a release") == {"make", "release"}  # "make" alone is a topic word
    assert signature("Ne modifiez pas les fichiers") == {"modifiez", "fichiers"}  # the verb stays
    assert signature("重要：不要使用全局变量") == set("重要使用全局变量")  # 要 stays in 重要
    assert signature("the and for with") == frozenset()


def test_jaccard():
    assert jaccard(set(), set()) == 0.0
    assert jaccard({"a"}, set()) == 0.0
    assert jaccard({"a", "b"}, {"a", "b"}) == 1.0
    assert jaccard({"a", "b", "c"}, {"a", "b", "d", "e"}) == 0.4


def test_the_similarity_boundary_is_inclusive():
    # 2 shared of 5 in all: exactly 0.4 conflicts.
    assert conflict("Always alpha bravo charlie", "Never alpha bravo delta echo") == 0.4
    # 9 shared of 23 in all (0.391…): just below, no conflict.
    a = "Always " + " ".join(WORDS[:16])
    b = "Never " + " ".join(WORDS[:9] + WORDS[16:23])
    assert jaccard(signature(a), signature(b)) == pytest.approx(9 / 23)
    assert conflict(a, b) is None
    # 8 shared of 20: 0.4 again.
    c = "Always " + " ".join(WORDS[:14])
    d = "Never " + " ".join(WORDS[:8] + WORDS[14:20])
    assert conflict(c, d) == 0.4


def test_conflict_needs_opposite_non_zero_polarities():
    assert conflict("Always run the linter", "Never run the linter") == 1.0
    assert conflict("Always run the linter", "Always run the linter") is None
    assert conflict("Never run the linter", "Do not run the linter") is None
    assert conflict("Run the linter", "Never run the linter") is None
    assert conflict("Always run the linter", "Never deploy on fridays") is None


# --- the sweep --------------------------------------------------------------------------------


def rule(workspace, now, content: str, minutes: int = 0, **fields: Any) -> Entry:
    fields.setdefault("entry_type", "rule")
    fields.setdefault("tier", "procedural")
    when = now - timedelta(minutes=minutes)
    return new_entries.entry_create(workspace=workspace, content=content, created_at=when, now=when, **fields)


def set_policy(workspace, **values: Any) -> None:
    row = MaintenancePolicy.objects.get(workspace=workspace)
    for name, value in values.items():
        setattr(row, name, value)
    row.save()


def context(workspace, now) -> RunContext:
    run = MaintenanceRun.objects.create(workspace=workspace, kind="contradictions", trigger="cli")
    return RunContext(workspace=workspace, now=now, policy=effective_policy(workspace, None), run=run)


def sweep(workspace, now):
    return contradictions.flag_contradictions(context(workspace, now))


def topic(i: int) -> str:
    """Three words no other topic shares."""
    return " ".join(WORDS[3 * i : 3 * i + 3])


def pair(a: Entry, b: Entry) -> tuple[int, int]:
    return (min(a.pk, b.pk), max(a.pk, b.pk))


def flagged(workspace) -> set[tuple[int, int]]:
    return set(Dispute.objects.filter(workspace=workspace).values_list("entry_a_id", "entry_b_id"))


ALWAYS = "Always run the integration tests before merging a pull request."
NEVER = "Never run the integration tests before merging a pull request."


def test_the_sweep_flags_an_opposite_pair_once(workspace, now):
    newer = rule(workspace, now, NEVER, minutes=1)
    older = rule(workspace, now, ALWAYS, minutes=2)
    rule(workspace, now, "Document every public function.", minutes=3)
    ctx = context(workspace, now)
    result = contradictions.flag_contradictions(ctx)
    assert result.count == 1 and sorted(result.ids) == sorted([newer.pk, older.pk])
    dispute = Dispute.objects.get(workspace=workspace)
    assert (dispute.entry_a_id, dispute.entry_b_id) == pair(newer, older)
    assert dispute.kind == "polarity_conflict" and dispute.detected_by == "sweep" and dispute.run == ctx.run
    assert dispute.similarity == 1.0 and dispute.status == "open" and dispute.created_at == now
    first_is_older = dispute.entry_a_id == older.pk
    assert dispute.details["polarity_a"] == (1 if first_is_older else -1)
    assert dispute.details["polarity_b"] == -dispute.details["polarity_a"]
    assert dispute.details["shared"] == sorted(signature(ALWAYS))
    # Each pair once: a second sweep finds nothing new.
    assert sweep(workspace, now).count == 0
    assert Dispute.objects.count() == 1


def test_a_resolved_pair_is_not_flagged_again(workspace, now):
    rule(workspace, now, ALWAYS, minutes=2)
    rule(workspace, now, NEVER, minutes=1)
    sweep(workspace, now)
    dispute = Dispute.objects.get()
    contradictions.resolve(workspace, dispute.pk, "keep_both", actor="user:ann", now=now)
    assert sweep(workspace, now + timedelta(days=1)).count == 0
    assert Dispute.objects.count() == 1


def test_the_batch_bounds_which_entries_are_compared(workspace, now):
    set_policy(workspace, contradiction_batch=10)
    old_a = rule(workspace, now, ALWAYS, minutes=100)
    old_b = rule(workspace, now, NEVER, minutes=99)
    for i in range(10):
        rule(workspace, now, f"Document the {WORDS[i]} module.", minutes=50 - i)
    assert sweep(workspace, now).count == 0  # the pair is older than the newest 10
    set_policy(workspace, contradiction_batch=12)
    assert sweep(workspace, now).count == 1
    assert flagged(workspace) == {pair(old_a, old_b)}


def test_max_flags_stops_the_sweep_newest_pairs_first(workspace, now):
    set_policy(workspace, contradiction_max_flags=1)
    pairs = []
    for i in range(3):
        a = rule(workspace, now, f"Always {topic(i)}.", minutes=10 * i + 2)
        b = rule(workspace, now, f"Never {topic(i)}.", minutes=10 * i + 1)
        pairs.append(pair(a, b))
    assert sweep(workspace, now).count == 1
    assert flagged(workspace) == {pairs[0]}  # the newest pair
    assert sweep(workspace, now).count == 1
    assert flagged(workspace) == set(pairs[:2])
    set_policy(workspace, contradiction_max_flags=20)
    assert sweep(workspace, now).count == 1
    assert sweep(workspace, now).count == 0
    assert flagged(workspace) == set(pairs)


def test_only_live_durable_latest_entries_are_swept(workspace, now):
    base = "the staging database before every release"
    rule(workspace, now, f"Always migrate {base}.", minutes=10)
    rule(workspace, now, f"Never migrate {base}.", entry_type="observation", tier="episodic", minutes=9)
    rule(workspace, now, f"Never migrate {base}.", staged_class="procedural", minutes=8)
    archived = rule(workspace, now, f"Never migrate {base}!", minutes=7)
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual"
    )
    tagged = rule(workspace, now, f"Do not migrate {base}.", tags=["frozen"], minutes=6)
    set_policy(workspace, exclude_tags=["frozen"])
    assert sweep(workspace, now).count == 0
    # Durable by type (decision) or by tier (semantic) counts; a stale entry is live.
    decision = rule(
        workspace, now, f"Never migrate {base}.", entry_type="decision", tier="episodic", minutes=5
    )
    semantic = rule(workspace, now, f"Avoid: migrate {base}.", entry_type="observation", tier="semantic")
    entry_changes.entry_set_status(workspace=workspace, entry_id=semantic.pk, status="stale", reason="manual")
    result = sweep(workspace, now)
    assert result.count == 2
    assert {decision.pk, semantic.pk} <= set(result.ids) and tagged.pk not in result.ids


def test_an_updated_entry_is_compared_as_its_latest_version(workspace, now):
    always = rule(workspace, now, ALWAYS, minutes=5)
    draft = rule(workspace, now, "Document the integration tests.", minutes=4)
    new = entry_changes.entry_update(workspace=workspace, entry_id=draft.pk, content=NEVER, now=now).entry
    assert sweep(workspace, now).count == 1
    assert flagged(workspace) == {pair(always, new)}


def test_the_sweep_never_touches_another_workspace(workspace, other_workspace, now):
    rule(other_workspace, now, ALWAYS, minutes=2)
    rule(other_workspace, now, NEVER, minutes=1)
    mine = rule(workspace, now, ALWAYS, minutes=3)
    assert sweep(workspace, now).count == 0  # my one rule has nothing to contradict it
    assert Dispute.objects.count() == 0
    assert sweep(other_workspace, now).count == 1
    assert not Dispute.objects.filter(workspace=workspace).exists()
    assert (
        not Dispute.objects.filter(entry_a=mine).exists()
        and not Dispute.objects.filter(entry_b=mine).exists()
    )


def test_the_sweep_makes_a_constant_number_of_queries(workspace, now):
    def queries(n: int) -> int:
        Dispute.objects.all().delete()
        Entry.objects.filter(workspace=workspace).delete()
        for i in range(n):
            rule(workspace, now, f"Always {topic(i)}.", minutes=2 * i + 2)
            rule(workspace, now, f"Never {topic(i)}.", minutes=2 * i + 1)
        ctx = context(workspace, now)
        with CaptureQueriesContext(connection) as captured:
            assert contradictions.flag_contradictions(ctx).count == n
        return len([q for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]])

    assert queries(2) == queries(8) <= 3


def test_full_runs_count_flagged_disputes(workspace, now):
    """Through run_maintenance: needs pass 14 wired to contradictions.flag_contradictions."""
    rule(workspace, now, ALWAYS, minutes=2)
    rule(workspace, now, NEVER, minutes=1)
    dry = run_maintenance(workspace=workspace, now=now, dry_run=True)
    assert dry["counts"]["disputes_flagged"] == 1 and Dispute.objects.count() == 0
    real = run_maintenance(workspace=workspace, now=now, dry_run=False)
    assert real["counts"]["disputes_flagged"] == 1
    assert Dispute.objects.get().run_id == real["run_id"]
    again = run_maintenance(workspace=workspace, now=now, kind="contradictions", dry_run=False)
    assert again["counts"]["disputes_flagged"] == 0 and Dispute.objects.count() == 1


# --- resolving --------------------------------------------------------------------------------


@pytest.fixture
def dispute(workspace, now) -> Dispute:
    rule(workspace, now - timedelta(days=2), ALWAYS)
    rule(workspace, now - timedelta(days=1), NEVER)
    sweep(workspace, now - timedelta(days=1))
    return Dispute.objects.get()


def test_keep_both_only_resolves(workspace, now, dispute):
    result = contradictions.resolve(workspace, dispute.pk, "keep_both", actor="user:ann", now=now)
    assert result["archived"] == [] and result["winner"] is None and result["relationship"] is None
    resolved = result["dispute"]
    assert (resolved.status, resolved.resolution, resolved.resolved_by, resolved.resolved_at) == (
        "resolved",
        "keep_both",
        "user:ann",
        now,
    )
    assert set(Entry.objects.values_list("status", flat=True)) == {"active"}


@pytest.mark.parametrize(("resolution", "loser"), [("keep_first", "entry_b"), ("keep_second", "entry_a")])
def test_keeping_one_archives_the_other_revertibly(workspace, now, dispute, resolution, loser):
    loser_id = getattr(dispute, f"{loser}_id")
    kept_id = dispute.entry_a_id if loser == "entry_b" else dispute.entry_b_id
    result = contradictions.resolve(workspace, dispute.pk, resolution, actor="user:ann", now=now)
    assert result["archived"] == [loser_id] and result["winner"] == kept_id
    archived = Entry.objects.get(pk=loser_id)
    assert (archived.status, archived.archived_at, archived.status_changed_at) == ("archived", now, now)
    assert archived.scored_at == now
    assert Entry.objects.get(pk=kept_id).status == "active"
    event = LifecycleEvent.objects.get(entry_id=loser_id, to_status="archived")
    assert (event.reason, event.details, event.automatic, event.actor, event.from_status) == (
        "dispute",
        {"dispute": dispute.pk},
        False,
        "user:ann",
        "active",
    )
    assert result["dispute"].resolution == resolution
    restored = entry_changes.entry_restore(workspace=workspace, entry_id=loser_id, actor="user:ann")
    assert restored.status == "active"


def test_a_stale_loser_is_restored_to_its_earlier_live_status(workspace, now, dispute):
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=dispute.entry_b_id, status="stale", reason="manual"
    )
    contradictions.resolve(workspace, dispute.pk, "keep_first", actor="user:ann", now=now)
    assert entry_changes.entry_restore(workspace=workspace, entry_id=dispute.entry_b_id).status == "active"


def test_supersede_defaults_to_the_newer_entry(workspace, now, dispute):
    older, newer = Entry.objects.order_by("created_at")
    result = contradictions.resolve(workspace, dispute.pk, "supersede", actor="user:ann", now=now)
    assert result["winner"] == newer.pk and result["archived"] == [older.pk]
    link = Relationship.objects.get(pk=result["relationship"])
    assert (link.from_entry_id, link.to_entry_id, link.type) == (newer.pk, older.pk, "supersedes")
    assert Entry.objects.get(pk=older.pk).status == "archived"
    assert Entry.objects.get(pk=newer.pk).status == "active"


def test_supersede_with_a_chosen_winner(workspace, now, dispute):
    older, newer = Entry.objects.order_by("created_at")
    # An existing identical link is fine.
    relationships.relationship_create(
        workspace=workspace, from_id=older.pk, to_id=newer.pk, type="supersedes"
    )
    result = contradictions.resolve(
        workspace, dispute.pk, "supersede", actor="user:ann", winner_id=older.pk, now=now
    )
    assert result["winner"] == older.pk and result["archived"] == [newer.pk]
    assert Relationship.objects.filter(from_entry=older, to_entry=newer, type="supersedes").count() == 1


def test_resolution_refusals(workspace, other_workspace, now, dispute):
    with pytest.raises(InvalidInput):
        contradictions.resolve(workspace, dispute.pk, "merge", actor="user:ann", now=now)
    with pytest.raises(InvalidInput):
        contradictions.resolve(workspace, dispute.pk, "keep_first", actor="a", winner_id=dispute.entry_a_id)
    with pytest.raises(InvalidInput):
        contradictions.resolve(
            workspace, dispute.pk, "supersede", actor="a", winner_id=dispute.entry_b_id + 99
        )
    with pytest.raises(NotFound):
        contradictions.resolve(other_workspace, dispute.pk, "keep_both", actor="user:bob", now=now)
    with pytest.raises(NotFound):
        contradictions.resolve(workspace, "x", "keep_both", actor="user:ann", now=now)
    with pytest.raises(NotFound):
        contradictions.resolve(workspace, dispute.pk + 1000, "keep_both", actor="user:ann", now=now)
    assert Dispute.objects.get().status == "open"
    contradictions.resolve(workspace, dispute.pk, "keep_first", actor="user:ann", now=now)
    with pytest.raises(Conflict):
        contradictions.resolve(workspace, dispute.pk, "keep_second", actor="user:ann", now=now)
    assert Entry.objects.filter(status="archived").count() == 1


def test_an_entry_gone_or_rewritten_since_is_left_alone(workspace, now, dispute):
    entry_changes.entry_tombstone(workspace=workspace, entry_id=dispute.entry_b_id)
    result = contradictions.resolve(
        workspace, dispute.pk, "supersede", actor="a", winner_id=dispute.entry_a_id
    )
    assert result["archived"] == [] and result["relationship"] is None
    assert result["dispute"].status == "resolved"
    assert Entry.objects.get(pk=dispute.entry_b_id).status == Status.TOMBSTONED

    rule(workspace, now, "Always deploy from the release branch.", minutes=2)
    rule(workspace, now, "Never deploy from the release branch.", minutes=1)
    sweep(workspace, now)
    second = Dispute.objects.get(status="open")
    rewritten = entry_changes.entry_update(
        workspace=workspace, entry_id=second.entry_b_id, content="Deploy from tags.", now=now
    ).entry
    result = contradictions.resolve(workspace, second.pk, "keep_first", actor="a", now=now)
    assert result["archived"] == [] and Entry.objects.get(pk=rewritten.pk).status == "active"


# --- the queue -----------------------------------------------------------------------------------


def test_disputes_page(workspace, other_workspace, now):
    for i in range(3):
        rule(workspace, now, f"Always {topic(i)}.", minutes=10 * i + 2)
        rule(workspace, now, f"Never {topic(i)}.", minutes=10 * i + 1)
        sweep(workspace, now + timedelta(minutes=i))  # one new dispute per sweep, newest last
    rule(other_workspace, now, ALWAYS)
    rule(other_workspace, now, NEVER)
    sweep(other_workspace, now)
    ids = list(
        Dispute.objects.filter(workspace=workspace).order_by("-created_at").values_list("pk", flat=True)
    )
    count, items = contradictions.disputes_page(workspace)
    assert count == 3 and [d.pk for d in items] == ids
    contradictions.resolve(workspace, ids[0], "keep_both", actor="a", now=now)
    count, items = contradictions.disputes_page(workspace, status="open", limit=1, offset=1)
    assert count == 2 and [d.pk for d in items] == [ids[2]]
    with CaptureQueriesContext(connection) as captured:
        count, items = contradictions.disputes_page(workspace, limit=50)
        assert all(d.entry_a.content and d.entry_b.content for d in items)
    assert len(captured) == 2
    with pytest.raises(InvalidInput):
        contradictions.disputes_page(workspace, status="closed")
