"""The user's search text, parsed once and rendered for each backend.

Query syntax is web-search style, the same on both: words are ANDed, ``"quoted words"`` are a
phrase, ``-word`` excludes, ``or`` between words is OR (AND binds tighter, as in
PostgreSQL's ``websearch_to_tsquery``). The user's text is parsed here once and rendered for
each backend from that parse, with every term quoted, so nothing a user types can reach the
database as query syntax: no input raises. English stop words are ignored and words are
stemmed ("caching" finds "cache") on both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# PostgreSQL's english stop word list (tsearch_data/english.stop), applied on SQLite too so
# that a query of only such words finds nothing on both backends instead of everything on one.
_ENGLISH_STOP = """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself
    she her hers herself it its itself they them their theirs themselves what which who whom
    this that these those am is are was were be been being have has had having do does did
    doing a an the and but if or because as until while of at by for with about against
    between into through during before after above below to from up down in out on off over
    under again further then once here there when where why how all any both each few more
    most other some such no nor not only own same so than too very s t can will just don
    should now
"""
STOP_WORDS = frozenset(_ENGLISH_STOP.split())

# A quoted phrase (an unbalanced quote runs to the end), or a bare word; either may carry
# leading dashes, which exclude it.
_LEXEME = re.compile(r'(-*)"([^"]*)"?|([^\s"]+)')
# Words as both tokenizers see them: letters and digits; everything else separates.
_WORD = re.compile(r"[^\W_]+")
_UNSAFE = re.compile(r"[\x00\ud800-\udfff]")  # NUL and lone surrogates: no driver takes them


@dataclass(frozen=True)
class Term:
    text: str  # as the user wrote it, without quotes or the excluding dash
    words: tuple[str, ...]  # lower-cased, separators dropped
    negated: bool

    @property
    def meaningful(self) -> bool:
        return any(w not in STOP_WORDS for w in self.words)

    def websearch(self) -> str:
        # Inside quotes websearch_to_tsquery treats everything as words of one phrase, and the
        # text has no quote of its own (the lexer ends a word at one). The user's own text
        # rather than ``words`` so PostgreSQL's parser still sees paths, versions, hyphens.
        return f'{"-" if self.negated else ""}"{self.text}"'

    def fts5(self) -> str:
        # Stop words at the edges of a phrase are dropped, as PostgreSQL drops them.
        words = list(self.words)
        while words and words[0] in STOP_WORDS:
            words.pop(0)
        while words and words[-1] in STOP_WORDS:
            words.pop()
        # Only letters, digits and spaces between the quotes: always a valid FTS5 string.
        return '"' + " ".join(words) + '"'


@dataclass(frozen=True)
class ParsedQuery:
    """An OR of AND-groups; each group has at least one term to find and any to exclude.

    A group with only exclusions is dropped: it would match every entry that lacks the word,
    and FTS5 cannot express it. No group left means nothing to search for.
    """

    groups: tuple[tuple[Term, ...], ...]

    def websearch(self) -> str:
        return " or ".join(" ".join(t.websearch() for t in group) for group in self.groups)

    def fts5(self) -> str:
        parts = []
        for group in self.groups:
            found = " AND ".join(t.fts5() for t in group if not t.negated)
            excluded = "".join(f" NOT {t.fts5()}" for t in group if t.negated)
            parts.append(f"(({found}){excluded})")
        return " OR ".join(parts)


def parse_query(q: str) -> ParsedQuery:
    """Parse web-search syntax; never raises (validation of length is the caller's)."""
    q = _UNSAFE.sub(" ", q)
    groups: list[list[Term]] = [[]]
    for match in _LEXEME.finditer(q):
        dashes, phrase, word = match.groups()
        if word is not None:
            if word.lower() == "or":
                if groups[-1]:
                    groups.append([])
                continue
            stripped = word.lstrip("-")
            negated, text = stripped != word, stripped
        else:
            negated, text = bool(dashes), phrase
        term = Term(text=text, words=tuple(_WORD.findall(text.lower())), negated=negated)
        if term.meaningful:
            groups[-1].append(term)
    kept = tuple(tuple(group) for group in groups if any(not t.negated for t in group))
    return ParsedQuery(groups=kept)
