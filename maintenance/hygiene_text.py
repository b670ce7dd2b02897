"""Hygiene's text detectors: explainable junk detection over plain strings, no ORM.

Each detector returns a ``Reason`` (code, points, a readable detail) or None; an entry's score
is the sum of its reasons' points (``POINTS``), listed from ``CANDIDATE_SCORE``, ``archive``
recommended from ``ARCHIVE_SCORE`` for an entry never read. Text is NFC-normalised; words come
from ``maintenance.text``. What each detector finds: docs/quality.md (the detectors, exactly).
A stored pattern that does not compile is skipped, never a crash.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from maintenance.text import content_words, normalise
from memory.models.choices import Source
from memory.policy import SOURCE_PATH

MIN_CONTENT_WORDS = 9
# Points of each reason: the detectors below and the SQL score of ``hygiene.scored_entries`` read them here.
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
