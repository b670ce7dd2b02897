"""In a real browser: logging in, a dry run from the dashboard, "Run now" opening the run's page
which follows the django-q2 worker doing it, and runs made by other processes —
``manage.py maintain`` and a django-q2 worker — appearing on an open dashboard without a reload
(embedded mode: no Redis, the outbox relay carries them)."""

from __future__ import annotations

import json
import re
import time

import pytest

pytest.importorskip("playwright", reason="the playwright package is missing: pip install -e '.[dev]'")

from playwright.sync_api import expect

from tests.browser.conftest import log_in, new_context, shot, wait_live


def test_an_operator_logs_in_through_the_login_form(browser, server):
    context = new_context(browser, server)
    page = context.new_page()
    try:
        page.goto("/console/")
        expect(page).to_have_url(re.compile(r"/accounts/login/"))
        page.get_by_label("Username").fill(server.seed["username"])
        page.get_by_label("Password").fill("not-the-password")
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("alert")).to_contain_text("did not match")
        shot(page, "login")
        log_in(page, server)
        expect(page.get_by_role("heading", name="Your workspaces")).to_be_visible()
        for slug in ("live", "dryrun", "hygiene", "revert", "tombstone", "dispute"):
            expect(page.get_by_text(slug, exact=True).first).to_be_visible()
        expect(page.get_by_role("button", name=re.compile("Log out steward"))).to_be_visible()
        shot(page, "workspaces")
    finally:
        context.close()


def test_a_dry_run_from_the_dashboard_shows_what_a_run_would_do(page):
    page.goto("/console/dryrun/")
    wait_live(page)
    expect(page.locator("#live-runs")).to_contain_text("No run yet.")
    shot(page, "dashboard")

    page.get_by_role("button", name="Dry run now").click()

    result = page.locator("#run-result")
    expect(result).to_contain_text(re.compile(r"Dry run\s+#\d+:\s+succeeded"))
    expect(result).to_contain_text("what a run now would do")
    # The five old notes would go (how depends on the policy); every entry is scored, a metric
    # shown apart from the changes.
    expect(result.locator(".metrics")).to_contain_text("scored 8")
    expect(result.locator("li", has_text="scored")).to_have_count(0)
    expect(result.locator("li").first).to_be_visible()
    # The live table got the run too (sent by this web process over the websocket).
    row = page.locator("#live-runs tbody tr").first
    expect(row).to_contain_text("dry run")
    expect(row).to_have_attribute("data-status", "succeeded")
    shot(page, "dashboard-dry-run")
    # Nothing was applied: all eight entries are still active.
    page.goto("/console/dryrun/")
    expect(page.locator("#status-counts .status-active .stat-n")).to_have_text("8")


def _open_dashboard(page, slug: str) -> None:
    page.goto(f"/console/{slug}/")
    wait_live(page)
    page.evaluate("window.__notReloaded = 'still the same page'")


def _assert_not_reloaded(page) -> None:
    assert page.evaluate("window.__notReloaded") == "still the same page"


def _stop(cluster) -> None:
    cluster.terminate()
    deadline = time.monotonic() + 15
    while cluster.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)


def test_run_now_opens_the_run_page_which_follows_the_worker_live(page, server):
    page.goto("/console/runnow/")
    wait_live(page)
    page.once("dialog", lambda dialog: dialog.accept())  # "Run maintenance now? …"
    page.get_by_role("button", name="Run now", exact=True).click()

    # Queued, not run in the request: the browser is on the run's page, which says so.
    expect(page).to_have_url(re.compile(r"/console/runnow/runs/\d+/$"))
    expect(page.locator(".run-progress")).to_contain_text("Queued")
    expect(page.locator("#run h1 .badge").first).to_have_text("queued")
    wait_live(page)
    page.evaluate("window.__notReloaded = 'still the same page'")
    shot(page, "run-page-queued")

    cluster = server.start("qcluster")  # the worker, another process: its pushes come by the outbox
    try:
        expect(page.locator("#run h1 .badge").first).to_have_text("succeeded", timeout=30_000)
        expect(page.locator(".run-progress")).to_contain_text(re.compile(r"Ended:\s+succeeded"))
        # The finished run's page, without a reload: counts, affected entries, revert.
        expect(page.locator("#affected-archived .count")).to_have_text("5")
        expect(page.locator("#run-counts tr", has_text="archived").first).to_contain_text("5")
        expect(page.get_by_role("button", name="Revert this run")).to_be_visible()
    finally:
        _stop(cluster)
    _assert_not_reloaded(page)
    shot(page, "run-page-live-end")


def test_a_run_of_another_process_appears_on_the_open_dashboard(page, server):
    _open_dashboard(page, "live")
    before = page.locator("#live-runs tbody tr").count()

    # A separate process (the command line), on the same database: the page learns of it only
    # through the outbox relay of the web process.
    out = server.manage("maintain", "--workspace", "live", "--json")
    run_id = json.loads(out)["run_id"]

    row = page.locator(f'#live-runs tr[data-run-id="{run_id}"]')
    expect(row).to_be_visible(timeout=5_000)
    expect(row).to_have_attribute("data-status", "succeeded")
    expect(row).to_contain_text("cli")
    expect(page.locator("#live-runs tbody tr")).to_have_count(before + 1)
    _assert_not_reloaded(page)
    shot(page, "dashboard-live-run-from-cli")


def test_a_run_in_a_django_q2_worker_appears_on_the_open_dashboard(page, server):
    _open_dashboard(page, "live")
    # Queue the scheduled task the dispatcher would queue, then start a worker cluster.
    server.manage(
        "shell",
        "-c",
        "from django_q.tasks import async_task; from memory.models import Workspace; "
        "from maintenance.tasks import RUN_TASK; "
        "async_task(RUN_TASK, Workspace.objects.get(slug='live').pk, 'full')",
    )
    cluster = server.start("qcluster")
    try:
        row = page.locator("#live-runs tbody tr", has_text="schedule").first
        expect(row).to_be_visible(timeout=20_000)
        expect(row).to_have_attribute("data-status", "succeeded", timeout=10_000)
    finally:
        cluster.terminate()
    _assert_not_reloaded(page)
    shot(page, "dashboard-live-run-from-worker")
    deadline = time.monotonic() + 15
    while cluster.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)


def test_the_review_counts_follow_a_run_of_another_process(page, server):
    page.goto("/console/queue/")
    queue = page.locator("#live-queue")
    expect(queue).to_have_count(1)  # every workspace page carries the live review counts
    wait_live(page)
    page.evaluate("window.__notReloaded = 'still the same page'")
    expect(queue).to_have_attribute("data-automatic", "0")
    archived = page.locator("#status-counts .status-archived .stat-n")
    expect(archived).to_have_text("0")

    server.manage("maintain", "--workspace", "queue")  # archives the five old notes

    expect(queue).to_have_attribute("data-automatic", "5", timeout=5_000)
    expect(queue).to_contain_text("5 automatic changes")
    expect(archived).to_have_text("5")  # the dashboard's entries by status follow too
    _assert_not_reloaded(page)
    shot(page, "dashboard-live-queue")
