"""In a real browser, at a desktop and a phone width, no console page scrolls sideways as a whole:
a wide table scrolls inside its own box (a runs table once pushed the whole runs page to 944 px
at 390 px, header included)."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright", reason="the playwright package is missing: pip install -e '.[dev]'")

WIDTHS = (1366, 390)


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_is_wider_than_the_window(page, server, width):
    run_id = server.seed["revert_run"]["run_id"]
    entry_id = server.seed["revert_entries"][0]
    page.set_viewport_size({"width": width, "height": 900})
    wider = {}
    for path in (
        "/console/revert/",
        "/console/revert/review/",
        "/console/revert/runs/",
        f"/console/revert/runs/{run_id}/",
        f"/console/revert/entries/{entry_id}/",
        "/console/revert/settings/",
    ):
        answer = page.goto(path)
        assert answer is not None and answer.status == 200, path
        scroll = page.evaluate("() => document.documentElement.scrollWidth")
        if scroll > width:
            wider[path] = scroll
    assert not wider, f"pages wider than the {width} px window: {wider}"
