"""In a real browser, the pages the previous tests do not visit meet the Content-Security-Policy
without a violation: the admin (login, a changelist with its filters and actions, a change form
with its inline, an add form), the dashboard's charts, the entries filter that applies itself
when a menu changes (a behaviour moved out of an htmx trigger filter, which needs eval), and
the API docs. Every browser test fails on a violation already (``no_csp_violation`` in
conftest); these make sure the pages are visited at all."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("playwright", reason="the playwright package is missing: pip install -e '.[dev]'")

from playwright.sync_api import expect

from tests.browser.conftest import flush_reports, new_context, shot, wait_live


def test_the_admin_login_changelist_and_forms_meet_the_policy(browser, server):
    context = new_context(browser, server)
    page = context.new_page()
    try:
        page.goto("/admin/login/?next=/admin/")
        page.get_by_label("Username").fill(server.seed["admin"])
        page.get_by_label("Password").fill(server.password)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url("**/admin/")
        shot(page, "admin-index")
        page.goto("/admin/memory/entry/?status__exact=active")
        expect(page.locator("#result_list")).to_be_visible()
        # The actions bar is driven by the admin's own script (actions.js): a checked row
        # shows the selection counter.
        page.locator("#result_list input.action-select").first.check()
        expect(page.locator(".action-counter")).to_contain_text("1 of")
        shot(page, "admin-entries")
        page.locator("#result_list tbody th a").first.click()
        page.wait_for_url(re.compile(r"/change/"))
        expect(page.locator("#entry_form")).to_be_visible()
        shot(page, "admin-entry-change")
        page.goto("/admin/maintenance/maintenancerun/")
        page.locator("#result_list tbody th a").first.click()
        page.wait_for_url(re.compile(r"/change/"))
        page.goto("/admin/memory/workspace/add/")
        expect(page.locator("#workspace_form")).to_be_visible()
        flush_reports(page)
    finally:
        context.close()


def test_the_dashboard_charts_and_the_self_applying_entries_filter_meet_the_policy(page):
    page.goto("/console/live/")
    wait_live(page)
    # Each chart is drawn twice, for a wide card and for a phone's: at 1,280 px the wide one shows.
    expect(page.locator("#growth svg.chart:not(.narrow)")).to_be_visible()
    expect(page.locator("#importance svg.chart:not(.narrow)")).to_be_visible()
    page.goto("/console/live/entries/")
    page.evaluate("window.__notReloaded = true")
    menu = page.locator("form[data-refresh-on-select] select").first
    values = menu.locator("option").evaluate_all("options => options.map(o => o.value)")

    def htmx_list(response) -> bool:
        return "/entries/" in response.url and response.request.headers.get("hx-request") == "true"

    with page.expect_response(htmx_list):
        menu.select_option(values[-1])
    # hx-push-url puts the filter in the address once the answer is swapped in, a moment after
    # the response arrives: wait for it rather than read the address at once.
    expect(page).to_have_url(re.compile(rf"[?&][a-z_]+={re.escape(values[-1])}(&|$)"))
    assert page.evaluate("window.__notReloaded") is True, "the filter reloaded the page"


def test_the_api_docs_meet_the_policy(page):
    page.goto("/api/v1/docs")
    # Swagger UI's bundle is large: on a busy machine it takes a few seconds to draw.
    expect(page.locator("#swagger-ui .information-container")).to_be_visible(timeout=30_000)
    expect(page.locator("#swagger-ui .opblock").first).to_be_visible()
