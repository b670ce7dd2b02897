"""The console pages: dashboard, entries list and entry page, their actions, the
viewer/operator split enforced by the server, CSRF, pages that work without JavaScript, the
server-side charts and bounded query counts."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console import charts
from console import selectors as console_selectors
from maintenance.lease import acquire, new_holder
from maintenance.models import MaintenanceRun, RunStatus
from maintenance.run_start import run_maintenance
from memory import accounts, entry_changes, new_entries
from memory.models import Entry, LifecycleEvent, Workspace
from memory.models.choices import Status
from tests.helpers_runs import work_queued_runs

pytestmark = pytest.mark.django_db

User = get_user_model()
HX = {"HTTP_HX_REQUEST": "true"}
ACTIONS = ("pin", "unpin", "restore", "tombstone")


# --- helpers -------------------------------------------------------------------------------------


def member(workspace: Workspace, role: str, username: str | None = None) -> Any:
    user = User.objects.create_user(username=username or f"{role}-{workspace.slug}")
    accounts.membership_set(workspace=workspace, user=user, role=role)
    return user


def as_role(client: Client, workspace: Workspace, role: str) -> Any:
    user = member(workspace, role)
    client.force_login(user)
    return user


def make(workspace: Workspace, content: str = "A memory worth keeping", **fields: Any) -> Entry:
    return new_entries.entry_create(workspace=workspace, content=content, **fields)


def cold(workspace: Workspace, content: str = "Forgotten note nobody reads") -> Entry:
    """An unused episodic entry old enough for the decay pass to tombstone it."""
    return make(workspace, content, created_at=timezone.now() - timedelta(days=400))


def reload(entry: Entry) -> Entry:
    return Entry.objects.get(pk=entry.pk)


def dashboard_url(ws: Workspace) -> str:
    return f"/console/{ws.slug}/"


def entries_url(ws: Workspace) -> str:
    return f"/console/{ws.slug}/entries/"


def entry_url(ws: Workspace, entry: Entry | int) -> str:
    return f"/console/{ws.slug}/entries/{getattr(entry, 'pk', entry)}/"


def run_url(ws: Workspace) -> str:
    return f"/console/{ws.slug}/run/"


def html(response: Any) -> str:
    return response.content.decode()


def listed_ids(response: Any) -> list[int]:
    body = html(response).split('<table class="grid entries', 1)[-1]
    return [int(n) for n in re.findall(r'<a class="title" href="/console/[\w-]+/entries/(\d+)/">#\d+ ', body)]


def queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200
    return len(ctx)


# --- access ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["", "entries/", "entries/1/"])
def test_an_anonymous_visitor_is_sent_to_login(client, workspace, path):
    response = client.get(f"/console/{workspace.slug}/{path}")

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.parametrize("method, path", [("get", ""), ("get", "entries/"), ("post", "run/")])
def test_a_non_member_gets_404_as_if_the_workspace_did_not_exist(
    client, workspace, other_workspace, method, path
):
    as_role(client, other_workspace, "admin")

    response = getattr(client, method)(f"/console/{workspace.slug}/{path}")

    assert response.status_code == 404
    assert not MaintenanceRun.objects.exists()


def test_another_workspaces_entry_is_not_found_under_this_workspace(client, workspace, other_workspace):
    theirs = make(other_workspace, "Globex secret")
    as_role(client, workspace, "operator")

    assert client.get(entry_url(workspace, theirs)).status_code == 404
    for action in ACTIONS:
        assert client.post(f"{entry_url(workspace, theirs)}{action}/").status_code == 404
    assert reload(theirs).status == Status.ACTIVE
    assert not reload(theirs).pinned


def test_unknown_actions_and_impossible_ids_answer_404(client, workspace):
    entry = make(workspace)
    as_role(client, workspace, "operator")

    assert client.post(f"{entry_url(workspace, entry)}purge/").status_code == 404
    assert client.get(entry_url(workspace, 2**64)).status_code == 404
    assert client.post(f"{entry_url(workspace, 2**64)}pin/").status_code == 404


def test_actions_answer_only_post(client, workspace):
    entry = make(workspace)
    as_role(client, workspace, "operator")

    assert client.get(run_url(workspace)).status_code == 405
    assert client.get(f"{entry_url(workspace, entry)}tombstone/").status_code == 405
    assert reload(entry).status == Status.ACTIVE


def test_a_viewer_sees_every_page_but_no_action_button(client, workspace):
    entry = make(workspace, tags=["infra"])
    archived = make(workspace, "Archived note")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual"
    )
    as_role(client, workspace, "viewer")

    pages = [
        client.get(dashboard_url(workspace)),
        client.get(entries_url(workspace)),
        client.get(entry_url(workspace, entry)),
        client.get(entry_url(workspace, archived)),
    ]

    assert [p.status_code for p in pages] == [200, 200, 200, 200]
    body = "".join(html(p) for p in pages)
    assert run_url(workspace) not in body
    for action in ACTIONS:
        assert f"/{action}/" not in body
    assert "Run now" not in body


@pytest.mark.parametrize("dry_run", ["1", "0"])
def test_a_viewer_cannot_run_maintenance(client, workspace, dry_run):
    cold(workspace)
    as_role(client, workspace, "viewer")

    response = client.post(run_url(workspace), {"dry_run": dry_run}, **HX)

    assert response.status_code == 403
    assert not MaintenanceRun.objects.exists()


@pytest.mark.parametrize("action", ACTIONS)
def test_a_viewer_cannot_act_on_an_entry(client, workspace, action):
    live = make(workspace, "Live one")
    pinned = make(workspace, "Pinned one", pinned=True)
    archived = make(workspace, "Archived one")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual"
    )
    target = {"pin": live, "unpin": pinned, "restore": archived, "tombstone": live}[action]
    before = (reload(target).status, reload(target).pinned, LifecycleEvent.objects.count())
    as_role(client, workspace, "viewer")

    plain = client.post(f"{entry_url(workspace, target)}{action}/")
    htmx = client.post(f"{entry_url(workspace, target)}{action}/", **HX)

    assert (plain.status_code, htmx.status_code) == (403, 403)
    assert (reload(target).status, reload(target).pinned, LifecycleEvent.objects.count()) == before


def test_every_post_needs_the_csrf_token(workspace):
    entry = make(workspace)
    client = Client(enforce_csrf_checks=True)
    as_role(client, workspace, "operator")

    refused = [
        client.post(run_url(workspace), {"dry_run": "1"}),
        client.post(f"{entry_url(workspace, entry)}tombstone/", **HX),
    ]

    assert [r.status_code for r in refused] == [403, 403]
    assert not MaintenanceRun.objects.exists()
    assert reload(entry).status == Status.ACTIVE
    # The page's own token works, in the form field and in the htmx header (base.html).
    token = re.search(
        r'name="csrfmiddlewaretoken" value="([^"]+)"', html(client.get(dashboard_url(workspace)))
    )
    assert token is not None
    form = client.post(run_url(workspace), {"dry_run": "1", "csrfmiddlewaretoken": token.group(1)})
    header = client.post(f"{entry_url(workspace, entry)}tombstone/", HTTP_X_CSRFTOKEN=token.group(1), **HX)
    assert (form.status_code, header.status_code) == (303, 200)
    assert reload(entry).status == Status.TOMBSTONED


# --- dashboard and runs -------------------------------------------------------------------------


def test_the_dashboard_shows_counts_charts_runs_and_the_next_run(client, workspace):
    for i in range(3):
        make(workspace, f"note {i}")
    archived = make(workspace, "archived note")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual"
    )
    run_maintenance(workspace=workspace, dry_run=True, trigger="cli")
    as_role(client, workspace, "viewer")

    body = html(client.get(dashboard_url(workspace)))

    assert re.search(r'status=active"><span class="stat-n">3</span>', body)
    assert re.search(r'status=archived"><span class="stat-n">1</span>', body)
    # Two charts, each drawn for a wide card and for a phone's (the stylesheet shows one).
    assert body.count('<svg class="chart" ') == 2 and body.count('<svg class="chart narrow" ') == 2
    # One bar per bin, the bins fitted to the importances the live memories span.
    assert body.count('class="bar"') == 2 * len(console_selectors.importance_histogram(workspace).counts)
    assert 'id="live-runs"' in body
    run = MaintenanceRun.objects.get()
    assert f"/console/{workspace.slug}/runs/{run.pk}/" in body
    assert "Next scheduled run" in body
    # A dry run does not count as maintenance done: the full run is still due now.
    assert "due now" in body


def test_an_operator_dry_run_shows_the_would_be_counts_and_changes_nothing(client, workspace):
    doomed = cold(workspace)
    user = as_role(client, workspace, "operator")

    response = client.post(run_url(workspace), {"dry_run": "1"}, **HX)

    assert response.status_code == 200
    body = html(response)
    assert "<html" not in body
    assert body.lstrip().startswith('<div id="run-result"')
    assert "hx-swap-oob" not in body  # a dry run changed nothing else
    run = MaintenanceRun.objects.get()
    assert (run.dry_run, run.trigger, run.kind, run.actor) == (True, "ui", "full", f"user:{user.username}")
    assert run.counts["evicted"] == 1
    assert '<span class="count-n">1</span> evicted' in body
    assert f'href="/console/{workspace.slug}/runs/{run.pk}/"' in body
    assert reload(doomed).status == Status.ACTIVE


def test_without_javascript_a_run_redirects_to_the_dashboard_that_shows_it(client, workspace):
    cold(workspace)
    as_role(client, workspace, "operator")

    response = client.post(run_url(workspace), {"dry_run": "1"})

    run = MaintenanceRun.objects.get()
    assert response.status_code == 303
    assert response["Location"] == f"{dashboard_url(workspace)}?ran={run.pk}#run-result"
    body = html(client.get(response["Location"]))
    assert f'Dry run\n        <a href="/console/{workspace.slug}/runs/{run.pk}/">#{run.pk}</a>' in body
    assert '<span class="count-n">1</span> evicted' in body


def test_the_dashboard_ignores_a_run_of_another_workspace(client, workspace, other_workspace):
    result = run_maintenance(workspace=other_workspace, dry_run=True)
    as_role(client, workspace, "viewer")

    body = html(client.get(f"{dashboard_url(workspace)}?ran={result['run_id']}"))
    odd = [client.get(f"{dashboard_url(workspace)}?ran={v}") for v in ("x", "-1", "9" * 30, "")]

    assert f"/runs/{result['run_id']}/" not in body
    assert [r.status_code for r in odd] == [200] * 4


def test_an_operator_run_now_queues_the_run_and_opens_its_page(client, workspace):
    doomed = cold(workspace)
    as_role(client, workspace, "operator")

    response = client.post(run_url(workspace), {"dry_run": "0"}, **HX)

    run = MaintenanceRun.objects.get()
    page = f"/console/{workspace.slug}/runs/{run.pk}/"
    # Queued for the worker, not run in the request; htmx is sent to the run's page.
    assert response.status_code == 204
    assert response["HX-Redirect"] == page
    assert (run.dry_run, run.status, run.trigger) == (False, RunStatus.QUEUED, "ui")
    assert reload(doomed).status == Status.ACTIVE
    waiting = html(client.get(page))
    assert "waiting for a worker" in waiting and 'data-status="queued"' in waiting
    assert work_queued_runs() == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert reload(doomed).status == Status.TOMBSTONED
    done = html(client.get(page))
    assert '<span class="badge status-succeeded">succeeded</span>' in done
    assert "Revert this run" in done


def test_without_javascript_run_now_redirects_to_the_run_page(client, workspace):
    cold(workspace)
    as_role(client, workspace, "operator")

    response = client.post(run_url(workspace), {"dry_run": "0"})

    run = MaintenanceRun.objects.get()
    assert response.status_code == 303
    assert response["Location"] == f"/console/{workspace.slug}/runs/{run.pk}/"
    assert run.status == RunStatus.QUEUED


def test_run_now_while_another_run_holds_the_workspace_records_it_skipped(client, workspace):
    holder = MaintenanceRun.objects.create(workspace=workspace, kind="decay", trigger="schedule")
    assert acquire(workspace, holder=new_holder(), now=timezone.now(), run=holder)
    as_role(client, workspace, "operator")

    response = client.post(run_url(workspace), {"dry_run": "0"})

    run = MaintenanceRun.objects.exclude(pk=holder.pk).get()
    assert response["Location"] == f"/console/{workspace.slug}/runs/{run.pk}/"
    assert (run.status, run.dry_run) == (RunStatus.SKIPPED, False)
    body = html(client.get(response["Location"]))
    assert "another run holds this workspace&#x27;s lease" in body


def test_a_dry_run_now_of_a_large_workspace_is_queued_too(client, workspace, settings):
    cold(workspace)
    cold(workspace)
    settings.MAINTENANCE_INLINE_DRY_RUN_MAX_ENTRIES = 1
    as_role(client, workspace, "operator")

    response = client.post(run_url(workspace), {"dry_run": "1"}, **HX)

    run = MaintenanceRun.objects.get()
    assert (run.dry_run, run.status) == (True, RunStatus.QUEUED)
    assert response["HX-Redirect"] == f"/console/{workspace.slug}/runs/{run.pk}/"


def test_a_run_request_without_its_field_is_a_dry_run(client, workspace):
    doomed = cold(workspace)
    as_role(client, workspace, "operator")

    client.post(run_url(workspace), {})

    assert MaintenanceRun.objects.get().dry_run is True
    assert reload(doomed).status == Status.ACTIVE


def test_the_next_full_run_is_due_an_interval_after_the_last_completed_one(workspace):
    now = timezone.now()
    assert console_selectors.next_runs(workspace, now=now).full.state == "due"

    run_maintenance(workspace=workspace, kind="full")
    started, finished = MaintenanceRun.objects.values_list("started_at", "finished_at").get()

    schedule = console_selectors.next_runs(workspace, now=now)
    assert schedule.full.state == "scheduled"
    assert schedule.full.due_at == finished + timedelta(hours=24)
    # The full run swept too: the next sweep is an interval after it started, as the dispatcher sees it.
    assert schedule.decay.state == "scheduled"
    assert schedule.decay.due_at == started + timedelta(seconds=600)
    assert schedule.dispatch_every_minutes == 2


def test_a_running_full_run_is_shown_as_running(workspace):
    MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="schedule")

    schedule = console_selectors.next_runs(workspace, now=timezone.now())

    assert (schedule.full.state, schedule.decay.state) == ("running", "waiting")


# --- entries list --------------------------------------------------------------------------------


def test_the_entries_list_pages_by_fifty(client, workspace):
    made = [make(workspace, f"note number {i}") for i in range(60)]
    as_role(client, workspace, "viewer")

    first = client.get(f"{entries_url(workspace)}?sort=recent")
    second = client.get(f"{entries_url(workspace)}?sort=recent&page=2")
    beyond = client.get(f"{entries_url(workspace)}?sort=recent&page=99")
    garbage = client.get(f"{entries_url(workspace)}?sort=recent&page=x")

    newest_first = [e.pk for e in reversed(made)]
    assert listed_ids(first) == newest_first[:50]
    assert listed_ids(second) == newest_first[50:]
    assert listed_ids(beyond) == newest_first[50:]
    assert listed_ids(garbage) == newest_first[:50]
    assert "60 entries, page 1 of 2" in html(first)
    assert 'href="?sort=recent&amp;page=2"' in html(first)
    # The words of every pager in the console: "← Previous", "Next →".
    assert 'hx-push-url="true">Next →</a>' in html(first)
    assert 'hx-push-url="true">← Previous</a>' in html(second)


def test_the_entries_list_filters(client, workspace):
    rule = make(workspace, "Always pin the versions", entry_type="rule", tier="semantic", project="api")
    tagged = make(workspace, "Deploy on Fridays is risky", tags=["deploy"])
    archived = make(workspace, "Old archived decision", entry_type="decision")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual"
    )
    gone = make(workspace, "Tombstoned note")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)
    as_role(client, workspace, "viewer")

    def ids(query: str) -> set[int]:
        response = client.get(f"{entries_url(workspace)}?{query}")
        assert response.status_code == 200
        return set(listed_ids(response))

    assert ids("") == {rule.pk, tagged.pk, archived.pk}
    assert ids("status=archived") == {archived.pk}
    assert ids("entry_type=rule") == {rule.pk}
    assert ids("tier=semantic") == {rule.pk}
    assert ids("tag=deploy") == {tagged.pk}
    assert ids("project=api") == {rule.pk}
    assert ids("q=fridays") == {tagged.pk}
    assert ids("status=tombstoned") == {rule.pk, tagged.pk, archived.pk}  # ignored, with a message
    assert "Ignored: status" in html(client.get(f"{entries_url(workspace)}?status=tombstoned"))


def test_the_entries_list_answers_htmx_with_the_list_only(client, workspace):
    make(workspace, "One note")
    as_role(client, workspace, "viewer")

    response = client.get(f"{entries_url(workspace)}?q=note", **HX)

    body = html(response)
    assert "<html" not in body
    assert body.lstrip().startswith('<section id="entry-list"')
    assert "HX-Request" in response["Vary"]


# --- entry page ------------------------------------------------------------------------------------


def test_the_entry_page_shows_content_scores_links_anchors_tags_and_history(client, workspace):
    other = make(workspace, "The other end", title="Other end")
    entry = make(
        workspace,
        "First line <script>alert(1)</script>\nSecond line",
        title="Deploy rule",
        tags=["deploy", "infra"],
        trust_score=0.9,
        validation_status="passed",
        anchors=[{"repo": "acme/api", "path": "src/app.py", "commit": "abcdef1234567890", "status": "stale"}],
        links=[{"to_id": other.pk, "type": "caused"}],
    )
    incoming = make(workspace, "Points at it", title="Incoming note", links=[{"to_id": entry.pk}])
    entry_changes.entry_set_status(workspace=workspace, entry_id=entry.pk, status="archived", reason="manual")
    as_role(client, workspace, "viewer")

    body = html(client.get(entry_url(workspace, entry)))

    assert '<h1>Deploy rule <small class="muted">' in body
    assert "First line &lt;script&gt;alert(1)&lt;/script&gt;\nSecond line</pre>" in body
    assert "<script>alert" not in body
    assert "× 0.80" in body  # the stale anchor
    assert "× 1.90" in body  # 0.5 + trust 0.9 + 0.5 passed
    assert "2 live links" in body and "1 causal link" in body
    assert f'href="/console/{workspace.slug}/entries/{other.pk}/">#{other.pk} Other end</a>' in body
    assert f'href="/console/{workspace.slug}/entries/{incoming.pk}/">#{incoming.pk} Incoming note</a>' in body
    assert "<code>src/<wbr>app.py</code>" in body and "anchor-stale" in body  # it may wrap at its slash
    assert ">deploy</a>" in body and ">infra</a>" in body
    history = body.split('id="entry-history"', 1)[1]
    assert history.index("active → archived") < history.index("∅ → active")


def test_the_entry_page_gives_an_entry_s_age_in_whole_days_as_a_proposal_does(client, workspace):
    """The recency row says "342 days old", the words a proposal's why uses, not "341.50"."""
    entry = make(workspace, "An old note", created_at=timezone.now() - timedelta(days=341.6))
    day_old = make(workspace, "A new note", created_at=timezone.now() - timedelta(hours=30))
    as_role(client, workspace, "viewer")

    assert "342 days old</td>" in html(client.get(entry_url(workspace, entry)))
    assert "1 day old</td>" in html(client.get(entry_url(workspace, day_old)))


def test_the_entry_page_of_an_old_version_points_to_the_latest(client, workspace):
    old = make(workspace, "First words")
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="Second words").entry
    as_role(client, workspace, "operator")

    body = html(client.get(entry_url(workspace, old)))

    assert "This is an old version" in body
    assert f'href="/console/{workspace.slug}/entries/{new.pk}/">See the latest version' in body
    assert f"{entry_url(workspace, old)}pin/" not in body
    assert f'href="/console/{workspace.slug}/entries/{new.pk}/">{new.pk}</a>' in body  # versions


def test_pin_and_unpin_through_the_page_without_javascript(client, workspace):
    entry = make(workspace)
    as_role(client, workspace, "operator")

    pinned = client.post(f"{entry_url(workspace, entry)}pin/")

    assert pinned.status_code == 303
    assert pinned["Location"] == entry_url(workspace, entry)
    assert reload(entry).pinned
    page = html(client.get(pinned["Location"]))
    assert '<span class="badge pinned">pinned</span>' in page
    assert f"{entry_url(workspace, entry)}unpin/" in page

    client.post(f"{entry_url(workspace, entry)}unpin/")
    assert not reload(entry).pinned


def test_tombstone_and_restore_through_the_page_are_recorded_with_the_operator(client, workspace):
    entry = make(workspace)
    user = as_role(client, workspace, "operator")

    client.post(f"{entry_url(workspace, entry)}tombstone/")

    assert reload(entry).status == Status.TOMBSTONED
    event = LifecycleEvent.objects.filter(entry=entry).latest("pk")
    assert (event.to_status, event.reason, event.actor) == ("tombstoned", "manual", f"user:{user.username}")
    page = html(client.get(entry_url(workspace, entry)))
    assert "Tombstoned (manual)" in page
    assert f"{entry_url(workspace, entry)}restore/" in page
    assert f"{entry_url(workspace, entry)}tombstone/" not in page

    client.post(f"{entry_url(workspace, entry)}restore/")

    assert reload(entry).status == Status.ACTIVE
    event = LifecycleEvent.objects.filter(entry=entry).latest("pk")
    assert (event.to_status, event.reason, event.actor) == ("active", "restore", f"user:{user.username}")
    # The restore sticks: its event names the operator hold, shown on the page with Release.
    assert event.details == {"hold": "restore"}
    page = html(client.get(entry_url(workspace, entry)))
    assert f"Held by <strong>user:{user.username}</strong>" in page
    assert f"{entry_url(workspace, entry)}release/" in page
    assert "+ hold (restore)" in page


def test_an_entry_tombstoned_by_a_run_shows_the_run_and_can_be_restored(client, workspace):
    doomed = cold(workspace)
    result = run_maintenance(workspace=workspace)
    as_role(client, workspace, "operator")

    page = html(client.get(entry_url(workspace, doomed)))

    assert "Tombstoned (decay) by system" in page
    history = page.split('id="entry-history"', 1)[1]
    assert f'<a href="/console/{workspace.slug}/runs/{result["run_id"]}/">#{result["run_id"]}</a>' in history
    assert '<span class="badge">automatic</span>' in history
    assert client.post(f"{entry_url(workspace, doomed)}restore/").status_code == 303
    assert reload(doomed).status == Status.ACTIVE


def test_an_htmx_action_swaps_the_header_and_the_history_only(client, workspace):
    entry = make(workspace)
    as_role(client, workspace, "operator")

    response = client.post(f"{entry_url(workspace, entry)}tombstone/", **HX)

    body = html(response)
    assert response.status_code == 200
    assert "<html" not in body
    assert body.lstrip().startswith('<section id="entry-header"')
    assert '<section id="entry-history" class="panel" hx-swap-oob="true">' in body
    assert "active → tombstoned" in body
    # The versions (the latest one's status) and the stored scores change too; the content not.
    assert '<section class="panel" id="versions" hx-swap-oob="true">' in body
    assert '<section class="panel" id="scores" hx-swap-oob="true">' in body
    assert 'class="content"' not in body


def test_a_refused_action_shows_why_instead_of_failing(client, workspace):
    entry = make(workspace)
    as_role(client, workspace, "operator")

    plain = client.post(f"{entry_url(workspace, entry)}restore/")
    htmx = client.post(f"{entry_url(workspace, entry)}restore/", **HX)

    assert plain.status_code == 409
    assert "only stale, archived or tombstoned entries can be restored" in html(plain)
    assert "<html" in html(plain) and "hx-swap-oob" not in html(plain)
    assert htmx.status_code == 200
    assert "only stale, archived or tombstoned entries can be restored" in html(htmx)
    assert reload(entry).status == Status.ACTIVE


def test_an_action_on_an_old_version_is_refused_with_a_conflict(client, workspace):
    old = make(workspace, "First words")
    entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="Second words")
    as_role(client, workspace, "operator")

    response = client.post(f"{entry_url(workspace, old)}tombstone/")

    assert response.status_code == 409
    assert "is an old version" in html(response)


def test_the_history_is_paged(client, workspace):
    entry = make(workspace)
    for _ in range(15):  # 30 events + the creation
        entry_changes.entry_set_status(
            workspace=workspace, entry_id=entry.pk, status="archived", reason="manual"
        )
        entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk)
    as_role(client, workspace, "viewer")

    first = html(client.get(entry_url(workspace, entry)))
    last = client.get(f"{entry_url(workspace, entry)}?events=2", **HX)

    assert "31 events" in first
    assert first.split('id="entry-history"', 1)[1].count("<tr>") == 1 + 25
    assert html(last).lstrip().startswith('<section id="entry-history"')
    assert html(last).count("<tr>") == 1 + 6
    assert "∅ → active" in html(last)


# --- charts -----------------------------------------------------------------------------------------


def test_a_bar_chart_has_one_bar_per_value_and_escapes_its_text():
    svg = charts.bar_chart(
        [("<b>", 3), ("b", 0), ("c", 7.5)], chart_id="c1", title='Say "hi" <now>', x_label="x", y_label="y"
    )

    assert svg.startswith('<svg class="chart" id="c1"')
    assert 'viewBox="0 0 560 220"' in svg and 'role="img"' in svg
    assert 'aria-labelledby="c1-title c1-desc"' in svg
    assert svg.count('class="bar"') == 3
    assert "<title>&lt;b&gt;: 3</title>" in svg
    assert '<title id="c1-title">Say &quot;hi&quot; &lt;now&gt;</title>' in svg
    assert "<b>" not in svg
    assert svg.endswith("</svg>")


def test_the_tallest_bar_fills_the_plot():
    svg = charts.bar_chart([("a", 5), ("b", 10)], chart_id="c", title="t", x_label="x", y_label="y")

    heights = [float(h) for h in re.findall(r'class="bar"[^>]* height="([\d.]+)"', svg)]
    assert heights == [82.0, 164.0]


def test_a_time_series_draws_every_point_and_labels_a_few():
    points = [(f"2026-{m:02d}", m * 2) for m in range(1, 13)]

    svg = charts.time_series(points, chart_id="g", title="Growth", x_label="month", y_label="memories")

    assert svg.count('class="point"') == 12
    assert svg.count('class="line"') == 1
    labels = re.findall(r'<text class="tick"[^>]*>(2026-\d\d)</text>', svg)
    assert labels[0] == "2026-01" and labels[-1] == "2026-12" and len(labels) <= charts.MAX_X_LABELS


def test_y_tick_labels_stay_short_beside_the_axis_label():
    """Counts in the hundreds of thousands labelled in full ("300000") ran into the rotated
    axis label; thousands and millions are shortened to at most four characters."""
    svg = charts.time_series(
        [("2026-01", 180_000), ("2026-02", 1_250_000)], chart_id="g", title="t", x_label="x", y_label="y"
    )
    ticks = re.findall(r'<text class="tick"[^>]*text-anchor="end">([^<]*)</text>', svg)
    assert ticks[:4] == ["0", "500k", "1M", "1.5M"]  # then the x labels (the last anchored at its end)
    assert charts.MARGIN_LEFT - 4 - 4 * 6.6 > 12 + 11 / 2  # four digits at 11 px clear the axis label


def test_an_empty_chart_says_so():
    svg = charts.time_series([], chart_id="e", title="t", x_label="x", y_label="y")

    assert "No data yet" in svg and 'class="point"' not in svg


def test_the_importance_histogram_bins_live_latest_entries_in_sql(workspace):
    values = [0.0, 0.05, 0.1, 0.35, 0.99, 1.0]
    for value in values:
        Entry.objects.filter(pk=make(workspace, f"note {value}").pk).update(importance=value)
    gone = make(workspace, "gone")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)

    histogram = console_selectors.importance_histogram(workspace)

    # The values span the whole scale: twenty bins of 0.05 (1.0 closes the last one).
    assert (histogram.start, histogram.width) == (0.0, 0.05)
    assert histogram.counts == [1, 1, 1, 0, 0, 0, 0, 1, *[0] * 11, 2]
    assert histogram.labels[:3] == ["0.00", "0.05", "0.10"] and histogram.total == 6


def test_the_importance_histogram_fits_its_bins_to_skewed_real_data(workspace):
    """Imported workspaces keep nearly every importance within a few hundredths: ten bins of a
    tenth drew one bar. The bins fit the range instead, and a lopsided count goes log-scale."""
    values = [0.051] * 40 + [0.055] * 12 + [0.062] * 3 + [0.083, 0.118]
    for i, value in enumerate(values):
        Entry.objects.filter(pk=make(workspace, f"imported note {i}").pk).update(importance=value)

    histogram = console_selectors.importance_histogram(workspace)

    assert histogram.width == 0.005 and histogram.start == 0.05
    assert len(histogram.counts) == 14 and histogram.total == len(values)
    assert sum(1 for n in histogram.counts if n) == 5  # five bars, not one
    assert histogram.counts[:3] == [40, 12, 3] and histogram.labels[0] == "0.050"
    assert histogram.skewed

    svg = charts.bar_chart(
        list(zip(histogram.labels, histogram.counts, strict=True)),
        chart_id="h",
        title="t",
        x_label="x",
        y_label="y",
        log_scale=True,
    )
    heights = [float(h) for h in re.findall(r'class="bar"[^>]* height="([\d.]+)"', svg)]
    assert heights[0] == 164.0 and 0 < heights[-1] < heights[2] < heights[0]
    assert heights[-1] > 164.0 / 40 * 4  # a bin of 1 shows well above its linear height
    bar_labels = re.findall(r'<text class="tick"[^>]*text-anchor="middle">0\.\d+</text>', svg)
    assert 0 < len(bar_labels) <= charts.MAX_BAR_LABELS


def test_a_histogram_of_equal_values_is_one_narrow_bin(workspace):
    for i in range(3):
        Entry.objects.filter(pk=make(workspace, f"same {i}").pk).update(importance=0.4)

    histogram = console_selectors.importance_histogram(workspace)

    assert histogram.counts == [3] and histogram.labels == ["0.400"] and not histogram.skewed


def test_an_empty_workspace_has_an_empty_histogram(workspace):
    assert console_selectors.importance_histogram(workspace).counts == []


def test_linear_y_ticks_are_round_counts():
    svg = charts.bar_chart([("a", 3), ("b", 1)], chart_id="c", title="t", x_label="x", y_label="y")

    ticks = re.findall(r'<text class="tick"[^>]*text-anchor="end">([\d.]+)</text>', svg)
    assert ticks == ["0", "1", "2", "3"]


def test_growth_counts_each_lineage_once_by_week_with_empty_weeks(workspace):
    now = timezone.now()
    first = make(workspace, "three weeks ago", created_at=now - timedelta(days=21))
    entry_changes.entry_update(
        workspace=workspace, entry_id=first.pk, content="a new version, not a new memory"
    )
    make(workspace, "today")

    unit, points = console_selectors.growth(workspace)

    assert unit == "week"
    assert points[0].created == 1 and points[-1].total == 2
    assert len(points) in (4, 5)  # the weeks from three weeks ago to this one
    assert sum(p.created for p in points) == 2


def test_growth_switches_to_months_for_a_long_history(workspace):
    make(workspace, "old", created_at=timezone.now() - timedelta(days=400))
    make(workspace, "new")

    unit, points = console_selectors.growth(workspace)

    assert unit == "month"
    assert 13 <= len(points) <= 15
    assert points[-1].total == 2


# --- query counts ------------------------------------------------------------------------------------


def _busy(workspace: Workspace, n: int) -> Entry:
    """n entries linked to one hub entry, n runs, n lifecycle events on the hub, n tags."""
    hub = make(workspace, "The hub", tags=[f"t{i}" for i in range(min(n, 40))])
    for i in range(n):
        make(workspace, f"note {i}", tags=["x", f"t{i}"], links=[{"to_id": hub.pk, "type": "resolved"}])
        MaintenanceRun.objects.create(
            workspace=workspace, kind="full", trigger="cli", status="succeeded", counts={"scored": i}
        )
    for _ in range(n // 2):
        entry_changes.entry_set_status(
            workspace=workspace, entry_id=hub.pk, status="archived", reason="manual"
        )
        entry_changes.entry_restore(workspace=workspace, entry_id=hub.pk)
    return hub


@pytest.mark.parametrize("page", ["dashboard", "entries", "entry"])
def test_the_pages_take_a_constant_number_of_queries(client, workspace, other_workspace, page):
    small_hub = _busy(workspace, 4)
    big_hub = _busy(other_workspace, 60)
    user = member(workspace, "operator")
    accounts.membership_set(workspace=other_workspace, user=user, role="operator")
    client.force_login(user)
    url = {
        "dashboard": lambda ws, hub: dashboard_url(ws),
        "entries": lambda ws, hub: f"{entries_url(ws)}?tag=x",
        "entry": lambda ws, hub: entry_url(ws, hub),
    }[page]
    client.get(url(workspace, small_hub))  # warm the session and the content types

    small = queries(client, url(workspace, small_hub))
    big = queries(client, url(other_workspace, big_hub))

    assert small == big
    # +1: the live review counts; the entry page +2: the hold's policy (and cold threshold), the
    # open proposals; the dashboard +1: the importance range its histogram bins fit; the
    # entries list +1: the cold threshold its note on retention quotes.
    assert big <= {"dashboard": 12, "entries": 9, "entry": 14}[page]


def test_a_nan_importance_written_past_the_services_does_not_break_the_histogram(workspace):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite stores a NaN as NULL, which the column refuses")
    for i, value in enumerate([0.2, float("nan"), 0.3]):
        Entry.objects.filter(pk=make(workspace, f"odd {i}").pk).update(importance=value)

    histogram = console_selectors.importance_histogram(workspace)

    assert histogram.total == 2 and sum(histogram.counts) == 2
