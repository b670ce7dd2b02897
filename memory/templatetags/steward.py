"""Template filters of the console pages (``{% load steward %}``)."""

from __future__ import annotations

from typing import Any

from django import template

from memory import capped as capping

register = template.Library()


@register.filter
def run_counts(run: Any) -> Any:
    """A run's non-zero counts split into changes and metrics
    (``maintenance.console_selectors.run_counts``)."""
    from maintenance.console_selectors import run_counts as split

    return split(run)


@register.filter
def first_line(text: Any) -> str:
    """The first non-empty line of ``text`` (an entry without a title is named by it)."""
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


@register.filter
def capped(n: Any) -> str:
    """A capped count (``memory.capped``): "1,000+" past the cap, else the number."""
    return capping.label(n)


@register.simple_tag
def count_cap() -> int:
    """``memory.capped.CAP``: a capped count past it reads ``CAP + 1``."""
    return capping.CAP
