"""Template filters of the console pages (``{% load steward %}``)."""

from __future__ import annotations

import re
from typing import Any

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from console import selectors, selectors_maintenance
from memory import capped as capping

register = template.Library()


@register.filter
def run_counts(run: Any) -> Any:
    """A run's non-zero counts split into changes and metrics
    (``console.selectors_maintenance.run_counts``)."""
    return selectors_maintenance.run_counts(run)


@register.filter
def first_line(text: Any) -> str:
    """The first non-empty line of ``text`` (an entry without a title is named by it)."""
    return selectors.first_line(text)


@register.filter
def entry_label(title: Any, text: Any = "") -> str:
    """What names an entry in a list or a heading (``console.selectors.entry_label``):
    its title, else the first non-empty line of its content."""
    return selectors.entry_label(title, text)


@register.filter
def excerpt_after_label(text: Any, title: Any = "") -> str:
    """The excerpt a list shows under an entry's label: all of it when the entry has a title;
    without one, what follows the first line (which is already the label), so the line is not
    shown twice."""
    text = str(text or "")
    if str(title or "").strip():
        return text
    lines = text.lstrip().splitlines()
    return "\n".join(lines[1:]).strip()


@register.filter
def breakable(text: Any) -> SafeString:
    """``text`` escaped, with a line-break opportunity (``<wbr>``) after each underscore, slash
    and colon: an identifier such as ``development_note``, a path such as ``src/app/views.py``
    or an actor such as ``key:msk_AbC123`` wraps there in a narrow column instead of widening
    it or splitting one of its words (a browser breaks a line after a hyphen, not after an
    underscore, a slash or a colon)."""
    return mark_safe(re.sub(r"([_/:])", r"\1<wbr>", escape(str(text))))  # safe: escaped just before


@register.filter
def capped(n: Any) -> str:
    """A capped count (``memory.capped``): "1,000+" past the cap, else the number."""
    return capping.label(n)


@register.simple_tag
def count_cap() -> int:
    """``memory.capped.CAP``: a capped count past it reads ``CAP + 1``."""
    return capping.CAP
