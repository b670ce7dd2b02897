"""Unicode-aware words for the quality passes (hygiene, contradictions).

Pure functions over plain strings: no ORM, no settings.

A *word* is a run of letters (any script; digits and underscores split words, combining marks
stay with their letter). Scripts written without spaces between words — Han, Hiragana,
Katakana, Hangul, and Thai, Lao, Khmer, Myanmar — have no reliable word boundaries without a
dictionary, so each of their characters counts as one word. That errs on the side of keeping
text: a short CJK sentence is never judged "too few words" for its length in characters (a
peer's bug archived CJK memories for that).

A *content word* is a word of three or more letters that is not a stop word (the function
words of English, Portuguese, Spanish, French and German); every CJK-like character is a
content word.
"""

from __future__ import annotations

import re
import unicodedata

# Characters of scripts without spaces between words: each one is a word of its own.
_UNSPACED = (
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi
    "\u3005\u3007\u3021-\u3029\u3038-\u303b"  # CJK ideographic marks
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u312f\u31a0-\u31bf"  # Bopomofo
    "\u3130-\u318f"  # Hangul compatibility jamo
    "\u31f0-\u31ff"  # Katakana extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\ua960-\ua97f\uac00-\ud7ff"  # Hangul
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff66-\uff9f"  # half-width Katakana
    "\U00020000-\U0003134f"  # CJK extensions B–G
)
UNSPACED_CHAR = re.compile(f"[{_UNSPACED}]")
# A letter run: word characters that are neither digits nor underscores, nor unspaced-script
# characters (those are single-character words). Marks (accents) are kept with the letters.
_WORD = re.compile(f"[{_UNSPACED}]|(?:(?![{_UNSPACED}])[^\\W\\d_]|[\u0300-\u036f])+")

MIN_LETTERS = 3

STOP_WORDS = frozenset(
    """
    the and for with that this these those from into onto upon over under about above below
    are was were been being have has had having does did doing done not but nor yet than then
    there their they them theirs its it's his her hers him she you your yours our ours ourselves
    who whom whose which what when where why how all any both each few more most other some such
    only own same too very can will just should would could might must may shall also here out off
    again further once because until while during before after between through against
    itself himself herself themselves myself yourself yourselves let get got via per etc
    com los las del una uno unos unas por para con sin sobre entre como pero mas más muy sus
    que qué cual cuál esto esta este estos estas eso esa ese esos esas son fue ser hay
    das dos das nas nos num numa pelo pela pelos pelas com sem sobre entre como mas mais muito
    seu sua seus suas isso isto essa esse essas esses são foi ser uma umas uns não
    les des une est pas par pour avec sans sur dans entre comme mais plus très son ses leur
    leurs cette ces qui quoi dont elle ils elles nous vous été être sont aux
    der die das den dem des ein eine einer eines einem einen und oder aber mit ohne für von
    bei aus auf über unter nach vor zum zur ist sind war wird werden wurde nicht auch noch
    sich sie ihr ihre wir uns dass wie was wer wenn dann als
    """.split()  # noqa: SIM905 - a word list reads better as text
)


def normalise(text: str) -> str:
    """NFC, so an accented letter written as letter + combining mark is one letter."""
    return unicodedata.normalize("NFC", text)


def words(text: str) -> list[str]:
    """Every word of ``text``, lower-cased, in order (unspaced-script characters singly)."""
    return [w.casefold() for w in _WORD.findall(normalise(text))]


def is_content_word(word: str) -> bool:
    if UNSPACED_CHAR.fullmatch(word):
        return True
    letters = sum(1 for ch in word if not unicodedata.combining(ch))
    return letters >= MIN_LETTERS and word not in STOP_WORDS


def content_words(text: str) -> list[str]:
    """The content words of ``text``, lower-cased, in order."""
    return [w for w in words(text) if is_content_word(w)]
