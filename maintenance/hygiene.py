"""Hygiene: explainable junk detection and the low-quality pass (pass 6).

**Detectors** — pure functions over plain strings, no ORM. Each returns a ``Reason`` (code,
points, a human-readable detail) or ``None``. Text is NFC-normalised; words come from
``maintenance.text`` (each CJK-like character is one word).

- ``incomplete_fragment`` (2): fewer than 9 content words in title + content.
- ``truncated_or_unbalanced`` (2): title or content ends in ``…`` or ``...`` (not after
  "etc"); or, in title or content, an unclosed code fence, a stray inline backtick, unbalanced
  brackets ``()[]{}`` or unbalanced quotes. A *fence* is any run of three or more backticks
  (an odd number of them leaves one open, wherever the closing one stands). Before brackets
  and quotes are checked, code is removed (fences, and inline spans: a run of backticks up to
  the next run of the same length, so Markdown `x` and rST ``x`` alike), then URLs (with or
  without a scheme; a closing bracket or punctuation the URL did not open stays with the
  text) and emoticons such as ``:)``. A ``)`` after a list enumerator (``1)``, ``a)``, ``iv)``
  at the start of a line or after whitespace) is ignored when nothing opened it. Quotes:
  straight ``"`` must be even, ``“ ” „`` together even, ``« »`` together even; apostrophes and
  single quotes are never counted.
- ``code_heavy`` (1), on the content: ≥ 4 backticks with a density (backticks / characters)
  above 0.015, a deliberate rule — so a short note naming two identifiers in backticks
  counts (one point: alone it never recommends archiving; bench/reports/hygiene-flask.md
  shows how often it fires on real commit messages). Or: more than half of the non-empty
  lines are code. Lines
  inside a fence or holding a fence marker are code; another line is code-like when it ends
  in ``;``, ``{`` or ``}``, or starts like code — ``def f(``, ``async def``, ``class C(``/``:``,
  a whole-line ``import a, b as c`` or ``import x from '…'``, ``from x import``, ``return``
  followed by one token or by code punctuation, ``const/let/var x =``, ``function f(``,
  ``$ `` (shell prompt), ``>>>``, ``#include``, a decorator ``@a.b``/``@a(…)`` — or has the
  shape of an assignment (``name = value``, ``obj.attr[key] += value``; not ``==`` or ``=>``),
  of one call (``obj.method(…)`` as the whole line) or of closing brackets alone (``});``).
  Lower-case keywords only: "Return the value" is prose.
- ``implementation_residue`` (2): any residue pattern matches (below).
- ``exact_duplicate`` (4): an older live entry (latest version, staged/active/stale) of the
  workspace has the same content_hash; older = earlier created_at, then lower id. The oldest
  copy is never flagged.
- ``flagged_by_feedback`` (2): last feedback stale or wrong.
- ``legacy_import`` (1): source import.

Score = the sum of points. An entry is a candidate at score ≥ 2, so ``legacy_import`` alone
never lists it (an imported journal is not junk for being imported). Recommendation
``archive`` when score ≥ 4 and never accessed (access_count 0), else ``review``.

**Residue patterns** (``MaintenancePolicy.residue_patterns``): a JSON list of strings, each a
case-insensitive Python regular expression searched in title + content. Null or an empty list
means the built-in ``DEFAULT_RESIDUE_PATTERNS``; a stored list replaces them entirely. The
token ``<source-path>`` stands for the built-in bare-source-path detector: a slash-separated
path ending in a source-file extension (``services/x.ts``, ``./src/app.py``) outside code, URLs
and e-mail addresses (``docs/api.rst`` is documentation, not source). ``clean_residue_patterns``
validates a list for storage and refuses a bad one; at run time a stored pattern that does not
compile is skipped, never a crash.

**Services** (ORM): ``preview``, ``count``, ``candidates``, ``apply``, ``keep`` and
``archive_low_quality`` (pass 6). The text detectors' verdict and its points are stored per
entry (``HygieneAssessment``) and reused while the entry's title and content hash and the
residue patterns (with ``DETECTORS_VERSION``) stay the ones it was made with. The queue first
assesses the entries that have no valid verdict (keyset batches), then lets the database add
the column reasons' points, filter, count and rank (``_scored``): a page or the tab's count
reads no entry it does not show. Pass 6 scans in batches instead, since a run's plan must not
store verdicts.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import IO, Any, NamedTuple

import orjson
from django.db import connection, transaction
from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    IntegerField,
    JSONField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Cast
from django.utils import timezone

from maintenance.models import HygieneAssessment
from maintenance.passes import PassResult, RunContext, latest, transition, unprotected
from maintenance.plan_status import status_in
from maintenance.text import content_words, normalise
from memory import holds, lifecycle
from memory.capped import capped_count
from memory.models import Entry, Workspace
from memory.models.choices import LIVE_STATUSES, HoldReason, Source, Status
from memory.models.entries import protected
from memory.policy import SOURCE_PATH, PolicyValues
from memory.policy_model import MaintenancePolicy
from memory.relationships import neighbour_ids
from memory.scoring_db import refresh_scores

MIN_CONTENT_WORDS = 9
# Points of each reason: the detectors below and the SQL score of ``_scored`` read them here.
POINTS = {
    "incomplete_fragment": 2,
    "truncated_or_unbalanced": 2,
    "code_heavy": 1,
    "implementation_residue": 2,
    "exact_duplicate": 4,
    "flagged_by_feedback": 2,
    "legacy_import": 1,
}
CANDIDATE_SCORE = 2  # listed from 2 points: legacy_import (1) alone never lists an entry
ARCHIVE_SCORE = 4
EXCERPT_CHARS = 300
BATCH_SIZE = 1000
MIN_BACKTICKS = 4
BACKTICK_DENSITY = 0.015
CODE_SHARE = 0.5  # of the lines, or of the characters (backtick branch)
FEEDBACK_FLAGS = ("stale", "wrong")

DEFAULT_RESIDUE_PATTERNS: tuple[str, ...] = (
    r"\bimplementation\s+plan\b",
    r"\bmaster\s?plan\b",
    r"\badded\s+after\s+user\s+feedback\b",
    SOURCE_PATH,
)


@dataclass(frozen=True)
class Reason:
    code: str
    points: int
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "points": self.points, "detail": self.detail}


# --- text helpers -------------------------------------------------------------------------

_FENCE = re.compile(r"`{3,}")
_INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_BACKTICK_RUN = re.compile(r"`+")
# URLs, with or without a scheme (github.com/x/y.py is an address, not a bare path).
_URL = re.compile(
    r"\b[a-z][a-z0-9+.-]*://\S+|\bwww\.\S+|\b(?:[a-z0-9-]+\.)+(?:com|org|net|io|dev|edu|gov|co|app)/\S*",
    re.I,
)
_EMOTICON = re.compile(r"(?<!\S)[:;=]'?-?[()\[\]](?![\w(\[])")
_ENUMERATOR = re.compile(r"(?<!\S)(?:\d{1,3}|[A-Za-z]|[ivxIVX]{2,5})\)")
_BRACKETS = {")": "(", "]": "[", "}": "{"}
_TRUNCATED = ("…", "...")
_ETC = re.compile(r"\betc\s*(?:…|\.{3,})$", re.I)  # "and so on, etc..." is finished, not cut off


@dataclass(frozen=True)
class _Split:
    prose: str  # the text outside fences, inline code removed
    code_lines: int  # non-empty lines inside fences or holding a fence marker
    prose_lines: list[str]  # the other non-empty lines (inline code kept)
    open_fence: bool
    stray_backticks: int


def _split(text: str) -> _Split:
    """Fences are runs of three or more backticks; each toggles between prose and code wherever
    it stands, so an odd number leaves a fence open. A line is code when it starts inside a
    fence or holds a fence marker."""
    parts = _FENCE.split(text)
    prose = _INLINE_CODE.sub(" ", "\n".join(parts[0::2]))
    code_lines = 0
    prose_lines: list[str] = []
    in_fence = False
    for line in text.split("\n"):
        marks = len(_FENCE.findall(line))
        if in_fence or marks:
            code_lines += bool(line.strip())
        elif line.strip():
            prose_lines.append(line)
        in_fence ^= marks % 2 == 1
    return _Split(
        prose=prose,
        code_lines=code_lines,
        prose_lines=prose_lines,
        open_fence=len(parts) % 2 == 0,
        stray_backticks=len(_BACKTICK_RUN.findall(prose)),
    )


def _url_end(url: str) -> int:
    """Where a URL found by ``_URL`` really ends: trailing punctuation, and closing brackets it
    did not open, belong to the text around it ("(see https://x.org/a)." keeps its ")")."""
    end = len(url)
    while end:
        ch = url[end - 1]
        if ch in ".,:;!?'\"" or (
            ch in _BRACKETS and url.count(_BRACKETS[ch], 0, end) < url.count(ch, 0, end)
        ):
            end -= 1
        else:
            break
    return end


def _without_urls(text: str) -> str:
    return _URL.sub(lambda m: " " + m.group(0)[_url_end(m.group(0)) :], text)


def _plain(prose: str) -> str:
    """Prose without URLs (they may hold any bracket) and emoticons."""
    return _EMOTICON.sub(" ", _without_urls(prose))


def _bracket_problem(text: str) -> str | None:
    optional = {m.end() - 1 for m in _ENUMERATOR.finditer(text)}
    stack: list[str] = []
    for i, ch in enumerate(text):
        if ch in "([{":
            stack.append(ch)
        elif ch in _BRACKETS:
            if stack and stack[-1] == _BRACKETS[ch]:
                stack.pop()
            elif i not in optional:
                return f"unmatched '{ch}'"
    return f"unclosed '{stack[-1]}'" if stack else None


def _quote_problems(text: str) -> list[str]:
    problems = []
    for label, chars in (('"', '"'), ("“ ” „", "“”„"), ("« »", "«»")):
        n = sum(text.count(c) for c in chars)
        if n % 2:
            problems.append(f"odd number of {label} quotes ({n})")
    return problems


# --- detectors ----------------------------------------------------------------------------


def incomplete_fragment(title: str, content: str) -> Reason | None:
    n = len(content_words(f"{title}\n{content}"))
    if n >= MIN_CONTENT_WORDS:
        return None
    words = "content word" if n == 1 else "content words"
    return Reason(
        "incomplete_fragment", POINTS["incomplete_fragment"], f"{n} {words} (fewer than {MIN_CONTENT_WORDS})"
    )


def _unbalanced(text: str) -> list[str]:
    split = _split(text)
    problems = []
    if split.open_fence:
        problems.append("unclosed code fence")
    if split.stray_backticks:
        problems.append("unmatched inline backtick")
    plain = _plain(split.prose)
    bracket = _bracket_problem(plain)
    if bracket:
        problems.append(bracket)
    return problems + _quote_problems(plain)


def truncated_or_unbalanced(title: str, content: str) -> Reason | None:
    title, content = normalise(title).rstrip(), normalise(content).rstrip()
    problems = []
    for name, text in (("title", title), ("content", content)):
        end = next((e for e in _TRUNCATED if text.endswith(e)), None)
        if end and not _ETC.search(text):
            problems.append(f"{name} ends in '{end}'")
    problems += [f"title: {p}" for p in _unbalanced(title)] + _unbalanced(content)
    if not problems:
        return None
    return Reason("truncated_or_unbalanced", POINTS["truncated_or_unbalanced"], "; ".join(problems))


_CODE_START = re.compile(
    r"^(?:(?:async\s+)?def\s+\w+\s*\("
    r"|class\s+\w+\s*[:(]"
    r"|import\s+[\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*\s*;?$"
    r"|import\s.+\sfrom\s+['\"]"
    r"|from\s+[\w.]+\s+import\s"
    r"|return(?:\s*;?$|\s+\S+\s*;?$|\s.*[(){}\[\];=+*<>])"
    r"|(?:const|let|var)\s+\w+\s*="
    r"|function\s*\w*\s*\("
    r"|\$\s|>>>\s?"
    r"|#include\b"
    r"|@[A-Za-z_][\w.]*(?:\(.*\)|\.\w+)\s*$)"
)
_CODE_SHAPE = re.compile(
    r"^(?:[A-Za-z_][\w.]*(?:\[[^\]]*\])?\s*[-+*/%|&]?=(?![=>])\s*\S"  # assignment (not == or =>)
    r"|[A-Za-z_][\w.]*\(.*\)\s*;?$"  # a single call
    r"|[)\]}]+[;,]?$)"  # closing brackets alone
)


def is_code_line(line: str) -> bool:
    """A non-fenced line that looks like code (the heuristic of the module docstring)."""
    s = line.strip()
    return bool(s) and (s.endswith((";", "{", "}")) or bool(_CODE_START.match(s) or _CODE_SHAPE.match(s)))


def code_share(text: str) -> float:
    """The share of the visible characters (not spaces, not backticks) that stand inside
    fences or inline code spans."""
    parts = _FENCE.split(text)
    code = "".join(parts[1::2]) + "".join(m.group(2) for m in _INLINE_CODE.finditer("\n".join(parts[0::2])))
    total = _visible(text)
    return _visible(code) / total if total else 0.0


def _visible(text: str) -> int:
    return sum(1 for ch in text if not ch.isspace() and ch != "`")


def code_heavy(content: str) -> Reason | None:
    content = normalise(content)
    ticks = content.count("`")
    density = ticks / max(len(content), 1)
    if ticks >= MIN_BACKTICKS and density > BACKTICK_DENSITY:
        return Reason(
            "code_heavy",
            POINTS["code_heavy"],
            f"{ticks} backticks, density {density:.3f} (over {BACKTICK_DENSITY})",
        )
    split = _split(content)
    lines = split.code_lines + len(split.prose_lines)
    code = split.code_lines + sum(1 for line in split.prose_lines if is_code_line(line))
    if lines and code / lines > CODE_SHARE:
        return Reason("code_heavy", POINTS["code_heavy"], f"{code} of {lines} lines are code")
    return None


# Bare source paths: dir/…/name.ext with a source-file extension.
_SOURCE_EXT = (
    "py|pyi|pyx|js|jsx|mjs|cjs|ts|tsx|go|rs|java|kt|kts|scala|rb|php|c|h|cc|cpp|cxx|hh|hpp|cs|"
    "swift|m|mm|sh|bash|zsh|ps1|sql|vue|svelte|html|htm|css|scss|sass|less|lua|pl|ex|exs|erl|"
    "dart|jl|r"
)
_SOURCE_PATH = re.compile(
    rf"(?<![\w./:@~\\-])(?:\.{{1,2}}/)?(?:[\w@+-][\w.@+-]*/)+[\w+-][\w.+-]*\.(?:{_SOURCE_EXT})(?![\w/-])",
    re.I,
)
_EMAIL = re.compile(r"\S+@\S+\.\w+")

Pattern = re.Pattern[str] | str  # a compiled regex, or SOURCE_PATH


def compile_residue_patterns(value: Any) -> list[Pattern]:
    """The patterns to use: the stored ones, or the defaults when none are stored. Patterns
    that are not strings or do not compile are skipped."""
    raw = value if isinstance(value, list | tuple) and value else DEFAULT_RESIDUE_PATTERNS
    compiled: list[Pattern] = []
    for item in raw:
        if not isinstance(item, str) or not item.strip():
            continue
        if item.strip() == SOURCE_PATH:
            compiled.append(SOURCE_PATH)
            continue
        try:
            compiled.append(re.compile(item, re.I))
        except re.error:
            continue
    return compiled


def source_paths(text: str) -> list[str]:
    """Bare source paths in ``text``: outside code, URLs and e-mail addresses."""
    prose = _EMAIL.sub(" ", _without_urls(_split(normalise(text)).prose))
    return [m.group(0) for m in _SOURCE_PATH.finditer(prose)]


def implementation_residue(title: str, content: str, patterns: Sequence[Pattern]) -> Reason | None:
    text = normalise(f"{title}\n{content}")
    found: list[str] = []
    for pattern in patterns:
        if pattern == SOURCE_PATH:
            found += [f"source path {p}" for p in source_paths(text)[:3]]
        elif isinstance(pattern, re.Pattern) and (m := pattern.search(text)):
            found.append(f"'{m.group(0)[:60]}'")
    if not found:
        return None
    return Reason(
        "implementation_residue", POINTS["implementation_residue"], "found " + ", ".join(dict.fromkeys(found))
    )


def exact_duplicate(older_id: int | None) -> Reason | None:
    if older_id is None:
        return None
    return Reason("exact_duplicate", POINTS["exact_duplicate"], f"same content as older entry {older_id}")


def flagged_by_feedback(last_feedback: str | None) -> Reason | None:
    if last_feedback not in FEEDBACK_FLAGS:
        return None
    return Reason("flagged_by_feedback", POINTS["flagged_by_feedback"], f"feedback: {last_feedback}")


def legacy_import(source: str) -> Reason | None:
    if source != Source.IMPORT:
        return None
    return Reason("legacy_import", POINTS["legacy_import"], "imported (source import)")


def assess(
    *,
    title: str,
    content: str,
    source: str,
    last_feedback: str | None = None,
    duplicate_of: int | None = None,
    patterns: Sequence[Pattern] | None = None,
) -> list[Reason]:
    """Every reason that applies, in the order the module docstring lists the detectors."""
    text = text_reasons(title, content, compile_residue_patterns(None) if patterns is None else patterns)
    return [*text, *column_reasons(source=source, last_feedback=last_feedback, duplicate_of=duplicate_of)]


def text_reasons(title: str, content: str, patterns: Sequence[Pattern]) -> list[Reason]:
    """The reasons the text detectors find (the costly half of ``assess``; stored per entry)."""
    found = [
        incomplete_fragment(title, content),
        truncated_or_unbalanced(title, content),
        code_heavy(content),
        implementation_residue(title, content, patterns),
    ]
    return [r for r in found if r is not None]


def column_reasons(*, source: str, last_feedback: str | None, duplicate_of: int | None) -> list[Reason]:
    """The reasons read off the entry's columns (cheap: never stored)."""
    found = [exact_duplicate(duplicate_of), flagged_by_feedback(last_feedback), legacy_import(source)]
    return [r for r in found if r is not None]


# Bump when a detector changes: every stored assessment is then made again.
DETECTORS_VERSION = "2"  # 2: assessments store their points


def patterns_key(patterns: Sequence[Pattern]) -> str:
    """What a stored assessment was made with: the detectors' version and the patterns."""
    raw = [p.pattern if isinstance(p, re.Pattern) else p for p in patterns]
    return hashlib.sha256(json.dumps([DETECTORS_VERSION, raw]).encode()).hexdigest()


def score(reasons: Iterable[Reason]) -> int:
    return sum(r.points for r in reasons)


def recommend(points: int, access_count: int) -> str:
    return "archive" if points >= ARCHIVE_SCORE and access_count == 0 else "review"


# --- database services --------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    id: int
    created_at: datetime
    access_count: int
    reasons: tuple[Reason, ...]

    @property
    def score(self) -> int:
        return score(self.reasons)

    @property
    def recommendation(self) -> str:
        return recommend(self.score, self.access_count)


def _policy(workspace: Workspace) -> tuple[PolicyValues, list[Pattern]]:
    """The workspace's policy and residue patterns, read fresh (one query)."""
    row = MaintenancePolicy.objects.filter(workspace=workspace).first()
    if row is None:
        return PolicyValues(), compile_residue_patterns(None)
    return row.values(), compile_residue_patterns(row.residue_patterns)


def _not_kept(qs: QuerySet[Entry]) -> QuerySet[Entry]:
    """An operator's keep holds while the content is the one they kept."""
    return qs.exclude(review_kept_hash=F("content_hash"))


def _eligible(workspace: Workspace, policy: PolicyValues, now: datetime | None = None) -> QuerySet[Entry]:
    """Entries the preview considers: active latest entries automation may touch (the one
    protection rule: an operator hold included), not kept."""
    qs = Entry.objects.filter(workspace=workspace, is_latest=True, status=Status.ACTIVE)
    return _not_kept(
        qs.unprotected(
            now=now or timezone.now(), hold_days=policy.operator_hold_days, exclude_tags=policy.exclude_tags
        )
    )


def _oldest_live(workspace: Workspace, hashes: set[str]) -> dict[str, tuple[datetime, int]]:
    """For each hash, (created_at, id) of its oldest live latest entry (one query)."""
    oldest: dict[str, tuple[datetime, int]] = {}
    rows = Entry.objects.filter(
        status_in(LIVE_STATUSES), workspace=workspace, is_latest=True, content_hash__in=hashes
    ).values_list("content_hash", "created_at", "pk")
    for h, created, pk in rows:
        if h not in oldest or (created, pk) < oldest[h]:
            oldest[h] = (created, pk)
    return oldest


_SCAN_FIELDS = ("pk", "content_hash", "source", "last_feedback", "access_count", "created_at")


def _text_reasons_of(rows: list[dict[str, Any]], patterns: Sequence[Pattern], *, store: bool) -> None:
    """Fill ``text_reasons`` of the rows that have no valid stored assessment: read their title
    and content (one query), run the text detectors, and store the verdicts (one upsert)."""
    missing = [r for r in rows if r["stored_reasons"] is None]
    if not missing:
        for r in rows:
            r["text_reasons"] = [Reason(**d) for d in r["stored_reasons"]]
        return
    texts = {
        pk: (title, content, h)
        for pk, title, content, h in Entry.objects.filter(pk__in=[r["pk"] for r in missing]).values_list(
            "pk", "title", "content", "content_hash"
        )
    }
    key = patterns_key(patterns)
    fresh: list[HygieneAssessment] = []
    for r in rows:
        if r["stored_reasons"] is not None:
            r["text_reasons"] = [Reason(**d) for d in r["stored_reasons"]]
            continue
        title, content, h = texts.get(r["pk"], ("", "", r["content_hash"]))
        r["text_reasons"] = text_reasons(title, content, patterns)
        if r["pk"] in texts:
            fresh.append(
                HygieneAssessment(
                    entry_id=r["pk"],
                    content_hash=h,
                    title=title,
                    patterns_key=key,
                    reasons=[x.as_dict() for x in r["text_reasons"]],
                    points=score(r["text_reasons"]),
                )
            )
    if store and fresh:
        _store(fresh)
    elif fresh and (kept := _plan_verdicts.get()) is not None:
        kept.add(fresh)


def _store(assessments: list[HygieneAssessment]) -> None:
    HygieneAssessment.objects.bulk_create(
        assessments,
        update_conflicts=True,
        unique_fields=["entry"],
        update_fields=["content_hash", "title", "patterns_key", "reasons", "points"],
    )


class PlanVerdicts:
    """The text verdicts a run's plan makes. The plan cannot store them (its writes are rolled
    back, and would hold their rows' locks until then), so they are spooled to a temporary file
    — memory stays flat at any size — and stored once its transaction is over: the apply, the
    next plan and the hygiene queue then read them instead of running the detectors again
    (18 s of a plan's and 25 s of the apply's low-quality pass at 1,000,000 entries,
    bench/reports/maintenance.md). A verdict names the title, content hash and patterns it was
    made with, so one stored late for an entry changed meanwhile is simply never read."""

    def __init__(self, spool: IO[bytes]) -> None:
        self._file = spool
        self.count = 0

    @contextmanager
    def kept(self) -> Iterator[None]:
        token = _plan_verdicts.set(self)
        try:
            yield
        finally:
            _plan_verdicts.reset(token)

    def add(self, assessments: list[HygieneAssessment]) -> None:
        for a in assessments:
            row = [a.entry_id, a.content_hash, a.title, a.patterns_key, a.reasons, a.points]
            self._file.write(orjson.dumps(row) + b"\n")
        self.count += len(assessments)

    def store(self, on_batch: Callable[[], None] = lambda: None) -> int:
        """Store the kept verdicts, BATCH_SIZE to a statement (each its own transaction).
        Returns how many were stored."""
        self._file.seek(0)
        batch: list[HygieneAssessment] = []
        for line in itertools.chain(self._file, [None]):
            if line is not None:
                entry_id, content_hash, title, key, reasons, points = orjson.loads(line)
                batch.append(
                    HygieneAssessment(
                        entry_id=entry_id,
                        content_hash=content_hash,
                        title=title,
                        patterns_key=key,
                        reasons=reasons,
                        points=points,
                    )
                )
            if batch and (line is None or len(batch) >= BATCH_SIZE):
                _store(batch)
                batch = []
                on_batch()
        return self.count


@contextmanager
def plan_verdicts() -> Iterator[PlanVerdicts]:
    """A ``PlanVerdicts`` over a temporary file, removed at the end."""
    with tempfile.TemporaryFile() as spool:
        yield PlanVerdicts(spool)


_plan_verdicts: ContextVar[PlanVerdicts | None] = ContextVar("plan_verdicts", default=None)


def _stored(patterns: Sequence[Pattern]) -> QuerySet[HygieneAssessment]:
    """The valid stored assessment of the outer entry: same title, content hash and patterns."""
    return HygieneAssessment.objects.filter(
        entry=OuterRef("pk"),
        content_hash=OuterRef("content_hash"),
        title=OuterRef("title"),
        patterns_key=patterns_key(patterns),
    )


def _scan(
    workspace: Workspace,
    qs: QuerySet[Entry],
    patterns: Sequence[Pattern],
    *,
    batch_size: int = BATCH_SIZE,
    on_batch: Callable[[], None] = lambda: None,
    store: bool = True,
) -> Iterator[Candidate]:
    """Assess every entry of ``qs`` in keyset batches; yields the candidates (score ≥
    CANDIDATE_SCORE). The text detectors run only for entries without a valid stored
    assessment (``HygieneAssessment``: same title, content hash and patterns), whose verdicts
    are then stored (``store``; not by a run's plan, whose writes are rolled back anyway and
    would hold the rows' locks until then). Queries per batch: two, plus two when some entry
    needs assessing."""
    stored = _stored(patterns).values("reasons")[:1]
    last = 0
    while True:
        rows = list(
            qs.filter(pk__gt=last)
            .order_by("pk")
            .annotate(stored_reasons=Subquery(stored, output_field=JSONField()))
            .values(*_SCAN_FIELDS, "stored_reasons")[:batch_size]
        )
        if not rows:
            return
        last = rows[-1]["pk"]
        _text_reasons_of(rows, patterns, store=store)
        yield from (c for c in _candidates_of(workspace, rows) if c.score >= CANDIDATE_SCORE)
        on_batch()


def _assess_missing(
    workspace: Workspace,
    qs: QuerySet[Entry],
    patterns: Sequence[Pattern],
    *,
    until: Callable[[], bool] = lambda: False,
) -> tuple[int, bool]:
    """Assess and store the entries of ``qs`` that have no valid stored assessment (keyset
    batches, each stored at once; once every entry has one, this is one query that finds none).
    ``until`` is asked after every batch: True stops there. Returns (entries assessed, whether
    none is left)."""
    missing = qs.exclude(Exists(_stored(patterns)))
    last = assessed = 0
    while True:
        rows = [
            {**r, "stored_reasons": None}
            for r in missing.filter(pk__gt=last).order_by("pk").values(*_SCAN_FIELDS)[:BATCH_SIZE]
        ]
        if not rows:
            return assessed, True
        last = rows[-1]["pk"]
        _text_reasons_of(rows, patterns, store=True)
        assessed += len(rows)
        if until():
            return assessed, False


def assess_in_background(
    workspace: Workspace, *, until: Callable[[], bool] = lambda: False
) -> tuple[int, bool]:
    """What the worker's ``maintenance.hygiene_verdicts`` schedule does for one workspace: its
    active latest entries without a valid stored verdict — written since, through any door, or
    made with other residue patterns — are assessed and stored, a batch at a time (each batch a
    short transaction of its own). The hygiene queue and the low-quality pass then find them
    made instead of running the detectors in a request or inside a run's plan (at 1,000,000
    entries the first queue took 354 s). Returns (entries assessed, whether none is left)."""
    _, patterns = _policy(workspace)
    active = Entry.objects.filter(workspace=workspace, is_latest=True, status=Status.ACTIVE)
    return _assess_missing(workspace, active, patterns, until=until)


def _scored(workspace: Workspace, qs: QuerySet[Entry], patterns: Sequence[Pattern]) -> QuerySet[Entry]:
    """The entries of ``qs`` with their score (``hygiene_points``), computed by the database:
    the stored text points plus the column reasons (an older live copy, flagging feedback, an
    import) — the rule of ``assess`` and ``score``, read from the same POINTS (a parity test
    compares both). NULL for an entry without a valid stored assessment (``_assess_missing``
    makes them)."""
    stored = _stored(patterns)
    points = (
        Subquery(stored.values("points")[:1], output_field=IntegerField())
        + Case(When(_older_copy(workspace), then=Value(POINTS["exact_duplicate"])), default=Value(0))
        + Case(
            When(_COLUMN_RULES["flagged_by_feedback"], then=Value(POINTS["flagged_by_feedback"])),
            default=Value(0),
        )
        + Case(When(_COLUMN_RULES["legacy_import"], then=Value(POINTS["legacy_import"])), default=Value(0))
    )
    return qs.annotate(hygiene_points=points)


def _older_copy(workspace: Workspace) -> Q:
    """The outer entry has an older live latest copy (same content hash): ``exact_duplicate``."""
    return Q(
        Exists(
            Entry.objects.filter(
                status_in(LIVE_STATUSES),
                workspace=workspace,
                is_latest=True,
                content_hash=OuterRef("content_hash"),
            ).filter(
                Q(created_at__lt=OuterRef("created_at"))
                | Q(created_at=OuterRef("created_at"), pk__lt=OuterRef("pk"))
            )
        )
    )


# The column reasons read from the entry's own row (``column_reasons``), as conditions.
_COLUMN_RULES = {
    "flagged_by_feedback": Q(last_feedback__in=FEEDBACK_FLAGS),
    "legacy_import": Q(source=Source.IMPORT),
}


def _with_reason(workspace: Workspace, code: str) -> Q:
    """The queue's rows that have reason ``code``: a column reason as its condition, a text
    reason found in the stored verdict's reasons (JSON text; a code is a bare identifier, so
    ``"code": "<code>"`` appears in the text only as that key and value)."""
    if code == "exact_duplicate":
        return _older_copy(workspace)
    if code in _COLUMN_RULES:
        return _COLUMN_RULES[code]
    return Q(stored_text__contains=f'"code": "{code}"')


def _candidates_of(workspace: Workspace, rows: list[dict[str, Any]]) -> list[Candidate]:
    """Each row as a Candidate (their order kept): its ``text_reasons`` and the column reasons,
    the duplicate's older id found for these rows alone (one query). The caller filters."""
    oldest = _oldest_live(workspace, {r["content_hash"] for r in rows})
    found = []
    for r in rows:
        first = oldest.get(r["content_hash"])
        older = first[1] if first and first < (r["created_at"], r["pk"]) else None
        reasons = [
            *r["text_reasons"],
            *column_reasons(source=r["source"], last_feedback=r["last_feedback"], duplicate_of=older),
        ]
        found.append(Candidate(r["pk"], r["created_at"], r["access_count"], tuple(reasons)))
    return found


class _Queue(NamedTuple):
    assessed: QuerySet[Entry]  # the candidates already assessed, unordered
    ranked: QuerySet[Entry]  # the candidates, best first, after the entries still to assess
    rows: QuerySet[Entry]  # the same with their stored text reasons (``stored_reasons``)
    assess: Callable[[], object]  # assesses those (their points are NULL until then)


def _queue(workspace: Workspace) -> _Queue:
    """The hygiene queue as one statement: candidates best first (score desc, created_at, id),
    preceded by the eligible entries without a valid stored assessment (NULL points, NULLS
    FIRST). In the steady state there are none and one pass over the entries answers; when
    there are, the caller assesses them and asks again."""
    policy, patterns = _policy(workspace)
    eligible = _eligible(workspace, policy)
    scored = _scored(workspace, eligible, patterns)
    ranked = scored.filter(Q(hygiene_points__gte=CANDIDATE_SCORE) | Q(hygiene_points__isnull=True)).order_by(
        F("hygiene_points").desc(nulls_first=True), "created_at", "pk"
    )
    reasons = Subquery(_stored(patterns).values("reasons")[:1], output_field=JSONField())
    return _Queue(
        # The score once per row (NULL fails the comparison): ``ranked`` restricted to the
        # assessed rows repeats the expression three times in the statement.
        scored.filter(Q(hygiene_points__gte=CANDIDATE_SCORE)).order_by(),
        ranked,
        ranked.annotate(stored_reasons=reasons),
        lambda: _assess_missing(workspace, eligible, patterns),
    )


_ROW = (*_SCAN_FIELDS, "stored_reasons", "hygiene_points")


def _listed(workspace: Workspace, rows: list[dict[str, Any]]) -> list[Candidate]:
    """Candidates of rows of the queue (scored, so their stored reasons are there), in order,
    BATCH_SIZE rows to a query for the duplicates' older ids."""
    found: list[Candidate] = []
    for start in range(0, len(rows), BATCH_SIZE):
        chunk = rows[start : start + BATCH_SIZE]
        for r in chunk:
            r["text_reasons"] = [Reason(**d) for d in r["stored_reasons"]]
        found += _candidates_of(workspace, chunk)
    return found


def candidates(workspace: Workspace) -> list[Candidate]:
    """Every hygiene candidate of the workspace, best first: score desc, created_at, id."""
    queue = _queue(workspace)
    rows = queue.rows.values(*_ROW).iterator(chunk_size=BATCH_SIZE)
    first = next(rows, None)
    if first is not None and first["hygiene_points"] is None:  # entries to assess come first
        queue.assess()
        rows = queue.rows.values(*_ROW).iterator(chunk_size=BATCH_SIZE)
        first = next(rows, None)
    # A NULL left now is an entry changed while it was assessed: listed next time.
    ahead = [first] if first is not None else []
    return _listed(workspace, [r for r in itertools.chain(ahead, rows) if r["hygiene_points"] is not None])


def count(workspace: Workspace, *, cap: int | None = None) -> int:
    """How many hygiene candidates the workspace has (the review tab's count): one statement
    in the steady state. With ``cap``, more than ``cap`` candidates already assessed answer
    ``cap + 1`` as soon as the database has found that many (``memory.capped``); fewer are
    counted exactly, entries still to assess included."""
    queue = _queue(workspace)
    if cap is not None:
        assessed = capped_count(queue.assessed, cap=cap)
        if assessed > cap:
            return assessed
    got: dict[str, int] = {}
    for _ in range(2):
        got = queue.ranked.aggregate(rows=Count("pk"), listed=Count("hygiene_points"))
        if got["rows"] == got["listed"]:
            break
        queue.assess()
    return got["listed"]


def _ranked_page(
    workspace: Workspace,
    policy: PolicyValues,
    patterns: Sequence[Pattern],
    *,
    start: int,
    end: int,
    recommendation: str | None,
    reason: str | None,
) -> tuple[list[tuple[int, int | None]], int, int]:
    """One statement: the eligible entries' points computed once each, in a subquery the
    planner may not flatten (``OFFSET 0``), then filtered, counted (window) and ranked outside
    it. Written as one ORM query, the points expression — two subqueries per row — was
    repeated by the filter (twice: ``>= 2``, ``IS NULL``), the ordering and the select list:
    2.3 evaluations per eligible entry at 1,000,000 entries. Returns the page's (id, points)
    in order, the rows matching (entries still to assess included) and how many of them are
    assessed."""
    inner = _scored(workspace, _eligible(workspace, policy), patterns)
    # Named by annotations: the outer statement reads them by these names.
    inner = inner.annotate(q_id=F("pk"), q_created=F("created_at"), q_access=F("access_count"))
    fields = ["q_id", "q_created", "q_access", "hygiene_points"]
    if reason:
        if reason not in _COLUMN_RULES and reason != "exact_duplicate":
            reasons = Subquery(_stored(patterns).values("reasons")[:1], output_field=JSONField())
            inner = inner.annotate(stored_text=Cast(reasons, TextField()))
        inner = inner.annotate(
            reason_hit=Case(When(_with_reason(workspace, reason), then=Value(1)), default=Value(0))
        )
        fields.append("reason_hit")
    sql, params = inner.order_by().values(*fields).query.sql_with_params()
    wanted = [f"q.hygiene_points >= {CANDIDATE_SCORE}"]
    if reason:
        wanted.append("q.reason_hit = 1")
    archive = f"(q.hygiene_points >= {ARCHIVE_SCORE} AND q.q_access = 0)"
    if recommendation == "archive":
        wanted.append(archive)
    elif recommendation == "review":
        wanted.append(f"NOT {archive}")
    # A row to assess (NULL points) stays in whatever the filters: it makes the counts tell.
    where = f"({' AND '.join(wanted)}) OR q.hygiene_points IS NULL"
    fence = " LIMIT -1 OFFSET 0" if connection.vendor == "sqlite" else " OFFSET 0"
    statement = (
        "SELECT q.q_id, q.hygiene_points, COUNT(*) OVER (), COUNT(q.hygiene_points) OVER ()"
        f" FROM ({sql}{fence}) q WHERE {where}"
        " ORDER BY q.hygiene_points DESC NULLS FIRST, q.q_created, q.q_id LIMIT %s OFFSET %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, [*params, max(end - start, 0), start])
        found = cursor.fetchall()
    if not found:
        return [], 0, 0
    return [(r[0], r[1]) for r in found], int(found[0][2]), int(found[0][3])


def _page_rows(ranked: list[tuple[int, int | None]], patterns: Sequence[Pattern]) -> list[dict[str, Any]]:
    """The rows ``_listed`` reads, for the page's ids in their order, with their stored text
    reasons (two small queries); an entry changed since it was ranked is left out."""
    ids = [pk for pk, points in ranked if points is not None]
    rows = {r["pk"]: r for r in Entry.objects.filter(pk__in=ids).values(*_SCAN_FIELDS, "title")}
    stored = {
        a.pk: a
        for a in HygieneAssessment.objects.filter(pk__in=ids, patterns_key=patterns_key(patterns)).only(
            "content_hash", "title", "reasons"
        )
    }
    out = []
    for pk in ids:
        row, made = rows.get(pk), stored.get(pk)
        if (
            row is None
            or made is None
            or (made.content_hash, made.title) != (row["content_hash"], row["title"])
        ):
            continue
        out.append({**row, "stored_reasons": made.reasons})
    return out


def page(
    workspace: Workspace,
    *,
    limit: int,
    offset: int = 0,
    recommendation: str | None = None,
    reason: str | None = None,
) -> tuple[int, list[Candidate]]:
    """How many candidates match the filters (``recommendation`` archive/review, a
    ``reason`` code), and the page ``offset``..``offset + limit`` of them, best first: the
    database filters, counts and ranks them in one statement (``_ranked_page``), and only the
    page's rows come back. Entries still to assess are assessed first (then the statement runs
    again)."""
    start, end = max(offset, 0), max(offset, 0) + max(limit, 0)
    policy, patterns = _policy(workspace)
    ask = functools.partial(
        _ranked_page, workspace, policy, patterns, start=start, recommendation=recommendation, reason=reason
    )
    for attempt in range(2):
        ranked, matching, listed = ask(end=end)
        if not ranked:  # a page past the last candidate (or an empty one): counts from the first
            _, matching, listed = ask(start=0, end=1)
        if matching == listed or attempt:
            break
        # Entries to assess come first (NULL points): count() assesses them, then read again.
        count(workspace)
    return listed, _listed(workspace, _page_rows(ranked, patterns))


def preview(workspace: Workspace, *, limit: int = 50, offset: int = 0) -> dict[str, Any]:
    """The hygiene queue: ``count`` candidates in all, and one page of them (``page``)."""
    total, page_ = page(workspace, limit=limit, offset=offset)
    rows = {
        r["pk"]: r
        for r in Entry.objects.filter(pk__in=[c.id for c in page_]).values(
            "pk", "title", "content", "entry_type", "source"
        )
    }
    return {
        "count": total,
        "candidates": [
            {
                "id": c.id,
                "title": rows[c.id]["title"],
                "content_excerpt": rows[c.id]["content"][:EXCERPT_CHARS],
                "entry_type": rows[c.id]["entry_type"],
                "source": rows[c.id]["source"],
                "created_at": c.created_at,
                "access_count": c.access_count,
                "score": c.score,
                "reasons": [r.as_dict() for r in c.reasons],
                "recommendation": c.recommendation,
            }
            for c in page_
            if c.id in rows
        ],
    }


def _requested(ids: Iterable[Any]) -> tuple[list[int], list[Any]]:
    """The requested ids as integers, deduplicated in order, and the values that are not ids."""
    good: dict[int, None] = {}
    bad: list[Any] = []
    for value in ids:
        if isinstance(value, int) and not isinstance(value, bool):
            good.setdefault(value, None)
        elif isinstance(value, str) and value.strip().isdigit():
            good.setdefault(int(value), None)
        else:
            bad.append(value)
    return list(good), bad


def _details(c: Candidate) -> dict[str, Any]:
    return {"score": c.score, "reasons": [r.as_dict() for r in c.reasons]}


def apply(
    workspace: Workspace, ids: Iterable[Any], *, actor: str, now: datetime | None = None
) -> dict[str, list[Any]]:
    """Archive the requested entries that are in a fresh preview (still eligible, score ≥ 2).
    Anything else — unknown ids, other workspaces' ids, no longer eligible — is skipped. One
    transaction: the one status change (``memory.lifecycle``) with each entry's event (reason
    ``hygiene``) carrying its score and reasons."""
    now = now or timezone.now()
    requested, invalid = _requested(ids)
    fresh = {c.id: c for c in candidates(workspace)}
    wanted = [n for n in requested if n in fresh]
    archived: list[int] = []
    if wanted:
        policy, _ = _policy(workspace)
        with transaction.atomic():
            rows = list(
                _eligible(workspace, policy)
                .filter(pk__in=wanted)
                .select_for_update(of=("self",))
                .values_list("pk", flat=True)
            )
            archived = sorted(rows)
            lifecycle.change_status(
                workspace.pk,
                archived,
                Status.ARCHIVED,
                reason="hygiene",
                actor=actor,
                now=now,
                details_of={pk: _details(fresh[pk]) for pk in archived},
            )
        if archived:
            refresh_scores(workspace, now=now, ids=[*archived, *neighbour_ids(archived)])
    done = set(archived)
    return {"archived": archived, "skipped": [i for i in requested if i not in done] + invalid}


def keep(
    workspace: Workspace, ids: Iterable[Any], *, actor: str, now: datetime | None = None
) -> dict[str, list[Any]]:
    """An operator's "keep": the entries leave the queue until their content changes (a new
    version has a new hash), and get an operator hold: no pass archives them."""
    now = now or timezone.now()
    requested, invalid = _requested(ids)
    qs = Entry.objects.filter(workspace=workspace, is_latest=True, pk__in=requested)
    with transaction.atomic():
        kept = sorted(qs.select_for_update().values_list("pk", flat=True))
        Entry.objects.filter(pk__in=kept).update(review_kept_hash=F("content_hash"))
        holds.hold(workspace, kept, reason=HoldReason.KEEP, actor=actor, now=now)
    done = set(kept)
    return {"kept": kept, "skipped": [i for i in requested if i not in done] + invalid}


def _low_quality_picks(ctx: RunContext, qs: QuerySet[Entry]) -> dict[int, Candidate]:
    """The entries of ``qs`` hygiene recommends archiving. Their ids are read first (one
    statement), then scanned by id: inside a plan the status rule excludes the entries the
    plan moved (``maintenance.plan_status``), an anti-join PostgreSQL would otherwise hash
    again for every batch (0.25 s a batch at 1,000,000 entries)."""
    _, patterns = _policy(ctx.workspace)
    ids = list(qs.order_by("pk").values_list("pk", flat=True))
    step = ctx.batch_size * 2
    picks: dict[int, Candidate] = {}
    for start in range(0, len(ids), step):
        chunk = Entry.objects.filter(pk__any_of=ids[start : start + step])
        for c in _scan(
            ctx.workspace, chunk, patterns, batch_size=step, on_batch=ctx.heartbeat, store=not ctx.planning
        ):
            if c.recommendation == "archive":
                picks[c.id] = c
    return picks


def low_quality_base(ctx: RunContext) -> QuerySet[Entry]:
    cutoff = ctx.now - timedelta(days=ctx.policy.low_quality_min_age_days)
    return _not_kept(latest(ctx).filter(status_in([Status.ACTIVE]), access_count=0, created_at__lt=cutoff))


def archive_low_quality(ctx: RunContext, *, only: Iterable[int] | None = None) -> PassResult:
    """Pass 6: entries hygiene recommends archiving (score ≥ 4, never accessed), not kept,
    unprotected, created more than low_quality_min_age_days before the run's ``now``, are
    archived (reason ``low_quality``; each event's details carry the score and reasons).
    ``only``: approving proposals — the same rule, re-checked for those ids alone."""
    base = low_quality_base(ctx)
    if only is not None:
        base = base.filter(pk__in=list(only))
    # Held entries are scanned too, so that only those hygiene really wanted count as skipped.
    picked = _low_quality_picks(ctx, base.exclude(_protected_but_holds(ctx)))
    result = PassResult()
    ids = sorted(picked)
    for start in range(0, len(ids), ctx.batch_size):
        chunk = ids[start : start + ctx.batch_size]
        done = transition(
            ctx,
            unprotected(latest(ctx).filter(status_in([Status.ACTIVE]), pk__in=chunk), ctx),
            to_status=Status.ARCHIVED,
            reason="low_quality",
            details_of={i: _details(picked[i]) for i in chunk},
        )
        result.ids += done.ids
    result.values = {i: _details(picked[i]) for i in result.ids}
    result.count = len(result.ids)
    return result


def _protected_but_holds(ctx: RunContext) -> Any:
    return protected(
        now=ctx.now,
        hold_days=ctx.policy.operator_hold_days,
        exclude_tags=ctx.policy.exclude_tags,
        holds=False,
    )
