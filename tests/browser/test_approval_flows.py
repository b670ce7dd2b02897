"""In a real browser, an operator approves what automation proposed and an operator's
restore sticks: approving a reason group from the Pending approval tab takes its rows out
of the open pages and the dashboard's "N changes await approval" drops live; a restored entry
keeps its hold badge through a run started from the dashboard. Screenshots at a desktop and a
phone width (var/screenshots)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("playwright", reason="the playwright package is missing: pip install -e '.[dev]'")

from playwright.sync_api import expect

from tests.browser.conftest import shot, wait_live

WIDTHS = (1366, 390)


def _shots(page, name: str) -> None:
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        shot(page, f"{name}-{width}")
    page.set_viewport_size({"width": 1280, "height": 900})


def test_approving_a_reason_group_takes_its_rows_out_live_everywhere(page, logged_in, server):
    cold = server.seed["approve_cold"]
    runbook = server.seed["approve_stale"]
    dashboard = logged_in.new_page()
    other = logged_in.new_page()
    try:
        dashboard.goto("/console/approve/")
        wait_live(dashboard)
        callout = dashboard.locator("#live-pending")
        expect(callout).to_be_visible()
        expect(callout).to_contain_text("6 changes await approval")
        other.goto("/console/approve/review/?tab=pending")
        wait_live(other)

        page.goto("/console/approve/review/")  # the default tab while proposals are open
        wait_live(page)
        expect(page.locator("#review")).to_have_attribute("data-tab", "pending")
        group = page.locator("#pending-group-evicted")
        expect(group.locator("tr.pending-row")).to_have_count(len(cold))
        expect(page.locator("#pending-count-evicted")).to_have_text(str(len(cold)))
        expect(group.locator("tr.pending-row").first).to_contain_text(
            re.compile(r"retention 0\.\d\d < 0\.20, never accessed, \d+ days old")
        )
        expect(page.locator(f"#pending-row-{runbook}")).to_contain_text("Runbook: rotate the staging")
        _shots(page, "review-pending")
        page.evaluate("window.__notReloaded = true")
        page.once("dialog", lambda dialog: dialog.accept())  # "Approve every proposal of …?"

        with page.expect_response("**/review/approve/") as answer:
            group.get_by_role("button", name="Approve reason").click()
        assert answer.value.status == 200, answer.value.text()

        expect(page.locator("#pending-group-evicted")).to_have_count(0)
        expect(page.locator("#console-notice")).to_contain_text(f"Approved {len(cold)} changes")
        expect(page.locator("#review-count-pending")).to_have_text("1")
        expect(page.locator(f"#pending-row-{runbook}")).to_be_visible()  # the other reason stays
        assert page.evaluate("window.__notReloaded") is True, "the approval reloaded the page"
        # Live, on the pages opened before: the dashboard's count and the other queue's rows.
        expect(callout).to_contain_text("1 change awaits approval")
        expect(dashboard.locator("#live-queue")).to_have_attribute("data-proposals", "1")
        expect(other.locator("#review-count-pending")).to_have_text("1")
        expect(other.locator("#pending-group-evicted")).to_have_count(0)
        expect(other.locator(f"#pending-row-{runbook}")).to_be_visible()
        shot(dashboard, "dashboard-pending-after-approval")
        _shots(page, "review-pending-approved")

        page.goto(f"/console/approve/entries/{cold[0]}/")
        expect(page.locator("p.badges .badge").first).to_have_text("tombstoned")
    finally:
        dashboard.close()
        other.close()


def test_a_restored_entry_keeps_its_hold_through_a_run_now(page, server):
    entry_id = server.seed["holds_entries"][0]
    page.goto(f"/console/holds/entries/{entry_id}/")
    header = page.locator("#entry-header")
    expect(header.locator(".badge").first).to_have_text("tombstoned")

    header.get_by_role("button", name="Restore").click()

    expect(header.locator(".badge").first).to_have_text("active")
    expect(header.locator(".badge.held")).to_be_visible()
    expect(page.locator("#entry-hold")).to_contain_text(
        re.compile(r"Held by\s+user:steward\s+since\s+\d{4}-\d\d-\d\d \d\d:\d\d\s+\(restore\)")
    )
    expect(page.locator("#entry-history")).to_contain_text("+ hold (restore)")

    page.goto("/console/holds/")
    wait_live(page)
    page.once("dialog", lambda dialog: dialog.accept())  # "Run maintenance now? …"
    page.get_by_role("button", name="Run now", exact=True).click()
    # Queued: the run's page follows the worker that does it.
    expect(page).to_have_url(re.compile(r"/console/holds/runs/\d+/$"))
    wait_live(page)
    cluster = server.start("qcluster")
    try:
        expect(page.locator("#run h1 .badge").first).to_have_text("succeeded", timeout=30_000)
        expect(page.locator("#run-metrics tr", has_text="held, left alone")).to_contain_text("1")
    finally:
        cluster.terminate()
        cluster.wait(timeout=15)

    page.goto(f"/console/holds/entries/{entry_id}/")
    expect(header.locator(".badge").first).to_have_text("active")
    expect(header.locator(".badge.held")).to_be_visible()
    expect(header.get_by_role("button", name="Release")).to_be_visible()
    _shots(page, "entry-held")

    header.get_by_role("button", name="Release").click()

    expect(header.locator(".badge.held")).to_have_count(0)
    expect(page.locator("#entry-history")).to_contain_text("hold released")
