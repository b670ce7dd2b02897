"""Contradictions: polarity, topic signatures, the sweep, the check on write and
the operator's resolution of a dispute.

Two entries conflict when their polarities (prohibition vs positive markers) are non-zero and
opposite and the Jaccard similarity of their topic signatures is ≥ ``MIN_SIMILARITY``. Only
latest, active or stale, durable entries are compared; a pair is flagged once per kind,
whatever became of its dispute, and disputes belong to versions. A resolution archives (a
manual LifecycleEvent, undone by a restore) and may link ``supersedes``; nothing is ever
merged or deleted. The marker rules, the signature and the choices are in docs/quality.md
("Contradictions").
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from datetime import datetime
from typing import Any, NamedTuple

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from maintenance.models import Dispute, DisputeStatus, Resolution
from maintenance.pass_tools import PassResult, RunContext
from maintenance.plan_status import status_in
from maintenance.text import content_words, words
from memory import holds, lifecycle, relationships
from memory.errors import Conflict, InvalidInput, NotFound
from memory.models import Entry, Workspace
from memory.models.choices import (
    ID_MAX,
    LISTED_STATUSES,
    VISIBLE_STATUSES,
    EntryType,
    HoldReason,
    RelationshipType,
    Source,
    Status,
    Tier,
)
from memory.scoring_db import refresh_scores

KIND = "polarity_conflict"
SIGNATURE_WORDS = 24
MIN_SIMILARITY = 0.4
WRITE_CHECK_LIMIT = 40
WRITE_CHECK_IMPORTANCE = 0.5
DURABLE_TIERS = (Tier.SEMANTIC, Tier.PROCEDURAL, Tier.CONSTITUTIONAL)
DURABLE_TYPES = (EntryType.DECISION, EntryType.RULE, EntryType.LESSON)
ARCHIVE_REASON = "dispute"

# --- markers ------------------------------------------------------------------------------

NEGATIVE = """
never | do not | don't | must not | mustn't | should not | shouldn't | avoid
forbid | forbids | forbidden | disallow | disallowed | prohibit | prohibited | not allowed
nunca | não | nao | jamais | evite | evitem | evitar | proibido | proibida | proibidos | proibidas
jamás | jamas | evita | eviten | prohibido | prohibida | prohibidos | prohibidas
évite | évitez | éviter | evitez | interdit | interdite | interdits | interdites
nie | niemals | nicht | kein | keine | keinen | keinem | keiner | keines
vermeide | vermeiden | vermeidet | verboten
"""
POSITIVE = """
always | must | ensure | require | required | prefer | preferred | should | make sure | be sure
mandatory
sempre | deve | devem | deveria | deveriam | garanta | certifique-se | prefira | prefiram
obrigatório | obrigatória
siempre | debe | debes | deben | debería | deberías | asegúrate | asegúrese | prefiere | prefiera
prefieran | obligatorio | obligatoria
toujours | doit | doivent | devez | assurez-vous | assure-toi | veillez | préférez | privilégiez
obligatoire | il faut
immer | stets | muss | musst | müssen | müsst | soll | sollst | sollen | sollte | solltest | sollten
stelle sicher | stellen sie sicher | stellt sicher | sicherstellen | bevorzuge | bevorzugen
erforderlich
"""
# Double negatives ask for something: "never skip the lint" means "always run it", so they
# count as positive. A negated requirement ("not required") is neither.
OMITTING = r"(?:forget|skip|omit|neglect)(?!\w)"
POSITIVE_OVERRIDES = (
    rf"(?<!\w)(?:do\s+not|don't|never|must\s+not|mustn't|should\s+not|shouldn't)\s+{OMITTING}"
    r"|(?<!\w)(?:n'oubliez\s+pas|nicht\s+vergessen|não\s+(?:se\s+)?esqueça|no\s+(?:te\s+)?olvides)(?!\w)"
)
NEUTRAL = "not required | not mandatory | not always | not necessarily | no need | need not | needn't"
FILLERS = "to you that we they also try que de à dass du sie wir"
NEGATIVE_CJK = (
    "不要 禁止 切勿 不得 避免 严禁 不应该 不应 "
    "しないで ないでください てはいけない てはならない べきではない べきでない 決して 避けて 避ける"
)
POSITIVE_CJK = "总是 始终 必须 务必 确保 应该 应当 一定要 必ず 常に 必須 べき"
OVERRIDES_CJK = "不得不"
# "stop" forbids only with a gerund: "stop using X"; "stop and ask the user" is no prohibition.
STOP = r"(?<!\w)stop(?=\s+[^\W\d_]+ing(?!\w))"
# French negation: ne/n' … pas|jamais|plus, up to three words apart; the words between are
# the verb and its pronouns, and stay in the signature.
FRENCH_NEGATION = r"(?<!\w)(?:ne\s+|n')(?P<between>(?:\w+['\s]+){0,3}?)(?:pas|jamais|plus)(?!\w)"
SPANISH_NO = r"(?<!\w)no(?!\w)"
SPANISH_HINTS = (
    "el los las del una para con que por siempre nunca debe debes deben usar está están hay pero "
    "cuando también esto este esta"
)
ENGLISH_HINTS = "the and of to is are be for with you your this that it in on when if"
PORTUGUESE_HINTS = "não nao você vocês uma um em do dos ao aos é são também então isso isto"
# English words that are prohibitions only in some places (see ``_counts``).
DESCRIBING_NEVER = (
    "is are was were be been being will would can could may might has have had does did that which who it"
)
TRYING = "try tries trying careful hard"
APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u2032": "'"})
INLINE_CODE = re.compile(r"`[^`]*`")
WORD = re.compile(r"[\w']+")


def _terms(spec: str) -> list[str]:
    return [t.strip() for t in spec.replace("\n", "|").split("|") if t.strip()]


def _latin(terms: list[str]) -> str:
    """Whole-word alternatives, longest first; a space in a term matches any whitespace."""
    alts = sorted(terms, key=len, reverse=True)
    return r"(?<!\w)(?:" + "|".join(re.escape(t).replace(r"\ ", r"\s+") for t in alts) + r")(?!\w)"


def _cjk(spec: str) -> str:
    return "|".join(sorted(spec.split(), key=len, reverse=True))


def _compile(*, spanish_no: bool) -> re.Pattern[str]:
    negative = [_latin(_terms(NEGATIVE)), STOP, FRENCH_NEGATION, _cjk(NEGATIVE_CJK)]
    if spanish_no:
        negative.append(SPANISH_NO)
    neg = "|".join(negative)
    pos = "|".join([_latin(_terms(POSITIVE)), _cjk(POSITIVE_CJK)])
    fillers = r"(?:\s+" + _latin(FILLERS.split()) + r"){0,2}"
    # A positive modal right before a negative marker, or right after it, belongs to it.
    negative_phrase = rf"(?P<modal>(?:{pos}){fillers}\s*)?(?:{neg})(?:\s+(?:se\s+)?(?:{pos}))?"
    overrides = "|".join([POSITIVE_OVERRIDES, _cjk(OVERRIDES_CJK)])
    # At each position the first alternative that matches wins.
    alternatives = [
        rf"(?P<neutral>{_latin(_terms(NEUTRAL))})",
        rf"(?P<pos>{overrides})",
        rf"(?P<neg>{negative_phrase})",
        rf"(?P<pos2>{pos})",
    ]
    return re.compile("|".join(alternatives))


_MARKERS = _compile(spanish_no=False)
_MARKERS_ES = _compile(spanish_no=True)


def _prepare(text: str) -> str:
    return unicodedata.normalize("NFC", text).casefold().translate(APOSTROPHES)


def _looks_spanish(text: str) -> bool:
    """Spanish ``no`` counts unless the text looks Portuguese ("no" = "in the") or English
    ("no need", "no longer" describe): a Spanish function word, or none of English's."""
    found = set(words(text))
    if not found.isdisjoint(PORTUGUESE_HINTS.split()) or "ã" in text:
        return False
    return not found.isdisjoint(SPANISH_HINTS.split()) or found.isdisjoint(ENGLISH_HINTS.split())


def _counts(text: str, m: re.Match[str]) -> int:
    """The sign a marker adds: +1, −1, or 0 for one that only describes (the English rules of
    docs/quality.md: descriptive "never", purpose "to avoid")."""
    if m.lastgroup == "neutral":
        return 0
    if m.lastgroup != "neg":
        return 1
    if m.group("modal"):
        return -1
    word = m.group().split()[0]
    before = text[: m.start()].rstrip()
    at_clause_start = not before or not before[-1].isalnum()
    prior = WORD.findall(before[-80:])
    previous = "" if at_clause_start or not prior else prior[-1]
    if word == "never":
        return 0 if previous in DESCRIBING_NEVER.split() else -1
    if word == "avoid" and previous == "to":
        return -1 if set(TRYING.split()) & set(prior[-3:-1]) else 0
    return -1


def _markers(text: str) -> list[tuple[re.Match[str], int]]:
    """Every marker of a prepared text with the sign it adds. Inline code is masked as one
    word (its words are code, not language) without moving any position."""
    masked = INLINE_CODE.sub(lambda c: "x" * len(c.group()), text)
    pattern = _MARKERS_ES if _looks_spanish(masked) else _MARKERS
    return [(m, _counts(masked, m)) for m in pattern.finditer(masked)]


class Profile(NamedTuple):
    polarity: int
    signature: frozenset[str]


def profile(text: str) -> Profile:
    """Polarity and signature of one text, from one scan for markers."""
    text = _prepare(text)
    found = _markers(text)
    negative = sum(1 for _, sign in found if sign < 0)
    positive = sum(1 for _, sign in found if sign > 0)
    polarity = (negative < positive) - (negative > positive)
    rest, last = [], 0
    for m, _ in found:
        rest.append(text[last : m.start()])
        if m.group("between"):
            rest.append(text[m.start("between") : m.end("between")])
        last = m.end()
    rest.append(text[last:])
    topic = content_words(" ".join(rest))
    return Profile(polarity, frozenset(topic[:SIGNATURE_WORDS]))


def polarity(text: str) -> int:
    """−1 when the text has more prohibition markers than positive ones, +1 for the reverse,
    else 0."""
    return profile(text).polarity


def signature(text: str) -> frozenset[str]:
    """The first 24 content words that are not part of a polarity marker, as a set."""
    return profile(text).signature


def jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def _similarity(a: Profile, b: Profile) -> float | None:
    if a.polarity * b.polarity >= 0:
        return None
    similarity = jaccard(a.signature, b.signature)
    return similarity if similarity >= MIN_SIMILARITY else None


def conflict(text_a: str, text_b: str) -> float | None:
    """The Jaccard similarity of the signatures when the two texts have opposite non-zero
    polarities and similarity ≥ 0.4; else None."""
    return _similarity(profile(text_a), profile(text_b))


def entry_text(title: str, content: str) -> str:
    return f"{title}\n{content}"


# --- flagging -------------------------------------------------------------------------------


def _dispute(
    workspace_id: int, x: tuple[int, Profile], y: tuple[int, Profile], similarity: float, **fields: Any
) -> Dispute:
    (a, pa), (b, pb) = sorted([x, y], key=lambda item: item[0])
    return Dispute(
        workspace_id=workspace_id,
        entry_a_id=a,
        entry_b_id=b,
        kind=KIND,
        similarity=similarity,
        details={
            "polarity_a": pa.polarity,
            "polarity_b": pb.polarity,
            "shared": sorted(pa.signature & pb.signature),
        },
        **fields,
    )


def _insert(rows: list[Dispute]) -> list[Dispute]:
    """Insert the disputes at once. Should a concurrent check have flagged one of the pairs
    meanwhile (the unique constraint), insert the others one by one. Open pages get the new
    dispute count (after commit), whichever door the write came through."""
    if not rows:
        return []
    lifecycle.announce(rows[0].workspace_id)
    try:
        with transaction.atomic():
            return Dispute.objects.bulk_create(rows)
    except IntegrityError:
        made = []
        for row in rows:
            row.pk = None
            try:
                with transaction.atomic():
                    row.save(force_insert=True)
            except IntegrityError:
                continue
            made.append(row)
        return made


def _known_pairs(workspace: Workspace | int, ids: list[int]) -> set[tuple[int, int]]:
    wanted = set(ids)
    rows = Dispute.objects.filter(workspace=workspace, kind=KIND, entry_a_id__in=ids).values_list(
        "entry_a_id", "entry_b_id"
    )
    return {(a, b) for a, b in rows if b in wanted}


def _without_excluded_tags(qs: QuerySet[Entry], tags: tuple[str, ...]) -> QuerySet[Entry]:
    if not tags:
        return qs
    tagged = Entry.tags.through.objects.filter(entry_id=OuterRef("pk"), tag__name__in=list(tags))
    return qs.exclude(Exists(tagged))


def flag_contradictions(ctx: RunContext) -> PassResult:
    """14. Compare the newest ``contradiction_batch`` live durable entries pairwise (opposite
    polarities only) and flag each new conflicting pair, up to ``contradiction_max_flags``.
    Three queries: the batch, the disputes already among it, one insert."""
    candidates = Entry.objects.filter(
        Q(tier__in=DURABLE_TIERS) | Q(entry_type__in=DURABLE_TYPES),
        status_in(VISIBLE_STATUSES),
        workspace=ctx.workspace,
        is_latest=True,
    )
    rows = (
        _without_excluded_tags(candidates, ctx.policy.exclude_tags)
        .order_by("-created_at", "-pk")
        .values_list("pk", "title", "content")[: ctx.policy.contradiction_batch]
    )
    polar = [(pk, p) for pk, title, content in rows if (p := profile(entry_text(title, content))).polarity]
    if not polar:
        return PassResult()
    known = _known_pairs(ctx.workspace, [pk for pk, _ in polar])
    # Per sign, the positions (newest first) of the entries with that polarity.
    positions: dict[int, list[int]] = {1: [], -1: []}
    for i, (_, p) in enumerate(polar):
        positions[p.polarity].append(i)
    new: list[Dispute] = []
    limit = ctx.policy.contradiction_max_flags
    for i, (pk, p) in enumerate(polar):
        others = positions[-p.polarity]
        for j in others[bisect_right(others, i) :]:
            other_pk, other = polar[j]
            if (min(pk, other_pk), max(pk, other_pk)) in known:
                continue
            similarity = _similarity(p, other)
            if similarity is None:
                continue
            new.append(
                _dispute(ctx.workspace.pk, polar[i], polar[j], similarity, detected_by="sweep", run=ctx.run)
            )
            if len(new) >= limit:
                break
        if len(new) >= limit:
            break
    for d in new:
        d.created_at = ctx.now
    created = _insert(new)
    ctx.heartbeat()
    entry_ids = list(dict.fromkeys(i for d in created for i in (d.entry_a_id, d.entry_b_id)))
    return PassResult(count=len(created), ids=entry_ids)


def check_on_write(entry: Entry, *, now: datetime | None = None) -> list[Dispute]:
    """Compare a just-written entry with the 40 newest constitutional, operator-rule or
    high-importance live entries of its workspace; flag each conflict not flagged yet.
    Returns the open disputes of every conflicting pair (new ones and ones already open)."""
    now = now or timezone.now()
    mine = profile(entry_text(entry.title, entry.content))
    if not mine.polarity:
        return []
    rows = (
        Entry.objects.filter(
            Q(tier=Tier.CONSTITUTIONAL)
            | Q(source=Source.OPERATOR, entry_type=EntryType.RULE)
            | Q(importance__gte=WRITE_CHECK_IMPORTANCE),
            workspace_id=entry.workspace_id,
            is_latest=True,
            status__in=VISIBLE_STATUSES,
        )
        .exclude(pk=entry.pk)
        .exclude(lineage_id=entry.lineage_id or entry.pk)
        .order_by("-created_at", "-pk")
        .values_list("pk", "title", "content")[:WRITE_CHECK_LIMIT]
    )
    hits = []
    for pk, title, content in rows:
        other = profile(entry_text(title, content))
        similarity = _similarity(mine, other)
        if similarity is not None:
            hits.append(((pk, other), similarity))
    if not hits:
        return []
    existing = {
        (d.entry_a_id, d.entry_b_id): d
        for d in Dispute.objects.filter(workspace_id=entry.workspace_id, kind=KIND).filter(
            Q(entry_a_id=entry.pk) | Q(entry_b_id=entry.pk)
        )
    }
    new = []
    for (pk, other), similarity in hits:
        if (min(pk, entry.pk), max(pk, entry.pk)) not in existing:
            new.append(
                _dispute(entry.workspace_id, (entry.pk, mine), (pk, other), similarity, detected_by="write")
            )
    for d in new:
        d.created_at = now
    for d in _insert(new):
        existing[(d.entry_a_id, d.entry_b_id)] = d
    named = [existing.get((min(pk, entry.pk), max(pk, entry.pk))) for (pk, _), _ in hits]
    return [d for d in named if d is not None and d.status == DisputeStatus.OPEN]


# --- the operator's side ----------------------------------------------------------------------


def disputes_page(
    workspace: Workspace, *, status: str | None = None, limit: int = 50, offset: int = 0
) -> tuple[int, list[Dispute]]:
    """Disputes of the workspace, newest first, with both entries (two queries in all)."""
    qs = Dispute.objects.filter(workspace=workspace)
    if status is not None:
        if status not in DisputeStatus.values:
            raise InvalidInput(f"status: must be one of {', '.join(DisputeStatus.values)}")
        qs = qs.filter(status=status)
    page = qs.select_related("entry_a", "entry_b").order_by("-created_at", "-pk")[offset : offset + limit]
    return qs.count(), list(page)


def _current(entry: Entry, statuses: tuple[str, ...]) -> bool:
    return entry.is_latest and entry.status in statuses


def resolve(
    workspace: Workspace,
    dispute_id: Any,
    resolution: str,
    *,
    actor: str,
    winner_id: int | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Resolve an open dispute (the rules: docs/quality.md, "Contradictions"). Returns {"dispute", "archived"
    (entry ids), "winner" (id or None), "relationship" (id of the supersedes link or None)}."""
    now = now or timezone.now()
    if resolution not in Resolution.values:
        raise InvalidInput(f"resolution: must be one of {', '.join(Resolution.values)}")
    if winner_id is not None and resolution != Resolution.SUPERSEDE:
        raise InvalidInput("winner_id: only a supersede resolution takes a winner")
    try:
        pk = int(dispute_id)
    except (TypeError, ValueError):
        pk = 0
    if not 0 < pk <= ID_MAX:
        raise NotFound(f"dispute {dispute_id!r} not found")
    # The loser's archive and the holds reach open pages as one update, after the commit.
    with lifecycle.coalesced(), transaction.atomic():
        dispute = Dispute.objects.select_for_update().filter(workspace=workspace, pk=pk).first()
        if dispute is None:
            raise NotFound(f"dispute {pk} not found")
        if dispute.status == DisputeStatus.RESOLVED:
            raise Conflict(f"dispute {pk} is already resolved ({dispute.resolution})")
        pair = {
            e.pk: e
            for e in Entry.objects.select_for_update().filter(pk__in=[dispute.entry_a_id, dispute.entry_b_id])
        }
        a, b = pair[dispute.entry_a_id], pair[dispute.entry_b_id]
        winner: Entry | None = None
        if resolution == Resolution.KEEP_FIRST:
            winner = a
        elif resolution == Resolution.KEEP_SECOND:
            winner = b
        elif resolution == Resolution.SUPERSEDE:
            if winner_id is None:
                winner = max(a, b, key=lambda e: (e.created_at, e.pk))
            elif winner_id in pair:
                winner = pair[winner_id]
            else:
                raise InvalidInput(f"winner_id: must be {a.pk} or {b.pk}, an entry of this dispute")
        archived: list[int] = []
        link = None
        if winner is not None:
            loser = b if winner is a else a
            alive = LISTED_STATUSES
            if resolution == Resolution.SUPERSEDE and _current(winner, alive) and _current(loser, alive):
                link, _ = relationships.relationship_create(
                    workspace=workspace,
                    from_id=winner.pk,
                    to_id=loser.pk,
                    type=RelationshipType.SUPERSEDES,
                    actor=actor,
                    now=now,
                )
            if _current(loser, (Status.STAGED, Status.ACTIVE, Status.STALE)):
                lifecycle.change_entry(
                    loser,
                    Status.ARCHIVED,
                    reason=ARCHIVE_REASON,
                    actor=actor,
                    now=now,
                    details={"dispute": dispute.pk},
                )
                archived.append(loser.pk)
        # The entries the operator decided for are held: no pass archives what they kept.
        kept: dict[str, list[int]] = {
            Resolution.KEEP_BOTH: [a.pk, b.pk],
            Resolution.KEEP_FIRST: [a.pk],
            Resolution.KEEP_SECOND: [b.pk],
        }
        held_ids = kept.get(resolution, [winner.pk] if winner is not None else [])
        holds.hold(workspace, held_ids, reason=HoldReason.DISPUTE, actor=actor, now=now)
        dispute.status = DisputeStatus.RESOLVED
        dispute.resolution = resolution
        dispute.resolved_by = actor
        dispute.resolved_at = now
        dispute.save(update_fields=["status", "resolution", "resolved_by", "resolved_at"])
        if archived:
            refresh_scores(workspace, now=now, ids=[*archived, *relationships.neighbour_ids(archived)])
    return {
        "dispute": Dispute.objects.select_related("entry_a", "entry_b").get(pk=dispute.pk),
        "archived": archived,
        "winner": winner.pk if winner else None,
        "relationship": link.pk if link else None,
    }
