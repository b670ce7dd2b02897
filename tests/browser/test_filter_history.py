"""In a real browser, a filter is one step of the browser's history however it is applied.

The entries filter applies itself as soon as one of its menus changes (data-refresh-on-select,
static/js/console.js): htmx asks for the filtered list and pushes its address. Pressing Filter
then asked for the same address and pushed it again: two steps for one choice, and the first
Back stayed on the filtered list. An address equal to the one shown now replaces it."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("playwright", reason="the playwright package is missing: pip install -e '.[dev]'")

from playwright.sync_api import expect

# Counts the addresses htmx pushes or replaces from now on (window.__historyUpdates).
COUNT_HISTORY_UPDATES = """() => {
  window.__historyUpdates = 0;
  for (const name of ["htmx:pushedIntoHistory", "htmx:replacedInHistory"]) {
    document.body.addEventListener(name, () => { window.__historyUpdates += 1; });
  }
}"""


def _history_updates(page, n: int) -> None:
    page.wait_for_function(f"() => window.__historyUpdates === {n}")


def _back(page) -> None:
    """Back, and the page it loads: htmx keeps no snapshot of a page (base.html), it reloads
    the address Back returns to."""
    with page.expect_event("load"):
        page.go_back()


def test_choosing_a_menu_value_then_pressing_filter_is_one_step_back(page, server):
    page.goto("/console/layout/entries/")
    unfiltered = page.url
    summary = page.locator("#entry-list p.summary")
    expect(summary).not_to_have_text("0 entries")
    listed = summary.inner_text()
    steps = page.evaluate("() => history.length")
    page.evaluate(COUNT_HISTORY_UPDATES)
    filters = page.locator("form.filters")

    filters.locator("select[name=status]").select_option("archived")  # applies itself
    _history_updates(page, 1)
    expect(page).to_have_url(re.compile(r"\?status=archived\b"))
    filters.get_by_role("button", name="Filter").click()  # the same filter again
    _history_updates(page, 2)

    expect(page).to_have_url(re.compile(r"\?status=archived\b"))
    expect(summary).not_to_have_text(listed)
    assert page.evaluate("() => history.length") == steps + 1, "two steps of history for one filter"
    _back(page)
    expect(page).to_have_url(unfiltered)
    expect(page.locator("#entry-list p.summary")).to_have_text(listed)


def test_a_new_filter_is_still_a_step_of_its_own(page, server):
    """Replacing applies to the same address only: a different filter is pushed, and Back
    returns to the one before it."""
    page.goto("/console/layout/entries/?status=archived")
    steps = page.evaluate("() => history.length")
    page.evaluate(COUNT_HISTORY_UPDATES)
    filters = page.locator("form.filters")

    filters.locator("select[name=status]").select_option("active")
    _history_updates(page, 1)

    expect(page).to_have_url(re.compile(r"\?status=active\b"))
    assert page.evaluate("() => history.length") == steps + 1
    _back(page)
    expect(page).to_have_url(re.compile(r"\?status=archived\b"))
