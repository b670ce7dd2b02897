"""The console's Pending approval tab and operator holds on pages: the open
proposal set by reason with the deciding values, approve / reject one, a selection, a reason or
all — with htmx (only the changed rows and counts) and without JavaScript (303 and a message) —,
the circuit breaker's force, viewers who see but cannot act, Release on the entry page and on
queue rows, the dashboard's "N changes await approval", a proposed run's page, and one number
for "automatic changes" in the header and the tab."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from console import live
from maintenance.models import Proposal, ProposalStatus
from maintenance.run_start import run_maintenance
from memory import accounts, entry_changes, holds, new_entries
from memory.models import Entry, LifecycleEvent, Workspace
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db

User = get_user_model()
HX = {"HTTP_HX_REQUEST": "true"}
TEXT = "The connection pool keeps twelve sockets open between deploys and retries handshakes {}."


def login(client: Client, workspace: Workspace, role: str = "operator") -> Any:
    user, _ = User.objects.get_or_create(username=f"olga-{role}")
    accounts.membership_set(workspace=workspace, user=user, role=role)
    client.force_login(user)
    return user


def cold(workspace: Workspace, now, n: int = 1) -> list[Entry]:
    """Entries a full run tombstones by decay (retention below the cold threshold)."""
    return [
        new_entries.entry_create(
            workspace=workspace,
            content=TEXT.format(Entry.objects.count()),
            created_at=now - timedelta(days=100),
            now=now,
        )
        for _ in range(n)
    ]


def stale(workspace: Workspace, now) -> Entry:
    """An entry a full run archives (stale for longer than archive_after_days)."""
    entry = new_entries.entry_create(
        workspace=workspace,
        content=TEXT.format(Entry.objects.count()),
        title="Stale runbook",
        created_at=now - timedelta(days=500),
        now=now - timedelta(days=500),
    )
    Entry.objects.filter(pk=entry.pk).update(status="stale", status_changed_at=now - timedelta(days=200))
    return entry


def proposed(workspace: Workspace, now, n_cold: int = 3) -> tuple[list[Entry], Entry, int]:
    doomed = cold(workspace, now, n_cold)
    archived = stale(workspace, now)
    result = run_maintenance(workspace=workspace, now=now)
    assert result["status"] == "proposed"
    return doomed, archived, result["run_id"]


def url(workspace: Workspace, path: str = "review/") -> str:
    return f"/console/{workspace.slug}/{path}"


def html(response: Any) -> str:
    return response.content.decode()


def counts(page: str) -> dict[str, int]:
    return {tab: int(n) for tab, n in re.findall(r'id="review-count-(\w+)">(\d+)<', page)}


def status(entry: Entry) -> str:
    return Entry.objects.get(pk=entry.pk).status


def open_refs(workspace: Workspace) -> set[int]:
    return set(
        Proposal.objects.filter(workspace=workspace, status=ProposalStatus.OPEN).values_list(
            "entry_ref", flat=True
        )
    )


# --- the tab ------------------------------------------------------------------------------------


def test_the_pending_tab_comes_first_and_is_the_default_while_proposals_are_open(
    client, propose_workspace, now
):
    doomed, _, run_id = proposed(propose_workspace, now)
    login(client, propose_workspace, "viewer")

    page = html(client.get(url(propose_workspace)))

    assert 'data-tab="pending"' in page
    assert next(iter(counts(page))) == "pending"
    assert counts(page)["pending"] == 4
    # Grouped by reason in run order (archive before decay), each with its count.
    assert page.index('id="pending-group-archived"') < page.index('id="pending-group-evicted"')
    assert re.search(r'id="pending-count-evicted" class="count">3<', page)
    assert re.search(r'id="pending-count-archived" class="count">1<', page)
    # Each group in words; the API's name of the reason only in the label's title.
    assert 'class="group-label" title="evicted">Decayed: retention below the cold threshold</span>' in page
    assert '<code class="meta">evicted</code>' not in page
    assert "4 changes await approval" in page
    for entry in doomed:
        row = page[page.index(f'id="pending-row-{entry.pk}"') :].split("</tr>", 1)[0]
        assert f'href="/console/{propose_workspace.slug}/entries/{entry.pk}/"' in row
        assert re.search(r"retention 0\.\d\d &lt; 0\.20, never accessed, 100 days old", row)
        assert f'as of <time datetime="{now.isoformat()}">{now:%Y-%m-%d}</time>' in row
        assert "tombstone" in row and f"run #{run_id}" in row
        assert "The connection pool keeps" in row  # no title: the first line names it
    assert "Stale runbook" in page and "stale for 200 days" in page
    # A viewer sees, but has nothing to press.
    panel = page.split('id="pending-panel"', 1)[1]
    assert "<button" not in panel.split("</table>")[0].split("</form>", 1)[1]  # past the filter form
    assert 'name="ids"' not in page and "review/approve/" not in page


def test_with_nothing_proposed_the_pending_tab_goes_last_and_hygiene_is_the_default(client, workspace):
    login(client, workspace)

    page = html(client.get(url(workspace)))

    assert 'data-tab="hygiene"' in page
    assert list(counts(page)) == ["hygiene", "automatic", "tombstones", "disputes", "pending"]
    empty = html(client.get(url(workspace) + "?tab=pending"))
    assert "No changes await approval." in empty
    assert 'id="pending-bulk"' not in empty


def test_the_reason_filter_lists_one_group(client, propose_workspace, now):
    doomed, archived, _ = proposed(propose_workspace, now)
    login(client, propose_workspace)

    page = html(client.get(url(propose_workspace) + "?tab=pending&reason=archived"))

    assert f'id="pending-row-{archived.pk}"' in page
    assert not any(f'id="pending-row-{e.pk}"' in page for e in doomed)
    # The summary counts every open proposal, and says how many the filter lists.
    assert "4 changes await approval" in page and "1 of them matches the filter." in page
    unfiltered = html(client.get(url(propose_workspace) + "?tab=pending"))
    assert "match the filter" not in unfiltered and "matches the filter" not in unfiltered


def test_the_pending_tab_takes_the_same_queries_for_3_or_30_proposals(
    client, propose_workspace, now, django_assert_num_queries
):
    login(client, propose_workspace)
    cold(propose_workspace, now, 3)
    run_maintenance(workspace=propose_workspace, now=now)
    client.get(url(propose_workspace) + "?tab=pending")  # warm the session
    # session, user, workspace, membership; groups; count + rows of the page; the other tab
    # counts (automatic, tombstones, disputes: one capped statement; the hygiene count: the
    # policy, whether its kept rank has marks to fold, and one capped statement counting the
    # assessed candidates and the entries without a stored verdict); the
    # header's live counts; the cold threshold the note on retention quotes (decay proposals).
    with django_assert_num_queries(13) as few:
        assert client.get(url(propose_workspace) + "?tab=pending").status_code == 200
    queries = len(few.captured_queries)  # (a request resets the log it reads)
    cold(propose_workspace, now, 27)
    run_maintenance(workspace=propose_workspace, now=now + timedelta(hours=1))
    assert len(open_refs(propose_workspace)) == 30
    # The first visit after new entries stores their hygiene verdicts (once, not per visit).
    client.get(url(propose_workspace) + "?tab=pending")
    with django_assert_num_queries(queries):
        page = html(client.get(url(propose_workspace) + "?tab=pending"))
    assert page.count('class="queue-row pending-row"') == 25  # paginated
    assert "Page 1 of 2" in page


# --- approve and reject -----------------------------------------------------------------------------


def test_approving_one_without_javascript_redirects_with_a_message(client, propose_workspace, now):
    doomed, archived, run_id = proposed(propose_workspace, now)
    user = login(client, propose_workspace)

    response = client.post(url(propose_workspace, "review/approve/"), {"ids": [doomed[0].pk]})

    assert response.status_code == 303
    assert response["Location"] == url(propose_workspace) + "?tab=pending"
    assert status(doomed[0]) == "tombstoned"
    assert all(status(e) == "active" for e in doomed[1:]) and status(archived) == "stale"
    assert open_refs(propose_workspace) == {e.pk for e in doomed[1:]} | {archived.pk}
    event = LifecycleEvent.objects.filter(entry_id=doomed[0].pk, to_status="tombstoned").get()
    assert (event.actor, event.run_id) == (f"user:{user.username}", run_id)
    page = html(client.get(response["Location"]))
    assert f"Approved 1 change (#{doomed[0].pk})." in page
    # The approval is no run: the notice names the backup it wrote before the tombstone.
    backup = re.search(r"A pre-prune backup was written first: (pre-prune-backup-\S+\.jsonl\.gz)\.", page)
    assert backup is not None, page
    assert f'id="pending-row-{doomed[0].pk}"' not in page


def test_approving_a_selection_with_htmx_swaps_only_those_rows_and_the_counts(client, propose_workspace, now):
    doomed, archived, _ = proposed(propose_workspace, now)
    login(client, propose_workspace)
    chosen = [doomed[0].pk, doomed[1].pk]

    response = client.post(url(propose_workspace, "review/approve/"), {"ids": chosen}, **HX)

    assert response.status_code == 200
    body = html(response)
    assert "<html" not in body and 'id="pending-panel"' not in body  # no page, no panel: only changes
    for pk in chosen:
        assert f'<tr id="pending-row-{pk}" hx-swap-oob="delete"></tr>' in body
    assert f'pending-row-{doomed[2].pk}"' not in body
    assert '<span id="pending-count-evicted" class="count" hx-swap-oob="true">1</span>' in body
    assert '<span id="pending-count-archived" class="count" hx-swap-oob="true">1</span>' in body
    assert 'data-open="2"' in body  # the summary, for the live refresh to compare
    assert counts(body)["pending"] == 2
    assert "Approved 2 changes" in body
    assert [status(e) for e in doomed] == ["tombstoned", "tombstoned", "active"]
    assert open_refs(propose_workspace) == {doomed[2].pk, archived.pk}


def test_approving_a_reason_group_removes_the_group(client, propose_workspace, now):
    doomed, archived, _ = proposed(propose_workspace, now)
    login(client, propose_workspace)

    body = html(
        client.post(url(propose_workspace, "review/approve/"), {"scope": "all", "reason": "evicted"}, **HX)
    )

    # In a <template>: a bare <tbody> in a fragment is dropped by the HTML parser.
    assert '<template><tbody id="pending-group-evicted" hx-swap-oob="delete"></tbody></template>' in body
    assert 'pending-group-archived" hx-swap-oob="delete"' not in body
    assert all(status(e) == "tombstoned" for e in doomed)
    assert status(archived) == "stale"
    assert open_refs(propose_workspace) == {archived.pk}


def test_approving_all_empties_the_tab(client, propose_workspace, now):
    doomed, archived, _ = proposed(propose_workspace, now)
    login(client, propose_workspace)

    body = html(client.post(url(propose_workspace, "review/approve/"), {"scope": "all"}, **HX))

    assert "No changes await approval." in body
    assert '<div id="pending-bulk" hx-swap-oob="delete"></div>' in body
    assert status(archived) == "archived" and all(status(e) == "tombstoned" for e in doomed)
    assert open_refs(propose_workspace) == set()


def test_an_approval_that_no_longer_holds_is_reported_skipped_and_leaves_the_queue(
    client, propose_workspace, now
):
    doomed, _, _ = proposed(propose_workspace, now)
    entry_changes.entry_set_pinned(workspace=propose_workspace, entry_id=doomed[0].pk, pinned=True)
    login(client, propose_workspace)

    body = html(client.post(url(propose_workspace, "review/approve/"), {"ids": [doomed[0].pk]}, **HX))

    assert f"Skipped 1: #{doomed[0].pk} pinned since it was proposed" in body
    assert f'<tr id="pending-row-{doomed[0].pk}" hx-swap-oob="delete"></tr>' in body
    assert status(doomed[0]) == "active"


def test_rejecting_holds_the_entries_and_the_entry_page_offers_release(client, propose_workspace, now):
    doomed, archived, _ = proposed(propose_workspace, now)
    user = login(client, propose_workspace)

    body = html(client.post(url(propose_workspace, "review/reject/"), {"ids": [doomed[0].pk]}, **HX))
    plain = client.post(url(propose_workspace, "review/reject/"), {"scope": "all", "reason": "archived"})

    assert f'<tr id="pending-row-{doomed[0].pk}" hx-swap-oob="delete"></tr>' in body
    assert f"Rejected 1 change (#{doomed[0].pk}); the entry is held: automation leaves it alone" in body
    assert plain.status_code == 303
    assert open_refs(propose_workspace) == {e.pk for e in doomed[1:]}
    held = Entry.objects.get(pk=doomed[0].pk)
    assert (held.status, held.hold_reason, held.held_by) == ("active", "reject", f"user:{user.username}")
    assert Entry.objects.get(pk=archived.pk).hold_reason == "reject"

    entry_page = html(client.get(url(propose_workspace, f"entries/{held.pk}/")))
    assert f"Held by <strong>user:{user.username}</strong>" in entry_page and "(reject)" in entry_page
    assert 'class="badge held">held<' in entry_page
    # The history reads the hold as a hold, not as a status change.
    assert "operator hold: reject" in entry_page
    assert "active → active" not in entry_page

    response = client.post(url(propose_workspace, f"entries/{held.pk}/release/"))
    assert response.status_code == 303
    assert Entry.objects.get(pk=held.pk).held_at is None
    after = html(client.get(url(propose_workspace, f"entries/{held.pk}/")))
    assert "Held by" not in after
    assert "hold released (was: reject, by user:" in after


def test_viewers_cannot_approve_reject_or_release(client, propose_workspace, now):
    doomed, _, _ = proposed(propose_workspace, now)
    holds.hold(propose_workspace, [doomed[1].pk], reason="keep", actor="user:x", now=now)
    login(client, propose_workspace, "viewer")

    for path, data in (
        ("review/approve/", {"ids": [doomed[0].pk]}),
        ("review/approve/", {"scope": "all"}),
        ("review/reject/", {"scope": "all"}),
        ("review/release/", {"ids": [doomed[1].pk]}),
        (f"entries/{doomed[1].pk}/release/", {}),
    ):
        assert client.post(url(propose_workspace, path), data).status_code == 403
        assert client.post(url(propose_workspace, path), data, **HX).status_code == 403
    assert status(doomed[0]) == "active"
    assert len(open_refs(propose_workspace)) == 4
    assert Entry.objects.get(pk=doomed[1].pk).held_at is not None
    page = html(client.get(url(propose_workspace, f"entries/{doomed[1].pk}/")))
    assert "Held by" in page and "/release/" not in page


def test_a_bad_request_is_a_message_not_an_error(client, propose_workspace, now):
    proposed(propose_workspace, now)
    login(client, propose_workspace)

    nothing = client.post(url(propose_workspace, "review/approve/"), {}, **HX)
    bad_reason = client.post(url(propose_workspace, "review/approve/"), {"scope": "all", "reason": "nope"})

    # The API's message, as a sentence.
    assert nothing.status_code == 422 and "Select at least one entry" in html(nothing)
    assert nothing["HX-Reswap"] == "none"
    assert bad_reason.status_code == 303
    assert "Reason: must be one of" in html(client.get(bad_reason["Location"]))
    assert client.get(url(propose_workspace, "review/approve/")).status_code == 405


def test_approving_past_the_circuit_breaker_asks_for_force(client, propose_workspace, now):
    doomed = cold(propose_workspace, now, 30)
    run_maintenance(workspace=propose_workspace, now=now)
    login(client, propose_workspace)

    refused = client.post(url(propose_workspace, "review/approve/"), {"scope": "all"}, **HX)
    plain = client.post(url(propose_workspace, "review/approve/"), {"scope": "all"})

    for response in (refused, plain):
        assert response.status_code == 409
        body = html(response)
        assert "circuit breaker: approving would tombstone 30 of 30 live entries" in body
        assert 'id="force-approve"' in body and 'name="force" value="1"' in body
        assert 'name="scope" value="all"' in body
    assert refused["X-Console-Notice"] == "1"
    assert 'id="pending-panel"' in html(plain)  # the page itself, with the notice and the form
    assert all(status(e) == "active" for e in doomed)

    forced = client.post(url(propose_workspace, "review/approve/"), {"scope": "all", "force": "1"}, **HX)

    assert forced.status_code == 200 and "Approved 30 changes" in html(forced)
    assert all(status(e) == "tombstoned" for e in doomed)


# --- holds on queue rows -----------------------------------------------------------------------------


def test_a_held_entry_shows_its_badge_and_release_on_the_queue_rows(client, workspace, now):
    auto, tomb = cold(workspace, now, 2)
    run_maintenance(workspace=workspace, now=now)  # apply mode: both tombstoned by decay
    holds.hold(workspace, [auto.pk, tomb.pk], reason="dispute", actor="user:ann", now=now)
    login(client, workspace)

    automatic = html(client.get(url(workspace) + "?tab=automatic"))
    tombstones = html(client.get(url(workspace) + "?tab=tombstones"))

    for page in (automatic, tombstones):
        assert f'id="hold-{auto.pk}"' in page
        assert "held by user:ann since" in page and "(dispute)" in page
        assert f'action="{url(workspace, "review/release/")}"' in page

    body = html(client.post(url(workspace, "review/release/"), {"ids": [auto.pk], "tab": "automatic"}, **HX))
    plain = client.post(url(workspace, "review/release/"), {"ids": [tomb.pk], "tab": "tombstones"})

    assert f'<span id="hold-{auto.pk}" hx-swap-oob="delete"></span>' in body
    assert f"Released 1 entry (#{auto.pk})" in body
    assert plain.status_code == 303 and plain["Location"] == url(workspace) + "?tab=tombstones"
    assert Entry.objects.filter(pk__in=[auto.pk, tomb.pk], held_at__isnull=False).count() == 0
    again = html(client.post(url(workspace, "review/release/"), {"ids": [auto.pk]}, **HX))
    assert "Released 0 entries. Skipped 1" in again and "not held" in again


# --- dashboard, header, run page ----------------------------------------------------------------------


def test_the_dashboard_says_how_many_changes_await_approval(client, propose_workspace, workspace, now):
    proposed(propose_workspace, now)
    login(client, propose_workspace)
    login(client, workspace)

    page = html(client.get(url(propose_workspace, "")))
    quiet = html(client.get(url(workspace, "")))

    callout = page[page.index('id="live-pending"') :].split("</p>", 1)[0]
    assert "hidden" not in callout.split(">", 1)[0]
    assert f'href="/console/{propose_workspace.slug}/review/?tab=pending"' in callout
    assert "4 changes await approval" in callout and "1 archive and 3 tombstones" in callout
    assert 'id="live-pending" class="pending-callout" hidden' in quiet
    assert "4 awaiting approval" in page  # the header too


def test_the_header_counts_the_same_automatic_changes_as_the_tab(client, workspace, now):
    cold(workspace, now, 3)
    stale(workspace, now)
    old = new_entries.entry_create(
        workspace=workspace,
        content=TEXT.format("never read"),
        created_at=now - timedelta(days=40),
        now=now - timedelta(days=40),
    )
    MaintenancePolicy.objects.filter(workspace=workspace).update(stale_after_days=30)
    run_maintenance(workspace=workspace, now=now)  # tombstones 3, archives 1, marks `old` stale
    assert status(old) == "stale"
    first = Entry.objects.filter(workspace=workspace, status="tombstoned").order_by("pk").first()
    entry_changes.entry_restore(workspace=workspace, entry_id=first.pk)  # one change undone by hand
    login(client, workspace)

    page = html(client.get(url(workspace) + "?tab=automatic"))

    listed = page.count('class="queue-row auto-row"')
    header = int(re.search(r'data-automatic="(\d+)"', page).group(1))
    assert listed == 3
    assert header == listed == counts(page)["automatic"] == live.queue_counts(workspace)["automatic"]
    assert f"{listed} automatic changes" in page


def test_a_proposed_run_reads_as_proposed_with_its_metrics_apart(client, propose_workspace, now):
    _, _, run_id = proposed(propose_workspace, now)
    login(client, propose_workspace)

    page = html(client.get(url(propose_workspace, f"runs/{run_id}/")))

    assert 'class="badge status-proposed">proposed<' in page
    assert "This run proposed 1 archive and 3 tombstones instead of making them" in page
    assert "1 archive and 3 tombstones await approval" in page
    assert f'href="/console/{propose_workspace.slug}/review/?tab=pending"' in page
    changes = page[page.index('id="run-counts"') : page.index('id="run-metrics"')]
    metrics = page[page.index('id="run-metrics"') :].split("</table>", 1)[0]
    assert re.search(r'evicted</th><td class="num">3</td><td><span class="badge proposed">proposed', changes)
    # In words, the API's key in the title.
    for key, words in (("scored", "scored"), ("orphans", "orphans"), ("held_skipped", "held, left alone")):
        assert f'title="{key}">{words}<' in metrics and f">{words}<" not in changes

    client.post(url(propose_workspace, "review/approve/"), {"scope": "all", "force": "1"})
    after = html(client.get(url(propose_workspace, f"runs/{run_id}/")))
    assert "None of them awaits approval any more" in after

    runs = html(client.get(url(propose_workspace, "runs/")))
    row = runs[runs.index(f'id="run-row-{run_id}"') :].split("</tr>", 1)[0]
    assert "evicted 3 proposed" in row and "scored" not in row.split('class="metrics')[0]


# --- live ---------------------------------------------------------------------------------------------


def test_the_live_queue_update_carries_the_proposal_counts_for_every_page(propose_workspace, now):
    proposed(propose_workspace, now)

    pushed = live.render_queue(propose_workspace.pk)

    assert 'data-proposals="4"' in pushed
    assert '<span class="count" id="review-count-pending">4</span>' in pushed
    assert re.search(r'<p id="live-pending" class="pending-callout">', pushed)
    assert "4 changes await approval" in pushed
    assert 'id="review-count-automatic"' in pushed and 'id="review-count-hygiene"' not in pushed


@pytest.mark.parametrize("door", ["approve", "reject", "release"])
def test_every_door_s_change_is_announced(
    propose_workspace, now, monkeypatch, door, django_capture_on_commit_callbacks
):
    from maintenance import proposals

    doomed, _, _ = proposed(propose_workspace, now)
    sent: list[str] = []
    monkeypatch.setattr(live, "deliver", lambda workspace_id, html: sent.append(html))

    with django_capture_on_commit_callbacks(execute=True):
        if door == "approve":
            proposals.approve(propose_workspace, ids=[doomed[0].pk], actor="api:key")
        elif door == "reject":
            proposals.reject(propose_workspace, ids=[doomed[0].pk], actor="api:key")
        else:
            holds.hold(propose_workspace, [doomed[1].pk], reason="keep", actor="cli", now=now)
            sent.clear()
            entry_changes.entry_release(workspace=propose_workspace, entry_id=doomed[1].pk, actor="cli")

    assert sent, "nothing was announced"
    expected = 4 if door == "release" else 3
    assert f'data-proposals="{expected}"' in sent[-1]


def test_run_now_says_what_a_run_does_in_this_review_mode(client, propose_workspace, workspace):
    """Its confirmation: a workspace that reviews first gets proposals, not changes."""
    for ws, says in ((propose_workspace, "are proposed for approval, not made"), (workspace, "It applies")):
        login(client, ws)
        page = html(client.get(f"/console/{ws.slug}/"))
        assert says in page
