"""In a real browser, at a desktop (1,366 px), a small laptop (1,024 px) and a phone (390 px)
width, on every console page that has a table:

- no page scrolls sideways as a whole;
- every table fits its card: at the two desktop widths as a table, without a scrollbar of its
  own (the entries and runs tables once scrolled inside their card at 1,366 px, their last
  column cut off until scrolled); at the phone width as one card per row, each cell beside its
  column's name (most tables once showed their first columns only, the rest sideways);
- no short word is split across two lines (the entry page once broke a commit hash, a date and
  a file path mid-word: a long token breaks where it must, a short one nowhere);
- the dashboard's chart labels are at least 10 px tall (5 to 7 px on a phone once: the chart
  was drawn 560 wide and scaled down with its text).

The pages are those of the "layout" workspace (tests/browser/seed.py), whose tables hold values
as long as real ones. Each width's pages are visited once (``measured``); every page is saved
as var/screenshots/layout-<page>-<width>.png. The header keeps to its rows at 1,024 px."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("playwright", reason="the playwright package is missing: pip install -e '.[dev]'")

from tests.browser.conftest import flush_reports, new_context, shot

WIDTHS = (1366, 1024, 390)
SMALLEST_LABEL_PX = 10


def console_pages(server) -> dict[str, str]:
    """Every console page that has a table (and the disputes tab, which has cards)."""
    ws = "/console/layout"
    return {
        "workspaces": "/console/",
        "dashboard": f"{ws}/",
        "review-pending": f"{ws}/review/?tab=pending",
        "review-hygiene": f"{ws}/review/?tab=hygiene",
        "review-automatic": f"{ws}/review/?tab=automatic",
        "review-tombstones": f"{ws}/review/?tab=tombstones",
        "review-disputes": f"{ws}/review/?tab=disputes",
        "runs": f"{ws}/runs/",
        "run": f"{ws}/runs/{server.seed['layout_run']}/",
        # Its Changes table has a "proposed" badge beside each proposing pass's count.
        "proposed run": f"{ws}/runs/{server.seed['layout_proposed_run']}/",
        "entries": f"{ws}/entries/",
        "entry": f"{ws}/entries/{server.seed['layout_entry']}/",
        "settings": f"{ws}/settings/",
    }


def _overflow(page) -> int:
    return page.evaluate("() => document.documentElement.scrollWidth")


# Tables wider than the box they are shown in: the nearest box that scrolls sideways (a
# .table-scroll), else their card. A table fits when neither it nor what overflows it (its
# scrollWidth) is wider than that box's content: a table that scrolls inside its box fails too.
TABLES_WIDER_THAN_THEIR_BOX = """() => {
  const wider = [];
  for (const table of document.querySelectorAll("main table")) {
    if (!table.getClientRects().length) continue;  // not shown (e.g. an empty hidden body)
    let box = table.parentElement;
    while (box && !box.matches(".panel, .dispute, main")) {
      const overflow = getComputedStyle(box).overflowX;
      if (overflow === "auto" || overflow === "scroll") break;
      box = box.parentElement;
    }
    const style = getComputedStyle(box);
    const room = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const width = Math.max(table.scrollWidth, table.getBoundingClientRect().width);
    if (width > room + 1) {
      const where = table.id || table.closest("[id]")?.id || table.className;
      wider.push(`${where}: ${Math.round(width)} px in ${Math.round(room)}`);
    }
  }
  return wider;
}"""

# Short words of the page shown on two lines: a word, number, identifier or path segment of at
# most 16 characters (letters, digits, _ . : /), or a date. A hyphenated word may break at its
# hyphen (a date may not); a longer token may break where it must. Each text node's words
# apart: a <wbr> (after the slashes of a path, the underscores of an identifier) ends one.
SPLIT_WORDS = """() => {
  const short = /^(?:[\\p{L}\\p{N}_.:\\/]{1,16}|\\d{4}-\\d\\d-\\d\\d)$/u;
  const split = [];
  const range = document.createRange();
  const walker = document.createTreeWalker(document.querySelector("main"), NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.parentElement.getClientRects().length) continue;  // not shown
    for (const match of node.data.matchAll(/\\S+/g)) {
      if (!short.test(match[0])) continue;
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      const lines = new Set(Array.from(range.getClientRects(), (rect) => Math.round(rect.bottom)));
      if (lines.size > 1) split.push(match[0]);
    }
  }
  return split;
}"""

# The size in CSS pixels of each chart text shown: its font size times the chart's scale (the
# length of a unit vector through its matrix: the y axis label is turned a quarter).
CHART_LABELS = """() => Array.from(document.querySelectorAll("main svg.chart text"))
  .filter((text) => text.getClientRects().length)
  .map((text) => {
    const m = text.getScreenCTM();
    return parseFloat(getComputedStyle(text).fontSize) * Math.hypot(m.a, m.b);
  })"""

# Pairs of chart texts drawn over each other (a tick label into the axis label beside it).
CHART_OVERLAPS = """() => {
  const overlaps = [];
  for (const svg of document.querySelectorAll("main svg.chart")) {
    const texts = Array.from(svg.querySelectorAll("text")).filter((t) => t.getClientRects().length);
    const boxes = texts.map((t) => t.getBoundingClientRect());
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) {
        const a = boxes[i], b = boxes[j];
        const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
        const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
        if (w > 0.5 && h > 0.5) overlaps.push(`${svg.id}: ${texts[i].textContent} / ${texts[j].textContent}`);
      }
    }
  }
  return overlaps;
}"""


@dataclass
class Measured:
    """What one console page showed at one width."""

    scroll_width: int
    wider_tables: list[str]
    split_words: list[str]
    chart_labels: list[float]
    chart_overlaps: list[str]


_measured: dict[int, dict[str, Measured]] = {}  # width → page → what it showed (this worker's server)


@pytest.fixture
def measured(logged_in, server):
    """``measured(width)``: every console page at that width, visited once in the session."""

    def at(width: int) -> dict[str, Measured]:
        if width not in _measured:
            page = logged_in.new_page()
            try:
                page.set_viewport_size({"width": width, "height": 900})
                pages = {}
                for name, path in console_pages(server).items():
                    answer = page.goto(path)
                    assert answer is not None and answer.status == 200, path
                    pages[path] = Measured(
                        _overflow(page),
                        page.evaluate(TABLES_WIDER_THAN_THEIR_BOX),
                        page.evaluate(SPLIT_WORDS),
                        page.evaluate(CHART_LABELS),
                        page.evaluate(CHART_OVERLAPS),
                    )
                    shot(page, f"layout-{name}-{width}")
                _measured[width] = pages
            finally:
                flush_reports(page)
                page.close()
        return _measured[width]

    return at


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_is_wider_than_the_window(measured, width):
    wider = {path: m.scroll_width for path, m in measured(width).items() if m.scroll_width > width}
    assert not wider, f"pages wider than the {width} px window: {wider}"


@pytest.mark.parametrize("width", WIDTHS)
def test_every_table_fits_its_card(measured, width):
    """As a table at 1,366 and 1,024 px, as cards at 390 px: never wider than its card, nor
    scrolling sideways inside it."""
    wider = {path: m.wider_tables for path, m in measured(width).items() if m.wider_tables}
    assert not wider, f"at {width} px, tables wider than their card: {wider}"


@pytest.mark.parametrize("width", WIDTHS)
def test_no_short_word_is_split_across_lines(measured, width):
    split = {path: m.split_words for path, m in measured(width).items() if m.split_words}
    assert not split, f"at {width} px, short words split across two lines: {split}"


@pytest.mark.parametrize("width", WIDTHS)
def test_chart_labels_are_readable(measured, width):
    labels = [size for m in measured(width).values() for size in m.chart_labels]
    assert labels, "no chart label shown"
    assert min(labels) >= SMALLEST_LABEL_PX, f"at {width} px, chart labels {min(labels):.1f} px tall"


@pytest.mark.parametrize("width", WIDTHS)
def test_no_chart_label_is_drawn_over_another(measured, width):
    overlaps = [pair for m in measured(width).values() for pair in m.chart_overlaps]
    assert not overlaps, f"at {width} px, chart labels over each other: {overlaps}"


@pytest.mark.parametrize("width", WIDTHS)
def test_the_login_page_fits(browser, server, width):
    context = new_context(browser, server)
    try:
        page = context.new_page()
        page.set_viewport_size({"width": width, "height": 900})
        page.goto("/accounts/login/")
        assert _overflow(page) <= width
        shot(page, f"layout-login-{width}")
        flush_reports(page)
    finally:
        context.close()


@pytest.mark.parametrize("width", (1366, 1024))
def test_the_header_fits_its_two_rows_at_desktop_widths(page, server, width):
    """The brand, the workspace and the account links in one row; the workspace's pages and its
    review counts in the next (at 1,366 px the old one-row header wrapped)."""
    page.set_viewport_size({"width": width, "height": 900})
    page.goto("/console/approve/")
    for row in ("header.top .topbar", "header.top .subbar-inner"):
        box = page.locator(row).bounding_box()
        assert box is not None and box["height"] <= 48, (row, box)
    assert page.locator("header.top nav.primary a[aria-current='page']").inner_text() == "Dashboard"


@pytest.mark.parametrize("width", WIDTHS)
def test_the_policy_form_fits(browser, server, width):
    """An admin's settings page: the policy form, grouped by purpose, one sentence a setting."""
    context = new_context(browser, server)
    try:
        page = context.new_page()
        page.goto("/accounts/login/?next=/console/revert/settings/")
        page.get_by_label("Username").fill(server.seed["admin"])
        page.get_by_label("Password").fill(server.password)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url("**/console/revert/settings/")
        page.set_viewport_size({"width": width, "height": 900})
        assert page.locator("fieldset.settings-group").count() >= 6
        assert _overflow(page) <= width
        shot(page, f"layout-settings-admin-{width}")
        flush_reports(page)
    finally:
        context.close()


ONE_LINE_TYPE = """() => {
  const td = [...document.querySelectorAll('table.entries td.type')]
    .find(t => t.textContent.includes('development'));
  const range = document.createRange();
  range.setStart(td, 0);
  range.setEndBefore(td.querySelector('.meta'));
  return [...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top));
}"""


def test_an_entry_type_stays_on_one_line_where_the_table_has_room(logged_in, server):
    """At 1,366 px the memory column has room to give: ``development_note`` is not broken at
    its underscore (the breaks ``breakable`` offers are for narrow columns)."""
    page = logged_in.new_page()
    try:
        page.set_viewport_size({"width": 1366, "height": 900})
        page.goto(console_pages(server)["entries"])
        tops = page.evaluate(ONE_LINE_TYPE)
        assert tops and len(set(tops)) == 1, tops
    finally:
        page.close()
