"""The console's review queue and run pages: every tab with its count, the actions with
and without htmx, viewers who see but cannot act, workspace isolation, CSRF, pagination and
query counts that do not grow with the number of rows."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console.labels import count_label
from maintenance.models import Dispute, MaintenanceRun, RunDaySummary
from maintenance.run_results import COUNT_KEYS
from maintenance.run_start import run_maintenance
from memory import accounts, entry_changes, new_entries, relationships
from memory.models import Entry, LifecycleEvent, Relationship, Tombstone, Workspace
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db

User = get_user_model()
HX = {"HTTP_HX_REQUEST": "true"}
# Fragment (2) + truncated (2) = 4, never accessed: recommended for archive.
JUNK = "half done {}..."
GOOD = "The connection pool keeps twelve sockets open between deploys and retries failed handshakes {}."


# --- helpers ----------------------------------------------------------------------------------


def login(client: Client, workspace: Workspace, role: str = "operator", username: str = "olga") -> Any:
    user, _ = User.objects.get_or_create(username=username)
    accounts.membership_set(workspace=workspace, user=user, role=role)
    client.force_login(user)
    return user


def junk(workspace: Workspace, now, n: int = 1) -> list[Entry]:
    """Hygiene candidates (score 4, archive recommended)."""
    start = Entry.objects.count()
    return [
        new_entries.entry_create(workspace=workspace, content=JUNK.format(start + i), created_at=now, now=now)
        for i in range(n)
    ]


def good(workspace: Workspace, now, **fields: Any) -> Entry:
    return new_entries.entry_create(
        workspace=workspace, content=GOOD.format(Entry.objects.count()), created_at=now, now=now, **fields
    )


def cold(workspace: Workspace, now, n: int = 1) -> list[Entry]:
    """Entries a full run tombstones (retention below the cold threshold after 100 days)."""
    return [
        new_entries.entry_create(
            workspace=workspace,
            content=GOOD.format(Entry.objects.count()),
            created_at=now - timedelta(days=100),
            now=now,
        )
        for _ in range(n)
    ]


def stale(workspace: Workspace, now) -> Entry:
    """An entry a full run archives (stale for longer than archive_after_days)."""
    entry = new_entries.entry_create(
        workspace=workspace,
        content=GOOD.format(Entry.objects.count()),
        created_at=now - timedelta(days=500),
        now=now - timedelta(days=500),
    )
    Entry.objects.filter(pk=entry.pk).update(status="stale", status_changed_at=now - timedelta(days=200))
    return entry


def dispute(workspace: Workspace, now) -> Dispute:
    a, b = good(workspace, now), good(workspace, now)
    return Dispute.objects.create(
        workspace=workspace, entry_a_id=a.pk, entry_b_id=b.pk, detected_by="sweep", similarity=0.5
    )


def status(entry: Entry) -> str:
    return Entry.objects.get(pk=entry.pk).status


def counts(html: str) -> dict[str, int]:
    return {tab: int(n) for tab, n in re.findall(r'id="review-count-(\w+)">(\d+)<', html)}


def review(client: Client, tab: str, **params: Any) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"tab": tab, **params}.items())
    response = client.get(f"/console/acme/review/?{query}")
    assert response.status_code == 200
    return response.content.decode()


def queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200
    return len(ctx.captured_queries)


# --- pages --------------------------------------------------------------------------------------


def test_each_tab_renders_with_every_tab_count(client, workspace, now):
    login(client, workspace, role="viewer")
    junk(workspace, now, 2)
    cold(workspace, now, 3)
    stale(workspace, now)
    run_maintenance(workspace=workspace, now=now)
    dispute(workspace, now)

    for tab in ("hygiene", "automatic", "tombstones", "disputes"):
        html = review(client, tab)
        assert counts(html) == {"hygiene": 2, "automatic": 4, "tombstones": 3, "disputes": 1, "pending": 0}
        assert f'id="review-tab-{tab}" href="?tab={tab}"' in html
        assert re.search(rf'id="review-tab-{tab}"[^>]*aria-current="page"', html)
    # An unknown tab is the default: hygiene while nothing awaits approval (pending goes last).
    assert 'data-tab="hygiene"' in review(client, "nonsense")
    assert list(counts(review(client, "hygiene"))) == [
        "hygiene",
        "automatic",
        "tombstones",
        "disputes",
        "pending",
    ]


def test_the_hygiene_tab_explains_each_candidate(client, workspace, now):
    login(client, workspace)
    entry = junk(workspace, now)[0]
    good(workspace, now)

    html = review(client, "hygiene")

    assert f'id="hygiene-row-{entry.pk}"' in html
    assert f'href="/console/acme/entries/{entry.pk}/"' in html
    # The reasons in words, the API's codes in their titles.
    assert 'title="incomplete_fragment">incomplete fragment<' in html
    assert 'title="truncated_or_unbalanced">truncated or unbalanced<' in html
    assert "content ends in &#x27;...&#x27;" in html  # the reason's detail
    assert 'class="num score">4<' in html
    assert 'class="badge rec-archive">archive<' in html
    assert html.count('id="hygiene-row-') == 1


def test_an_exact_duplicate_links_to_the_entry_it_copies(client, workspace, now):
    login(client, workspace)
    older = good(workspace, now - timedelta(days=3))
    copy = new_entries.entry_create(workspace=workspace, content=older.content, created_at=now, now=now)

    html = review(client, "hygiene")
    row = html[html.index(f'id="hygiene-row-{copy.pk}"') :].split("</tr>", 1)[0]

    assert 'title="exact_duplicate">exact duplicate<' in row
    assert f'same content as older <a href="/console/acme/entries/{older.pk}/">entry {older.pk}</a>' in row


def test_the_automatic_tab_groups_changes_by_run(client, workspace, now):
    login(client, workspace)
    first = cold(workspace, now, 2)
    run1 = run_maintenance(workspace=workspace, now=now)["run_id"]
    archived = stale(workspace, now)
    later = now + timedelta(days=1)
    run2 = run_maintenance(workspace=workspace, now=later)["run_id"]

    html = review(client, "automatic")

    group1 = html[html.index(f'id="auto-run-{run1}"') :]
    group2 = html[html.index(f'id="auto-run-{run2}"') : html.index(f'id="auto-run-{run1}"')]
    assert all(f'id="auto-row-{e.pk}"' in group1 for e in first)
    assert f'id="auto-row-{archived.pk}"' in group2
    assert "stale → <strong>archived</strong>" in group2
    assert f'action="/console/acme/runs/{run1}/revert/"' in group1
    assert "Revert whole run" in group1
    # filters
    assert html.count('class="queue-row auto-row"') == 3
    only_archived = review(client, "automatic", to_status="archived")
    assert only_archived.count('class="queue-row auto-row"') == 1
    assert review(client, "automatic", run=run1).count('class="queue-row auto-row"') == 2


def test_an_entry_changed_since_the_run_leaves_the_automatic_tab(client, workspace, now):
    login(client, workspace)
    a, b = cold(workspace, now, 2)
    run_maintenance(workspace=workspace, now=now)
    entry_changes.entry_restore(workspace=workspace, entry_id=a.pk, now=now + timedelta(minutes=1))
    entry_changes.entry_tombstone(workspace=workspace, entry_id=a.pk, now=now + timedelta(minutes=2))

    html = review(client, "automatic")

    assert f'id="auto-row-{a.pk}"' not in html  # the operator's own tombstone stands
    assert f'id="auto-row-{b.pk}"' in html


def test_the_tombstones_tab_counts_down_to_the_purge(client, workspace, now):
    login(client, workspace)
    entry = good(workspace, now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, actor="user:mia")
    Tombstone.objects.filter(entry=entry).update(purge_after=now.replace(year=2100))
    gone = good(workspace, now)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)
    Tombstone.objects.filter(entry=gone).update(purge_after=now - timedelta(days=1000))

    html = review(client, "tombstones")

    row = html[html.index(f'id="tomb-row-{entry.pk}"') :]
    assert "user:mia" in row and "manual" in row
    assert re.search(r"purge in \d+ days", row)
    assert "purge at the next run" in html[html.index(f'id="tomb-row-{gone.pk}"') :]
    assert html.index(f'id="tomb-row-{gone.pk}"') < html.index(
        f'id="tomb-row-{entry.pk}"'
    )  # next purge first


def test_the_disputes_tab_shows_both_entries_side_by_side(client, workspace, now):
    login(client, workspace)
    d = dispute(workspace, now)
    Dispute.objects.filter(pk=d.pk).update(similarity=0.4375)

    html = review(client, "disputes")

    card = html[html.index(f'id="dispute-{d.pk}"') :]
    assert "similarity 0.44" in card and "detected by sweep" in card
    assert card.index(f"/entries/{d.entry_a_id}/") < card.index(f"/entries/{d.entry_b_id}/")
    for label in ("Keep both", "Keep A, archive B", "Keep B, archive A", "A supersedes B", "B supersedes A"):
        assert label in card


def test_an_htmx_tab_switch_answers_only_the_queue(client, workspace, now):
    login(client, workspace)
    response = client.get("/console/acme/review/?tab=disputes", **HX)

    html = response.content.decode()
    assert "<html" not in html
    assert html.lstrip().startswith('<section id="review"')
    assert "HX-Request" in response["Vary"]


# --- hygiene actions ----------------------------------------------------------------------------


def test_archiving_one_candidate_with_htmx_removes_only_its_row(client, workspace, now):
    login(client, workspace)
    one, other = junk(workspace, now, 2)

    response = client.post("/console/acme/review/hygiene/", {"action": "archive", "ids": [one.pk]}, **HX)

    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html
    assert f'<tr id="hygiene-row-{one.pk}" hx-swap-oob="delete"></tr>' in html
    assert f"hygiene-row-{other.pk}" not in html
    assert counts(html)["hygiene"] == 1
    assert 'id="review-tabs" class="tabs" aria-label="Review queue" hx-swap-oob="true"' in html
    assert "Archived 1 entry" in html
    assert status(one) == "archived" and status(other) == "active"
    event = LifecycleEvent.objects.get(entry=one, to_status="archived")
    assert (event.actor, event.reason, event.automatic) == ("user:olga", "hygiene", False)


def test_keep_hides_candidates_from_the_queue(client, workspace, now):
    login(client, workspace)
    a, b, c = junk(workspace, now, 3)

    response = client.post("/console/acme/review/hygiene/", {"action": "keep", "ids": [a.pk, b.pk]}, **HX)

    html = response.content.decode()
    assert f'id="hygiene-row-{a.pk}" hx-swap-oob="delete"' in html
    assert f'id="hygiene-row-{b.pk}" hx-swap-oob="delete"' in html
    assert counts(html)["hygiene"] == 1
    assert [status(e) for e in (a, b, c)] == ["active"] * 3
    page = review(client, "hygiene")
    assert f"hygiene-row-{a.pk}" not in page and f'id="hygiene-row-{c.pk}"' in page


def test_archiving_a_selection_without_javascript_redirects_back_with_a_message(client, workspace, now):
    login(client, workspace)
    a, b, c = junk(workspace, now, 3)
    back = "/console/acme/review/?tab=hygiene&recommendation=archive"

    response = client.post(
        "/console/acme/review/hygiene/", {"action": "archive", "ids": [a.pk, b.pk], "next": back}
    )

    assert response.status_code == 303
    assert response["Location"] == back
    assert [status(e) for e in (a, b, c)] == ["archived", "archived", "active"]
    html = client.get(back).content.decode()
    assert f"Archived 2 entries (#{a.pk}, #{b.pk})." in html
    assert counts(html)["hygiene"] == 1
    assert "Archived 2 entries" not in client.get(back).content.decode()  # shown once


def test_a_next_outside_the_workspace_console_is_ignored(client, workspace, now):
    login(client, workspace)
    a = junk(workspace, now)[0]
    for bad in ("https://evil.example/", "/console/globex/review/", "//evil.example/x"):
        response = client.post(
            "/console/acme/review/hygiene/", {"action": "keep", "ids": [a.pk], "next": bad}
        )
        assert response["Location"] == "/console/acme/review/?tab=hygiene"


def test_bad_hygiene_requests_are_refused_with_a_notice(client, workspace, now):
    login(client, workspace)
    a = junk(workspace, now)[0]

    response = client.post("/console/acme/review/hygiene/", {"action": "delete", "ids": [a.pk]}, **HX)
    assert response.status_code == 422
    assert response["HX-Reswap"] == "none" and response["X-Console-Notice"] == "1"
    assert "Action: must be archive or keep" in response.content.decode()

    response = client.post("/console/acme/review/hygiene/", {"action": "archive"}, **HX)
    assert response.status_code == 422
    assert "Select at least one entry" in response.content.decode()

    response = client.post("/console/acme/review/hygiene/", {"action": "archive"}, follow=True)
    assert response.redirect_chain == [("/console/acme/review/?tab=hygiene", 303)]
    assert "Select at least one entry" in response.content.decode()

    huge = "9" * 30
    response = client.post(
        "/console/acme/review/hygiene/", {"action": "archive", "ids": [huge, "x", a.pk]}, **HX
    )
    assert response.status_code == 200
    assert "Archived 1 entry" in response.content.decode() and "Skipped 2" in response.content.decode()


# --- reverts ------------------------------------------------------------------------------------


def test_reverting_one_automatic_change(client, workspace, now):
    login(client, workspace)
    a, b = cold(workspace, now, 2)
    run_maintenance(workspace=workspace, now=now)

    response = client.post("/console/acme/review/revert/", {"ids": [a.pk]}, **HX)

    html = response.content.decode()
    assert "<html" not in html
    assert f'<tr id="auto-row-{a.pk}" hx-swap-oob="delete"></tr>' in html
    assert counts(html) == {"hygiene": 0, "automatic": 1, "tombstones": 1, "disputes": 0, "pending": 0}
    assert status(a) == "active" and status(b) == "tombstoned"
    assert LifecycleEvent.objects.get(entry=a, reason="revert").actor == "user:olga"


def test_reverting_a_selection_without_javascript(client, workspace, now):
    login(client, workspace)
    a, b, c = cold(workspace, now, 3)
    run_maintenance(workspace=workspace, now=now)

    response = client.post("/console/acme/review/revert/", {"ids": [a.pk, c.pk]}, follow=True)

    assert response.redirect_chain == [("/console/acme/review/?tab=automatic", 303)]
    assert f"Reverted 2 entries (#{a.pk}, #{c.pk})." in response.content.decode()
    assert [status(e) for e in (a, b, c)] == ["active", "tombstoned", "active"]


def test_reverting_a_whole_run_from_the_review_queue(client, workspace, now):
    login(client, workspace)
    tombstoned = cold(workspace, now, 2)
    archived = stale(workspace, now)
    run_id = run_maintenance(workspace=workspace, now=now)["run_id"]

    response = client.post(f"/console/acme/runs/{run_id}/revert/", {"origin": "review"}, **HX)

    html = response.content.decode()
    assert f'<tbody id="auto-run-{run_id}" hx-swap-oob="delete"></tbody>' in html
    assert f"Run #{run_id} reverted: 3 entries" in html
    assert counts(html)["automatic"] == 0
    assert [status(e) for e in tombstoned] == ["active", "active"]
    assert status(archived) == "stale"


def test_reverting_a_run_from_its_page_redraws_the_run(client, workspace, now):
    login(client, workspace)
    a, b = stale(workspace, now), stale(workspace, now)
    link, _ = relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=b.pk, now=now)
    run_id = run_maintenance(workspace=workspace, now=now)["run_id"]
    assert [status(a), status(b)] == ["archived", "archived"]
    assert Relationship.objects.get(pk=link.pk).pruned_at is not None

    response = client.post(f"/console/acme/runs/{run_id}/revert/", {"origin": "run"}, **HX)

    html = response.content.decode()
    assert "<html" not in html
    assert html.lstrip().startswith('<section id="run"')
    assert f"Run #{run_id} reverted: 2 entries" in html and "Links restored: 1." in html
    assert "now stale" in html
    assert ">0 automatic changes</a> of this run a revert would still undo; 2 already reverted" in html
    assert "Revert this run" not in html  # nothing left for it to do
    assert [status(a), status(b)] == ["stale", "stale"]
    assert Relationship.objects.get(pk=link.pk).pruned_at is None

    # again, without JavaScript: nothing left to revert, and the page says so
    response = client.post(f"/console/acme/runs/{run_id}/revert/", follow=True)
    assert response.redirect_chain == [(f"/console/acme/runs/{run_id}/", 303)]
    assert f"Run #{run_id} reverted: 0 entries." in response.content.decode()


# --- tombstones ---------------------------------------------------------------------------------


def test_restoring_tombstones(client, workspace, now):
    login(client, workspace)
    a, b, c = (good(workspace, now) for _ in range(3))
    for e in (a, b, c):
        entry_changes.entry_tombstone(workspace=workspace, entry_id=e.pk)

    response = client.post("/console/acme/review/restore/", {"ids": [a.pk]}, **HX)
    html = response.content.decode()
    assert f'<tr id="tomb-row-{a.pk}" hx-swap-oob="delete"></tr>' in html
    assert counts(html)["tombstones"] == 2
    assert status(a) == "active"
    assert Tombstone.objects.get(entry=a).restored_at is not None

    response = client.post("/console/acme/review/restore/", {"ids": [b.pk, c.pk, a.pk]}, follow=True)
    page = response.content.decode()
    assert f"Restored 2 entries (#{b.pk}, #{c.pk}). Skipped 1 (#{a.pk}): no open tombstone." in page
    assert [status(b), status(c)] == ["active", "active"]


def test_restore_does_not_touch_entries_without_a_tombstone(client, workspace, now):
    login(client, workspace)
    archived = good(workspace, now)
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual"
    )

    client.post("/console/acme/review/restore/", {"ids": [archived.pk]}, **HX)

    assert status(archived) == "archived"


# --- disputes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("post", "expect_a", "expect_b", "supersedes"),
    [
        ({"resolution": "keep_both"}, "active", "active", None),
        ({"resolution": "keep_first"}, "active", "archived", None),
        ({"resolution": "keep_second"}, "archived", "active", None),
        ({"resolution": "supersede", "winner": "a"}, "active", "archived", "a"),
        ({"resolution": "supersede", "winner": "b"}, "archived", "active", "b"),
    ],
)
def test_resolving_a_dispute_each_way(client, workspace, now, post, expect_a, expect_b, supersedes):
    login(client, workspace)
    d = dispute(workspace, now)
    data = {"resolution": post["resolution"]}
    if "winner" in post:
        data["winner_id"] = d.entry_a_id if post["winner"] == "a" else d.entry_b_id

    response = client.post(f"/console/acme/disputes/{d.pk}/resolve/", data, **HX)

    html = response.content.decode()
    assert response.status_code == 200
    assert f'<article id="dispute-{d.pk}" hx-swap-oob="delete"></article>' in html
    assert counts(html)["disputes"] == 0
    d.refresh_from_db()
    assert (d.status, d.resolution, d.resolved_by) == ("resolved", post["resolution"], "user:olga")
    assert Entry.objects.get(pk=d.entry_a_id).status == expect_a
    assert Entry.objects.get(pk=d.entry_b_id).status == expect_b
    links = Relationship.objects.filter(type="supersedes")
    if supersedes is None:
        assert not links.exists()
    else:
        winner, loser = (d.entry_a_id, d.entry_b_id) if supersedes == "a" else (d.entry_b_id, d.entry_a_id)
        assert list(links.values_list("from_entry_id", "to_entry_id")) == [(winner, loser)]


def test_a_dispute_resolved_twice_or_badly_is_refused(client, workspace, now):
    login(client, workspace)
    d = dispute(workspace, now)
    url = f"/console/acme/disputes/{d.pk}/resolve/"

    bad = client.post(url, {"resolution": "merge"}, **HX)
    assert bad.status_code == 422 and bad["X-Console-Notice"] == "1"
    outsider = client.post(url, {"resolution": "supersede", "winner_id": "12345"}, **HX)
    assert outsider.status_code == 422
    assert client.post(url, {"resolution": "keep_both"}).status_code == 303
    again = client.post(url, {"resolution": "keep_first"}, **HX)
    assert again.status_code == 409
    assert "already resolved" in again.content.decode()
    plain = client.post(url, {"resolution": "keep_first"}, follow=True)
    assert "already resolved" in plain.content.decode()
    d.refresh_from_db()
    assert d.resolution == "keep_both"
    assert (
        client.post("/console/acme/disputes/999999/resolve/", {"resolution": "keep_both"}).status_code == 404
    )


def test_resolved_disputes_can_be_listed_without_controls(client, workspace, now):
    login(client, workspace)
    d = dispute(workspace, now)
    client.post(f"/console/acme/disputes/{d.pk}/resolve/", {"resolution": "keep_both"})

    assert f'id="dispute-{d.pk}"' not in review(client, "disputes")
    html = review(client, "disputes", status="resolved")
    card = html[html.index(f'id="dispute-{d.pk}"') :]
    assert "resolved: Keep Both by user:olga" in card
    assert "Keep A, archive B" not in card


# --- roles, isolation, CSRF ---------------------------------------------------------------------


def test_a_viewer_sees_everything_but_no_action_controls(client, workspace, now):
    login(client, workspace, role="viewer", username="vera")
    entry = junk(workspace, now)[0]
    cold(workspace, now)
    run_id = run_maintenance(workspace=workspace, now=now)["run_id"]
    dispute(workspace, now)

    for tab in ("hygiene", "automatic", "tombstones", "disputes"):
        html = review(client, tab)
        assert 'method="post" action="/console/acme/' not in html
        assert 'type="checkbox"' not in html
    assert f'id="hygiene-row-{entry.pk}"' in review(client, "hygiene")
    run_page = client.get(f"/console/acme/runs/{run_id}/").content.decode()
    assert "Revert this run" not in run_page and "of this run a revert would still undo" in run_page


def test_a_viewer_s_post_to_any_action_is_forbidden_and_changes_nothing(client, workspace, now):
    login(client, workspace, role="viewer", username="vera")
    candidate = junk(workspace, now)[0]
    tombstoned = cold(workspace, now)[0]
    run_id = run_maintenance(workspace=workspace, now=now)["run_id"]
    d = dispute(workspace, now)
    events = LifecycleEvent.objects.count()

    posts = [
        ("/console/acme/review/hygiene/", {"action": "archive", "ids": [candidate.pk]}),
        ("/console/acme/review/hygiene/", {"action": "keep", "ids": [candidate.pk]}),
        ("/console/acme/review/revert/", {"ids": [tombstoned.pk]}),
        ("/console/acme/review/restore/", {"ids": [tombstoned.pk]}),
        (f"/console/acme/disputes/{d.pk}/resolve/", {"resolution": "keep_first"}),
        (f"/console/acme/runs/{run_id}/revert/", {"origin": "run"}),
    ]
    for url, data in posts:
        assert client.post(url, data).status_code == 403, url
        assert client.post(url, data, **HX).status_code == 403, url

    assert status(candidate) == "active"
    assert Entry.objects.get(pk=candidate.pk).review_kept_hash == ""
    assert status(tombstoned) == "tombstoned"
    assert Dispute.objects.get(pk=d.pk).status == "open"
    assert LifecycleEvent.objects.count() == events


def test_pages_need_a_login_and_membership(client, workspace, other_workspace):
    assert client.get("/console/acme/review/")["Location"].startswith("/accounts/login/")
    login(client, other_workspace)
    for url in ("/console/acme/review/", "/console/acme/runs/", "/console/acme/review/?tab=disputes"):
        assert client.get(url).status_code == 404
    assert client.post("/console/acme/review/hygiene/", {"action": "archive", "ids": [1]}).status_code == 404


def test_another_workspace_s_rows_are_never_touched(client, workspace, other_workspace, now):
    login(client, workspace)
    theirs_junk = junk(other_workspace, now)[0]
    theirs_cold = cold(other_workspace, now)[0]
    their_run = run_maintenance(workspace=other_workspace, now=now)["run_id"]
    theirs_tomb = good(other_workspace, now)
    entry_changes.entry_tombstone(workspace=other_workspace, entry_id=theirs_tomb.pk)
    their_dispute = dispute(other_workspace, now)
    their_events = LifecycleEvent.objects.filter(workspace=other_workspace).count()

    for action in ("archive", "keep"):
        response = client.post(
            "/console/acme/review/hygiene/", {"action": action, "ids": [theirs_junk.pk]}, **HX
        )
        assert response.status_code == 200 and "Skipped 1" in response.content.decode()
    response = client.post("/console/acme/review/revert/", {"ids": [theirs_cold.pk]}, **HX)
    assert "Reverted 0 entries. Skipped 1" in response.content.decode()
    response = client.post("/console/acme/review/restore/", {"ids": [theirs_tomb.pk]}, **HX)
    assert "Restored 0 entries. Skipped 1" in response.content.decode()
    assert (
        client.post(
            f"/console/acme/disputes/{their_dispute.pk}/resolve/", {"resolution": "keep_first"}
        ).status_code
        == 404
    )
    assert client.post(f"/console/acme/runs/{their_run}/revert/").status_code == 404
    assert client.post(f"/console/acme/runs/{their_run}/revert/", **HX).status_code == 404
    assert client.get(f"/console/acme/runs/{their_run}/").status_code == 404

    assert status(theirs_junk) == "active"
    assert Entry.objects.get(pk=theirs_junk.pk).review_kept_hash == ""
    assert status(theirs_cold) == "tombstoned"
    assert status(theirs_tomb) == "tombstoned"
    assert Dispute.objects.get(pk=their_dispute.pk).status == "open"
    assert LifecycleEvent.objects.filter(workspace=other_workspace).count() == their_events
    # and nothing of theirs shows on our pages
    for tab in ("hygiene", "automatic", "tombstones", "disputes"):
        assert counts(review(client, tab)) == {
            "hygiene": 0,
            "automatic": 0,
            "tombstones": 0,
            "disputes": 0,
            "pending": 0,
        }
    assert f"/runs/{their_run}/" not in client.get("/console/acme/runs/").content.decode()


def test_csrf_is_enforced_on_actions(workspace, now):
    client = Client(enforce_csrf_checks=True)
    login(client, workspace)
    entry = junk(workspace, now)[0]
    url = "/console/acme/review/hygiene/"

    assert client.post(url, {"action": "archive", "ids": [entry.pk]}).status_code == 403
    assert client.post(url, {"action": "archive", "ids": [entry.pk]}, **HX).status_code == 403
    assert status(entry) == "active"

    page = client.get("/console/acme/review/").content.decode()
    token = client.cookies["csrftoken"].value
    # htmx sends the token from <body hx-headers>; a plain form carries it as a field.
    assert '"X-CSRFToken": "' in page and 'name="csrfmiddlewaretoken"' in page
    response = client.post(url, {"action": "archive", "ids": [entry.pk]}, HTTP_X_CSRFTOKEN=token, **HX)
    assert response.status_code == 200
    assert status(entry) == "archived"


# --- pagination ---------------------------------------------------------------------------------


def test_lists_are_paginated_and_keep_their_filters(client, workspace, now):
    login(client, workspace)
    junk(workspace, now, 30)

    first = review(client, "hygiene", recommendation="archive")
    second = review(client, "hygiene", recommendation="archive", page=2)

    assert first.count('class="queue-row rec-archive"') == 25
    assert second.count('class="queue-row rec-archive"') == 5
    assert "Page 1 of 2" in first
    assert 'href="?tab=hygiene&amp;recommendation=archive&amp;page=2"' in first
    assert 'rel="prev" href="?tab=hygiene&amp;recommendation=archive&amp;page=1"' in second
    assert review(client, "hygiene", recommendation="review").count("queue-row") == 0
    assert review(client, "hygiene", page="abc").count("queue-row") == 25  # a bad page is the first
    assert review(client, "hygiene", page=99).count("queue-row") == 5  # past the end is the last
    for odd in ("%C2%B2", "0", "-1", "1" * 5000):  # "²" is a digit to Python, not a number
        assert review(client, "hygiene", page=odd).count("queue-row") in (25, 5), odd


def test_the_runs_list_filters_and_pages(client, workspace, now):
    login(client, workspace)
    for i in range(30):
        MaintenanceRun.objects.create(
            workspace=workspace, kind="decay" if i % 3 else "full", trigger="schedule"
        )
    MaintenanceRun.objects.create(
        workspace=workspace, kind="full", trigger="cli", status="failed", error="boom"
    )

    html = client.get("/console/acme/runs/").content.decode()
    assert html.count('id="run-row-') == 25 and "Page 1 of 2" in html
    failed = client.get("/console/acme/runs/?status=failed").content.decode()
    assert failed.count('id="run-row-') == 1 and "1 run matching the filters" in failed
    assert client.get("/console/acme/runs/?kind=full").content.decode().count('id="run-row-') == 11
    fragment = client.get("/console/acme/runs/?kind=full", **HX).content.decode()
    assert "<html" not in fragment and fragment.lstrip().startswith('<section id="runs"')


# --- the run page -------------------------------------------------------------------------------


def test_the_run_page_shows_everything_about_the_run(client, workspace, now):
    login(client, workspace)
    tombstoned = cold(workspace, now, 2)
    archived = stale(workspace, now)
    result = run_maintenance(workspace=workspace, now=now)
    run = MaintenanceRun.objects.get(pk=result["run_id"])

    html = client.get(f"/console/acme/runs/{run.pk}/").content.decode()

    # Every count in words, the API's key in the title.
    for key in COUNT_KEYS:
        n = result["counts"][key]
        n = sum(n.values()) if isinstance(n, dict) else n  # reclaimed_rows: its total
        words = re.escape(count_label(key))
        assert re.search(rf'<th scope="row" title="{key}">{words}</th><td class="num">{n}</td>', html), key
    assert result["backup_file"] and f"<code>{result['backup_file']}</code>" in html
    assert '<th scope="row">tombstone_grace_days</th><td><code>180</code></td>' in html
    assert "<dt>Trigger</dt><dd>cli</dd>" in html
    for e in [*tombstoned, archived]:
        assert f'href="/console/acme/entries/{e.pk}/">#{e.pk} ' in html
    tomb_section = html[html.index('id="affected-tombstoned"') : html.index('id="affected-purged"')]
    assert all(f"#{e.pk} " in tomb_section for e in tombstoned)
    assert "now tombstoned" in tomb_section
    assert "Revert this run" in html
    assert f'action="/console/acme/runs/{run.pk}/revert/"' in html


def test_a_dry_run_or_a_run_that_changed_nothing_offers_no_revert(client, workspace, now):
    login(client, workspace)
    cold(workspace, now)
    dry = run_maintenance(workspace=workspace, now=now, dry_run=True)["run_id"]
    html = client.get(f"/console/acme/runs/{dry}/").content.decode()
    assert "Revert this run" not in html and "a dry run changes nothing" in html
    assert 'class="badge">dry run<' in html


def test_purged_entries_are_listed_without_a_link(client, workspace, now):
    login(client, workspace)
    MaintenancePolicy.objects.filter(workspace=workspace).update(tombstone_grace_days=0)
    gone = cold(workspace, now)[0]
    run_id = run_maintenance(workspace=workspace, now=now)["run_id"]

    html = client.get(f"/console/acme/runs/{run_id}/").content.decode()

    purged = html[html.index('id="affected-purged"') :]
    assert f'#{gone.pk} <span class="badge">purged</span>' in purged
    assert f'href="/console/acme/entries/{gone.pk}/"' not in html


def test_affected_entries_are_paged(client, workspace, now):
    login(client, workspace)
    # A real run's entries are its events (its row keeps only the first few ids).
    run = MaintenanceRun.objects.create(
        workspace=workspace,
        kind="full",
        trigger="cli",
        status="succeeded",
        affected={"archived": [1, 2], "tombstoned": [], "purged": []},
    )
    LifecycleEvent.objects.bulk_create(
        LifecycleEvent(
            workspace=workspace,
            entry_ref=i,
            from_status="stale",
            to_status="archived",
            reason="archive",
            run=run,
            automatic=True,
        )
        for i in range(120, 0, -1)
    )
    html = client.get(f"/console/acme/runs/{run.pk}/").content.decode()
    assert "1–50 of 120" in html and 'href="?archived_page=2"' in html
    assert "#1 " in html and "#50 " in html and "#51 " not in html  # in id order
    last = client.get(f"/console/acme/runs/{run.pk}/?archived_page=3").content.decode()
    assert "101–120 of 120" in last and "#120 " in last


def test_a_dry_runs_affected_entries_are_the_ones_its_record_keeps(client, workspace, now):
    login(client, workspace)
    run = MaintenanceRun.objects.create(
        workspace=workspace,
        kind="full",
        trigger="cli",
        status="succeeded",
        dry_run=True,
        affected={"archived": list(range(1, 61)), "tombstoned": [], "purged": []},
        affected_total={"archived": 900, "tombstoned": 0, "purged": 0},
    )
    html = client.get(f"/console/acme/runs/{run.pk}/").content.decode()
    assert '<span class="count">900</span>' in html
    assert "A dry run records the first 60 of them" in html
    assert "1–50 of 60" in html


def test_an_unknown_run_is_not_found(client, workspace):
    login(client, workspace)
    assert client.get("/console/acme/runs/424242/").status_code == 404
    assert client.post("/console/acme/runs/424242/revert/").status_code == 404


# --- query counts -------------------------------------------------------------------------------


def test_every_tab_takes_the_same_number_of_queries_for_3_or_30_rows(client, workspace, now):
    login(client, workspace)
    tabs = ("hygiene", "automatic", "tombstones", "disputes")

    def fill(n: int, when) -> None:
        junk(workspace, now, n)
        cold(workspace, when, n)
        run_maintenance(workspace=workspace, now=when)
        for _ in range(n):
            dispute(workspace, now)

    fill(3, now)
    # The first visit after new entries assesses them and stores the verdicts (two queries
    # more, however many); the counts compare the visits after it.
    assert counts(review(client, "hygiene")) == {
        "hygiene": 3,
        "automatic": 3,
        "tombstones": 3,
        "disputes": 3,
        "pending": 0,
    }
    few = {tab: queries(client, f"/console/acme/review/?tab={tab}") for tab in tabs}
    fill(27, now + timedelta(hours=1))
    assert counts(review(client, "hygiene")) == {
        "hygiene": 30,
        "automatic": 30,
        "tombstones": 30,
        "disputes": 30,
        "pending": 0,
    }
    many = {tab: queries(client, f"/console/acme/review/?tab={tab}") for tab in tabs}

    assert few == many
    # 4 session and membership, 4 hygiene scan, 1 live counts, 1 pending approval count, and on
    # the automatic and tombstones tabs 1 policy read (how long an operator hold lasts).
    assert max(many.values()) <= 15, many


def test_the_run_pages_take_the_same_number_of_queries_for_3_or_30_rows(client, workspace, now):
    login(client, workspace)
    cold(workspace, now, 3)
    small = run_maintenance(workspace=workspace, now=now)["run_id"]
    cold(workspace, now, 30)
    # Forced past the circuit breaker: both runs changed entries (their pages list events).
    large = run_maintenance(workspace=workspace, now=now + timedelta(hours=1), force=True)["run_id"]
    assert MaintenanceRun.objects.get(pk=large).counts["evicted"] == 30
    assert LifecycleEvent.objects.filter(run_id=large).count() == 30

    small_run = queries(client, f"/console/acme/runs/{small}/")
    assert small_run == queries(client, f"/console/acme/runs/{large}/")
    # 4 session and membership, the run, reverts with the counts by action, the page of
    # tombstoned entries (its events), titles, live counts, and the changes a revert would
    # still undo (the Automatic changes tab's count for the run).
    assert small_run <= 10

    few = queries(client, "/console/acme/runs/")
    for _ in range(28):
        MaintenanceRun.objects.create(workspace=workspace, kind="decay", trigger="schedule")
    assert queries(client, "/console/acme/runs/") == few <= 8  # … and the folded runs' totals
    # The per-day counts of folded runs: one query more for a page of them, however many days.
    for day in range(3):
        RunDaySummary.objects.create(
            workspace=workspace, day=date(2026, 11, 1 + day), kind="decay", status="succeeded", runs=9
        )
    with_days = queries(client, "/console/acme/runs/")
    for day in range(3, 30):
        RunDaySummary.objects.create(
            workspace=workspace, day=date(2026, 10, 1 + day), kind="decay", status="succeeded", runs=9
        )
    assert queries(client, "/console/acme/runs/") == with_days == few + 1
