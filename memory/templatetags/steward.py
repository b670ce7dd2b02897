"""Template filters of the console pages (``{% load steward %}``)."""

from __future__ import annotations

from typing import Any

from django import template

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
