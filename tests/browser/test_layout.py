"""In a real browser, at a desktop (1,366 px), a small laptop (1,024 px) and a phone (390 px)
width, no console page scrolls sideways as a whole, and every table fits its card or scrolls
inside a box of its own there (a runs table once pushed the whole runs page to 944 px at
390 px, header included; the entries table was 1,476 px wide in a 1,366 px window). The
header keeps to its rows at 1,024 px. Every page is saved as
var/screenshots/layout-<page>-<width>.png."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright", reason="the playwright package is missing: pip install -e '.[dev]'")

from tests.browser.conftest import flush_reports, new_context, shot

WIDTHS = (1366, 1024, 390)


def console_pages(server) -> dict[str, str]:
    run_id = server.seed["revert_run"]["run_id"]
    entry_id = server.seed["revert_entries"][0]
    return {
        "workspaces": "/console/",
        "dashboard": "/console/revert/",
        "review-pending": "/console/approve/review/?tab=pending",
        "review-hygiene": "/console/hygiene/review/?tab=hygiene",
        "review-automatic": "/console/revert/review/?tab=automatic",
        "review-tombstones": "/console/tombstone/review/?tab=tombstones",
        "review-disputes": "/console/dispute/review/?tab=disputes",
        "runs": "/console/revert/runs/",
        "run": f"/console/revert/runs/{run_id}/",
        "entries": "/console/revert/entries/",
        "entry": f"/console/revert/entries/{entry_id}/",
        "settings": "/console/revert/settings/",
    }


def _overflow(page) -> int:
    return page.evaluate("() => document.documentElement.scrollWidth")


# Tables that neither fit their card nor scroll inside a box of their own within it.
LOOSE_TABLES = """() => {
  const loose = [];
  for (const table of document.querySelectorAll("main table")) {
    if (!table.getClientRects().length) continue;  // not shown (e.g. an empty hidden body)
    for (let box = table.parentElement; box; box = box.parentElement) {
      const overflow = getComputedStyle(box).overflowX;
      if (overflow === "auto" || overflow === "scroll") break;
      if (box.matches(".panel, .dispute, main")) {
        if (table.getBoundingClientRect().right > box.getBoundingClientRect().right + 1) {
          loose.push(table.id || table.className);
        }
        break;
      }
    }
  }
  return loose;
}"""


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_is_wider_than_the_window(page, server, width):
    page.set_viewport_size({"width": width, "height": 900})
    wider = {}
    for name, path in console_pages(server).items():
        answer = page.goto(path)
        assert answer is not None and answer.status == 200, path
        scroll = _overflow(page)
        if scroll > width:
            wider[path] = scroll
        loose = page.evaluate(LOOSE_TABLES)
        if loose:
            wider[f"{path} tables"] = loose
        shot(page, f"layout-{name}-{width}")
    assert not wider, f"pages wider than the {width} px window, or tables out of their card: {wider}"


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
