"""Template filters of the console pages (``{% load steward %}``)."""

from __future__ import annotations

import re
from typing import Any

from django import template
from django.urls import reverse
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from console import labels, selectors, selectors_maintenance
from memory import capped as capping

register = template.Library()


@register.filter
def run_counts(run: Any) -> Any:
    """A run's non-zero counts split into changes and metrics
    (``console.selectors_maintenance.run_counts``)."""
    return selectors_maintenance.run_counts(run)


@register.filter
def count_label(key: Any) -> str:
    """A run's count key in words (``console.labels``): "marked stale" for ``stale_marked``."""
    return labels.count_label(str(key))


@register.filter
def reason_label(code: Any) -> str:
    """A hygiene reason code in words (``console.labels``)."""
    return labels.reason_label(str(code))


@register.simple_tag
def reason_detail(reason: Any, slug: str) -> SafeString:
    """A hygiene reason's detail, breakable; the older entry an exact duplicate copies is a
    link to that entry's page."""
    fields = reason if isinstance(reason, dict) else vars(reason)
    detail = str(fields.get("detail") or "")
    match = DUPLICATE_OF.fullmatch(detail)
    if fields.get("code") != "exact_duplicate" or match is None:
        return breakable(detail)
    older = match.group(2)
    return format_html(
        '{}<a href="{}">entry {}</a>',
        match.group(1),
        reverse("console:entry", args=[slug, int(older)]),
        older,
    )


DUPLICATE_OF = re.compile(r"(same content as older )entry (\d+)")


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
