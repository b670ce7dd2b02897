"""The approval door of the API: the open proposal set, approve, reject,
release, and the hold fields of entries."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from maintenance.lease import acquire, new_holder
from maintenance.models import MaintenanceRun, Proposal
from maintenance.run_start import run_maintenance
from memory import accounts, holds, new_entries
from memory.models import Entry, LifecycleEvent
from memory.policy_model import MaintenancePolicy
from tests.helpers_runs import work_queued_runs

pytestmark = pytest.mark.django_db

CSRF = "p" * 32  # any 32-character alphanumeric secret is a valid CSRF cookie and token


@pytest.fixture(autouse=True)
def _settings(settings, tmp_path):
    settings.BACKUP_DIR = tmp_path
    settings.API_RATE_LIMIT_PER_MINUTE = 0  # key ids repeat across tests; the window is a minute


class Caller:
    """One identity speaking JSON to the API: a bearer key or a member's session."""

    def __init__(self, client: Client, headers: dict[str, str], actor: str = ""):
        self.client, self.headers, self.actor = client, headers, actor

    def __call__(self, method: str, path: str, body: Any = None) -> Any:
        kwargs: dict[str, Any] = dict(self.headers)
        if body is not None:
            kwargs["data"] = body if isinstance(body, str) else json.dumps(body)
            kwargs["content_type"] = "application/json"
        response = getattr(self.client, method.lower())(f"/api/v1{path}", **kwargs)
        assert response["Content-Type"].startswith("application/json"), response.content[:200]
        return response


def applied_run(caller: Caller, body: Any = None) -> dict[str, Any]:
    """A real run through the API: queued (202), done by the worker, read back; its detail."""
    response = caller("POST", "/maintenance/run", {} if body is None else body)
    assert response.status_code == 202, response.content
    run_id = response.json()["run_id"]
    assert work_queued_runs() == [run_id]
    detail = caller("GET", f"/maintenance/runs/{run_id}")
    assert detail.status_code == 200, detail.content
    return detail.json()


def key(workspace, role: str) -> Caller:
    api_key, raw = accounts.api_key_create(workspace=workspace, name=f"{role} key", role=role)
    return Caller(Client(), {"HTTP_AUTHORIZATION": f"Bearer {raw}"}, accounts.actor_for_key(api_key))


def member(workspace, role: str) -> Caller:
    user = get_user_model().objects.create_user(username=f"{role}-{workspace.slug}", password="x")
    accounts.membership_set(workspace=workspace, user=user, role=role)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.cookies["csrftoken"] = CSRF
    return Caller(client, {"HTTP_X_WORKSPACE": workspace.slug, "HTTP_X_CSRFTOKEN": CSRF})


@pytest.fixture
def ws(propose_workspace):
    return propose_workspace


@pytest.fixture
def operator(ws) -> Caller:
    return key(ws, "operator")


@pytest.fixture
def agent(ws) -> Caller:
    return key(ws, "agent")


def old(workspace, text: str, *, age_days: float = 200, **fields: Any) -> Entry:
    """An entry created ``age_days`` ago and never accessed: an episodic one is cold enough for
    the decay pass (retention < 0.2 at 200 days)."""
    at = timezone.now() - timedelta(days=age_days)
    entry = new_entries.entry_create(workspace=workspace, content=text, created_at=at, now=at)
    if fields:
        Entry.objects.filter(pk=entry.pk).update(**fields)
    entry.refresh_from_db()
    return entry


def cold(workspace, n: int, prefix: str = "cold") -> list[Entry]:
    return [old(workspace, f"{prefix} memory {i} about retries and backoff") for i in range(n)]


def stale_semantic(workspace, text: str) -> Entry:
    """An entry the archive pass archives (stale for longer than archive_after_days) and decay
    never judges (not episodic)."""
    return old(
        workspace,
        text,
        tier="semantic",
        status="stale",
        status_changed_at=timezone.now() - timedelta(days=200),
    )


def propose(workspace) -> dict[str, Any]:
    result = run_maintenance(workspace=workspace, trigger="cli")
    assert result["status"] == "proposed", result
    return result


def status(entry: Entry) -> str:
    return Entry.objects.get(pk=entry.pk).status


def open_ids(workspace) -> list[int]:
    return sorted(
        Proposal.objects.filter(workspace=workspace, status="open").values_list("entry_ref", flat=True)
    )


def snapshot(workspace) -> dict[str, Any]:
    return {
        "entries": list(Entry.objects.filter(workspace=workspace).order_by("pk").values()),
        "proposals": list(Proposal.objects.filter(workspace=workspace).order_by("pk").values()),
        "events": LifecycleEvent.objects.filter(workspace=workspace).count(),
    }


# --- a propose-mode run through the API -----------------------------------------------------------


def test_a_propose_mode_run_answers_proposed_and_changes_nothing_it_proposes(ws, operator):
    entries = cold(ws, 3)
    detail = applied_run(operator)
    result = detail["result"]
    ids = sorted(e.pk for e in entries)
    assert (result["dry_run"], result["status"]) == (False, "proposed")
    assert result["counts"]["evicted"] == 3 and result["counts"]["held_skipped"] == 0
    assert result["affected"] == {
        "archived": [],
        "tombstoned": [],
        "purged": [],
        "proposed": {"archive": [], "tombstone": ids},
    }
    assert result["proposed"] == {"archive": 0, "tombstone": 3}
    assert result["breaker"] == {"would_trip": False, "tombstones": 3, "live": 3}
    assert result["backup_file"] is None  # nothing destructive applied
    assert [status(e) for e in entries] == ["stale"] * 3  # stale marking applies; no tombstone
    assert open_ids(ws) == ids
    stored = MaintenanceRun.objects.get(pk=result["run_id"])
    assert stored.result == result  # what the API shows is what the run keeps
    assert detail["status"] == "proposed"
    assert detail["counts"]["held_skipped"] == 0 and detail["counts"]["evicted"] == 3
    assert detail["result"]["proposed"] == {"archive": 0, "tombstone": 3}
    assert detail["result"]["breaker"]["would_trip"] is False
    assert detail["affected"]["proposed"]["tombstone"] == ids


def test_an_apply_mode_run_has_no_proposal_keys(workspace):
    old(workspace, "cold memory about retries and backoff")
    result = applied_run(key(workspace, "operator"))["result"]
    assert result["status"] == "succeeded"
    assert "proposed" not in result and "breaker" not in result and "proposed" not in result["affected"]
    assert not Proposal.objects.exists()


# --- GET /proposals -------------------------------------------------------------------------------


def test_the_open_set_shows_each_proposal_with_its_deciding_values_and_entry(ws, agent):
    long_text = "a cold memory about retries " + "and backoff " * 100
    entry = old(ws, long_text)
    Entry.objects.filter(pk=entry.pk).update(title="Retry policy")
    run = propose(ws)
    response = agent("GET", "/proposals")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["count"], body["limit"], body["offset"]) == (1, 50, 0)
    item = body["items"][0]
    assert item["entry_id"] == entry.pk
    assert (item["action"], item["reason"]) == ("tombstone", "evicted")
    assert item["reason_label"] == "decayed: retention below the cold threshold"
    assert item["values"]["retention"] < item["values"]["cold_threshold"] == 0.2
    assert item["values"]["access_count"] == 0 and item["values"]["age_days"] == pytest.approx(200, abs=1)
    assert item["why"].startswith("retention 0.") and "never accessed" in item["why"]
    assert item["run_id"] == run["run_id"]
    assert item["created_at"]
    assert (item["title"], item["entry_status"]) == ("Retry policy", "stale")  # the run marked it
    assert item["content_excerpt"] == long_text[:240]


def test_members_read_the_open_set_too(ws):
    cold(ws, 2)
    propose(ws)
    response = member(ws, "viewer")("GET", "/proposals")
    assert response.status_code == 200, response.content
    assert response.json()["count"] == 2


def test_the_open_set_filters_by_reason_and_action(ws, agent):
    decayed = cold(ws, 2)
    archived = [stale_semantic(ws, f"stale rule {i} about deploys and rollbacks") for i in range(3)]
    propose(ws)

    def listed(query: str) -> list[tuple[int, str, str]]:
        body = agent("GET", f"/proposals{query}").json()
        assert body["count"] == len(body["items"])
        return [(i["entry_id"], i["action"], i["reason"]) for i in body["items"]]

    tombstones = [(e.pk, "tombstone", "evicted") for e in decayed]
    archives = [(e.pk, "archive", "archived") for e in archived]
    assert listed("") == sorted(archives) + sorted(tombstones)  # by reason, then entry
    assert listed("?reason=evicted") == sorted(tombstones)
    assert listed("?action=archive") == sorted(archives)
    assert listed("?reason=evicted&action=archive") == []
    assert listed("?reason=pruned") == []


def test_the_open_set_pages_with_the_true_count(ws, agent):
    ids = sorted(e.pk for e in cold(ws, 7))
    propose(ws)
    pages = [agent("GET", f"/proposals?limit=3&offset={offset}").json() for offset in (0, 3, 6, 9)]
    assert [p["count"] for p in pages] == [7, 7, 7, 7]
    assert [[i["entry_id"] for i in p["items"]] for p in pages] == [ids[:3], ids[3:6], ids[6:], []]
    assert len(agent("GET", "/proposals?limit=500").json()["items"]) == 7


@pytest.mark.parametrize(
    "query", ["limit=501", "limit=0", "offset=-1", "reason=decayed", "action=delete", "limit=ten"]
)
def test_bad_list_parameters_answer_422(ws, agent, query):
    assert agent("GET", f"/proposals?{query}").status_code == 422


def test_a_page_of_proposals_costs_the_same_queries_for_3_and_30(ws, agent, django_assert_num_queries):
    agent("GET", "/proposals")  # the key's last_used_at is written on first use only
    cold(ws, 3, "first")
    propose(ws)
    # The key lookup (with the workspace and its policy) and the page with its entries.
    with django_assert_num_queries(2):
        assert agent("GET", "/proposals?limit=100").json()["count"] == 3
    cold(ws, 27, "second")
    propose(ws)
    with django_assert_num_queries(2):
        assert agent("GET", "/proposals?limit=100").json()["count"] == 30
    # A full page counts the set: one query more, whatever its size.
    with django_assert_num_queries(3):
        assert agent("GET", "/proposals?limit=10").json()["count"] == 30


# --- POST /proposals/approve ----------------------------------------------------------------------


def test_approving_a_selection_changes_exactly_those_entries(ws, operator):
    entries = cold(ws, 5)
    run = propose(ws)
    chosen = [entries[1].pk, entries[3].pk]
    response = operator("POST", "/proposals/approve", {"ids": chosen})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["applied"] == sorted(chosen) and body["skipped"] == []
    assert body["backup_file"].startswith("pre-prune-backup-")
    assert [status(e) for e in entries] == ["stale", "tombstoned", "stale", "tombstoned", "stale"]
    assert open_ids(ws) == sorted(e.pk for e in entries if e.pk not in chosen)
    # Applied as the proposing run would have, in the approving operator's name: revertible.
    events = LifecycleEvent.objects.filter(entry_ref__in=chosen, to_status="tombstoned")
    assert {(e.reason, e.run_id, e.actor) for e in events} == {("decay", run["run_id"], operator.actor)}
    assert [i["entry_id"] for i in operator("GET", "/proposals").json()["items"]] == open_ids(ws)


def test_approving_all_of_a_reason_leaves_the_other_reasons_open(ws, operator):
    decayed = cold(ws, 2)
    archived = [stale_semantic(ws, f"stale rule {i} about deploys and rollbacks") for i in range(2)]
    propose(ws)
    body = operator("POST", "/proposals/approve", {"all": True, "reason": "archived"}).json()
    assert body["applied"] == sorted(e.pk for e in archived)
    assert body["backup_file"] is None  # archives are not destructive
    assert [status(e) for e in archived] == ["archived", "archived"]
    assert [status(e) for e in decayed] == ["stale", "stale"]
    assert open_ids(ws) == sorted(e.pk for e in decayed)


def test_approving_after_the_data_moved_skips_with_why(ws, operator, agent):
    accessed, pinned, held, untouched = cold(ws, 4)
    propose(ws)
    assert agent("POST", f"/entries/{accessed.pk}/access", {"actor": "claude"}).status_code == 200
    assert agent("PATCH", f"/entries/{pinned.pk}", {"pinned": True}).status_code == 200
    holds.hold(ws, [held.pk], reason="keep", actor="operator:bob", now=timezone.now())
    foreign = new_entries.entry_create(workspace=ws, content="never proposed")
    named = [accessed.pk, pinned.pk, held.pk, untouched.pk, foreign.pk]
    body = operator("POST", "/proposals/approve", {"ids": named}).json()
    assert body["applied"] == [untouched.pk]
    why = {s["id"]: s["why"] for s in body["skipped"]}
    assert set(why) == {accessed.pk, pinned.pk, held.pk, foreign.pk}
    assert "accessed" in why[accessed.pk]
    assert "pinned" in why[pinned.pk]
    assert why[held.pk].startswith("held by operator:bob") and "keep" in why[held.pk]
    assert why[foreign.pk] == "no open proposal for this entry"
    # An access makes a stale entry active again.
    assert [status(e) for e in (accessed, pinned, held, untouched)] == [
        "active",
        "stale",
        "stale",
        "tombstoned",
    ]
    closed = dict(Proposal.objects.filter(entry_ref__in=named[:3]).values_list("entry_ref", "status"))
    assert closed == dict.fromkeys(named[:3], "skipped")
    assert open_ids(ws) == []


def test_approving_past_the_circuit_breaker_needs_force(ws, operator):
    entries = cold(ws, 25)  # every live entry: 100 % > max_tombstone_fraction 50 %, and > 20
    run = propose(ws)
    assert run["breaker"] == {"would_trip": True, "tombstones": 25, "live": 25}
    before = snapshot(ws)
    response = operator("POST", "/proposals/approve", {"all": True})
    assert response.status_code == 409, response.content
    detail = response.json()["detail"]
    assert "circuit breaker" in detail and "25" in detail and "force" in detail
    assert snapshot(ws) == before
    response = operator("POST", "/proposals/approve", {"all": True, "force": True})
    assert response.status_code == 200, response.content
    assert len(response.json()["applied"]) == 25
    assert {status(e) for e in entries} == {"tombstoned"}


def test_a_selection_under_the_breaker_needs_no_force(ws, operator):
    entries = cold(ws, 25)
    propose(ws)
    chosen = sorted(e.pk for e in entries[:20])  # 20 tombstones: the breaker never trips at 20
    response = operator("POST", "/proposals/approve", {"ids": chosen})
    assert response.status_code == 200, response.content
    assert response.json()["applied"] == chosen


def test_approving_while_a_run_holds_the_lease_is_refused(ws, operator):
    entries = cold(ws, 2)
    propose(ws)
    assert acquire(ws, holder=new_holder(), now=timezone.now())
    before = snapshot(ws)
    response = operator("POST", "/proposals/approve", {"all": True})
    assert response.status_code == 409
    assert "maintenance run" in response.json()["detail"]
    assert snapshot(ws) == before
    assert [status(e) for e in entries] == ["stale", "stale"]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"all": False},
        {"ids": []},
        {"ids": [1], "all": True},
        {"ids": ["1"]},
        {"ids": [0]},
        {"ids": [2**63]},
        {"ids": 1},
        {"ids": list(range(1, 502))},
        {"all": "true"},
        {"all": 1},
        {"all": True, "reason": "decayed"},
        {"ids": [1], "reason": "evicted"},
        {"all": True, "force": "yes"},
        {"all": True, "everything": True},
        [1, 2],
    ],
    ids=json.dumps,
)
def test_bad_approval_bodies_answer_422_and_change_nothing(ws, operator, body):
    cold(ws, 2)
    propose(ws)
    before = snapshot(ws)
    response = operator("POST", "/proposals/approve", body)
    assert response.status_code == 422, response.content
    assert snapshot(ws) == before


def test_a_malformed_approval_body_answers_400(ws, operator):
    assert operator("POST", "/proposals/approve", "{not json").status_code == 400


def test_reject_takes_no_force(ws, operator):
    cold(ws, 1)
    propose(ws)
    assert operator("POST", "/proposals/reject", {"all": True, "force": True}).status_code == 422
    assert len(open_ids(ws)) == 1


# --- POST /proposals/reject, holds, and the next run ----------------------------------------------


def test_a_rejected_proposal_holds_its_entry_and_the_next_run_leaves_it_alone(ws, operator):
    rejected, other = cold(ws, 2)
    propose(ws)
    response = operator("POST", "/proposals/reject", {"ids": [rejected.pk, 999_999]})
    assert response.status_code == 200, response.content
    assert response.json() == {
        "rejected": [rejected.pk],
        "skipped": [{"id": 999_999, "why": "no open proposal for this entry"}],
    }
    assert Proposal.objects.get(entry_ref=rejected.pk).status == "rejected"
    entry = operator("GET", f"/entries/{rejected.pk}").json()
    assert entry["held"] is True
    assert (entry["hold_reason"], entry["held_by"]) == ("reject", operator.actor)
    assert entry["held_at"] and entry["status"] == "stale"

    run = applied_run(operator)["result"]
    assert run["status"] == "proposed"
    assert run["counts"]["held_skipped"] == 1
    assert run["affected"]["proposed"]["tombstone"] == [other.pk]
    assert open_ids(ws) == [other.pk]
    # Apply mode too: the hold is part of the protection rule every pass uses.
    MaintenancePolicy.objects.filter(workspace=ws).update(review_mode="apply")
    run = applied_run(operator, {"force": True})["result"]
    assert (run["status"], run["counts"]["held_skipped"]) == ("succeeded", 1)
    assert (status(rejected), status(other)) == ("stale", "tombstoned")


def test_rejecting_all_of_a_reason(ws, operator):
    decayed = cold(ws, 2)
    archived = stale_semantic(ws, "stale rule about deploys and rollbacks")
    propose(ws)
    body = operator("POST", "/proposals/reject", {"all": True, "reason": "evicted"}).json()
    assert body == {"rejected": sorted(e.pk for e in decayed), "skipped": []}
    assert open_ids(ws) == [archived.pk]
    assert Entry.objects.filter(pk__in=[e.pk for e in decayed], hold_reason="reject").count() == 2


def test_a_release_ends_the_hold_and_the_next_run_proposes_the_entry_again(ws, operator):
    (entry,) = cold(ws, 1)
    propose(ws)
    operator("POST", "/proposals/reject", {"ids": [entry.pk]})
    response = operator("POST", f"/entries/{entry.pk}/release")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["held"], body["held_at"], body["held_by"], body["hold_reason"]) == (
        entry.pk,
        False,
        None,
        "",
        "",
    )
    history = operator("GET", f"/entries/{entry.pk}/history").json()["items"]
    assert [e["reason"] for e in history[:2]] == ["release", "hold"]
    assert history[0]["details"]["hold_reason"] == "reject"
    # Not held any more: a second release is a conflict.
    again = operator("POST", f"/entries/{entry.pk}/release")
    assert again.status_code == 409 and "not held" in again.json()["detail"]
    run = applied_run(operator)["result"]
    assert (run["counts"]["held_skipped"], open_ids(ws)) == (0, [entry.pk])


def test_release_of_an_unknown_or_foreign_entry_is_not_found(ws, operator, other_workspace):
    theirs = new_entries.entry_create(workspace=other_workspace, content="globex memory")
    Entry.objects.filter(pk=theirs.pk).update(held_at=timezone.now(), held_by="x", hold_reason="restore")
    for entry_id in (theirs.pk, 999_999):
        response = operator("POST", f"/entries/{entry_id}/release")
        assert response.status_code == 404, response.content
    assert Entry.objects.get(pk=theirs.pk).held_at is not None


# --- roles and isolation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/proposals/approve", {"all": True}),
        ("/proposals/reject", {"all": True}),
        ("/entries/{id}/release", None),
    ],
)
def test_agents_may_read_but_not_decide(ws, agent, path, body):
    entries = cold(ws, 2)
    propose(ws)
    Entry.objects.filter(pk=entries[0].pk).update(held_at=timezone.now(), held_by="op", hold_reason="keep")
    before = snapshot(ws)
    response = agent("POST", path.format(id=entries[0].pk), body)
    assert response.status_code == 403, response.content
    assert "operator" in response.json()["detail"]
    assert snapshot(ws) == before
    assert agent("GET", "/proposals").json()["count"] == 2


def test_another_workspace_sees_and_decides_nothing_of_this_one(ws, other_workspace):
    entries = cold(ws, 3)
    propose(ws)
    ids = [e.pk for e in entries]
    before = snapshot(ws)
    theirs = key(other_workspace, "admin")
    listed = theirs("GET", "/proposals").json()
    assert (listed["count"], listed["items"]) == (0, [])
    for path in ("/proposals/approve", "/proposals/reject"):
        response = theirs("POST", path, {"ids": ids})
        assert response.status_code == 200, response.content
        assert [s["id"] for s in response.json()["skipped"]] == ids
        assert {s["why"] for s in response.json()["skipped"]} == {"no open proposal for this entry"}
        assert theirs("POST", path, {"all": True}).status_code == 200
    assert snapshot(ws) == before


# --- hold fields of entries -----------------------------------------------------------------------


def _hold(entry: Entry, days_ago: float, reason: str = "restore") -> None:
    Entry.objects.filter(pk=entry.pk).update(
        held_at=timezone.now() - timedelta(days=days_ago), held_by="operator:alice", hold_reason=reason
    )


def test_entries_show_their_hold_under_the_workspaces_hold_days(ws, agent):
    recent, expired = (new_entries.entry_create(workspace=ws, content=f"memory {i}") for i in range(2))
    free = new_entries.entry_create(workspace=ws, content="memory free")
    _hold(recent, 2)
    _hold(expired, 40, "revert")

    def held() -> dict[int, bool]:
        items = agent("GET", "/entries").json()["items"]
        return {i["id"]: i["held"] for i in items}

    assert held() == {recent.pk: True, expired.pk: True, free.pk: False}  # 0: until released
    MaintenancePolicy.objects.filter(workspace=ws).update(operator_hold_days=30)
    assert held() == {recent.pk: True, expired.pk: False, free.pk: False}
    detail = agent("GET", f"/entries/{expired.pk}").json()
    assert (detail["held"], detail["hold_reason"], detail["held_by"]) == (False, "revert", "operator:alice")
    assert detail["held_at"] is not None  # when it began, though it is over
    MaintenancePolicy.objects.filter(workspace=ws).update(operator_hold_days=1)
    assert agent("GET", f"/entries/{recent.pk}").json()["held"] is False
    # A member's session reads the policy itself.
    assert member(ws, "viewer")("GET", f"/entries/{recent.pk}").json()["held"] is False


def test_writes_answer_with_the_hold_and_new_content_starts_unheld(ws, agent):
    created = agent("POST", "/entries", {"content": "Cache the token for an hour."}).json()
    assert (created["held"], created["held_at"], created["held_by"], created["hold_reason"]) == (
        False,
        None,
        "",
        "",
    )
    entry = Entry.objects.get(pk=created["id"])
    _hold(entry, 1, "keep")
    same = agent("PATCH", f"/entries/{entry.pk}", {"pinned": True}).json()
    assert (same["new_version"], same["entry"]["held"], same["entry"]["hold_reason"]) == (False, True, "keep")
    assert agent("POST", f"/entries/{entry.pk}/reinforce").json()["held"] is True
    changed = agent("PATCH", f"/entries/{entry.pk}", {"content": "Cache the token for ten minutes."}).json()
    assert changed["new_version"] is True and changed["supersedes"] == entry.pk
    assert (changed["entry"]["held"], changed["entry"]["held_at"]) == (False, None)


def test_listing_held_entries_costs_no_extra_query(ws, agent, django_assert_num_queries):
    MaintenancePolicy.objects.filter(workspace=ws).update(operator_hold_days=30)
    agent("GET", "/entries")
    entries = [new_entries.entry_create(workspace=ws, content=f"memory {i} about queues") for i in range(20)]
    for entry in entries[::2]:
        _hold(entry, 1)
    # The key lookup (policy included) and the page's tags; the count is not needed: a short page.
    with django_assert_num_queries(3):
        items = agent("GET", "/entries?limit=100").json()["items"]
    assert sum(i["held"] for i in items) == 10


def test_a_members_listing_reads_the_policy_once(ws):
    viewer = member(ws, "viewer")
    viewer("GET", "/entries")
    entries = [new_entries.entry_create(workspace=ws, content=f"memory {i} about queues") for i in range(20)]
    for entry in entries:
        _hold(entry, 1)

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert all(i["held"] for i in viewer("GET", "/entries?limit=100").json()["items"])
        return sum("maintenance_maintenancepolicy" in q["sql"] for q in ctx.captured_queries)

    assert queries() == 1
