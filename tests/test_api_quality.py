"""The quality endpoints: /hygiene/preview, /hygiene/apply, /hygiene/keep,
/disputes and /disputes/{id}/resolve — happy paths, roles, isolation, errors, query counts."""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from maintenance.models import Dispute
from memory import accounts, entry_changes, new_entries
from memory.models import Entry, LifecycleEvent

pytestmark = pytest.mark.django_db

JUNK = "wip..."  # a fragment (2) that ends truncated (2): score 4, recommendation archive
GOOD = "Connection pool exhaustion under load was fixed by lowering the idle timeout to thirty seconds"


@pytest.fixture
def key(workspace):
    def make(role: str, ws=None) -> str:
        return accounts.api_key_create(workspace=ws or workspace, name=f"{role} key", role=role)[1]

    return make


def call(method: str, path: str, key: str | None = None, body=None):
    extra = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body is not None else {}
    return getattr(Client(), method.lower())(f"/api/v1{path}", **kwargs, **extra)


def write(workspace, content, **fields):
    return new_entries.entry_create(
        workspace=workspace, content=content, created_at=timezone.now() - timedelta(days=40), **fields
    )


def status(entry):
    return Entry.objects.get(pk=entry.pk).status


# --- hygiene ---------------------------------------------------------------------------------


def test_the_preview_lists_candidates_with_reasons_and_a_recommendation(workspace, key):
    junk = write(workspace, JUNK)
    write(workspace, GOOD)
    response = call("GET", "/hygiene/preview", key("agent"))
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["count"], body["limit"], body["offset"]) == (1, 50, 0)
    (candidate,) = body["candidates"]
    assert candidate["id"] == junk.pk
    assert candidate["score"] == 4 and candidate["recommendation"] == "archive"
    assert {r["code"] for r in candidate["reasons"]} == {"incomplete_fragment", "truncated_or_unbalanced"}
    assert all(r["detail"] for r in candidate["reasons"])


def test_the_preview_pages_and_refuses_bad_pages(workspace, key):
    for n in range(5):
        write(workspace, f"wip {n}...")
    agent = key("agent")
    page = call("GET", "/hygiene/preview?limit=2&offset=3", agent).json()
    assert page["count"] == 5 and len(page["candidates"]) == 2
    for query in ("limit=0", "limit=501", "offset=-1", "limit=abc"):
        assert call("GET", f"/hygiene/preview?{query}", agent).status_code == 422


def test_the_preview_costs_the_same_queries_for_5_and_50_candidates(workspace, other_workspace, key):
    def queries(ws, n):
        for i in range(n):
            write(ws, f"wip {i}...")
        secret = key("agent", ws)
        with CaptureQueriesContext(connection) as ctx:
            assert call("GET", "/hygiene/preview?limit=100", secret).status_code == 200
        return len(ctx.captured_queries)

    assert queries(workspace, 5) == queries(other_workspace, 50)


def test_an_operator_archives_candidates_and_the_rest_is_skipped(workspace, other_workspace, key):
    junk, good = write(workspace, JUNK), write(workspace, GOOD)
    theirs = write(other_workspace, JUNK)
    response = call(
        "POST", "/hygiene/apply", key("operator"), {"ids": [junk.pk, junk.pk, good.pk, theirs.pk]}
    )
    assert response.status_code == 200, response.content
    assert response.json() == {"archived": [junk.pk], "skipped": [good.pk, theirs.pk]}
    assert (status(junk), status(good), status(theirs)) == ("archived", "active", "active")
    event = LifecycleEvent.objects.get(entry=junk, to_status="archived")
    assert (event.reason, event.automatic) == ("hygiene", False)


def test_keep_hides_an_entry_until_its_content_changes(workspace, key):
    junk = write(workspace, JUNK)
    operator = key("operator")
    assert call("POST", "/hygiene/keep", operator, {"ids": [junk.pk]}).json() == {
        "kept": [junk.pk],
        "skipped": [],
    }
    assert call("GET", "/hygiene/preview", operator).json()["count"] == 0
    # A kept entry is not archived by an apply either.
    assert call("POST", "/hygiene/apply", operator, {"ids": [junk.pk]}).json()["archived"] == []
    entry_changes.entry_update(workspace=workspace, entry_id=junk.pk, content="still wip...")
    newest = Entry.objects.get(lineage_id=junk.lineage_id, is_latest=True)
    assert newest.pk != junk.pk
    listed = call("GET", "/hygiene/preview", operator).json()["candidates"]
    assert [c["id"] for c in listed] == [newest.pk]


@pytest.mark.parametrize("path", ["/hygiene/apply", "/hygiene/keep"])
@pytest.mark.parametrize(
    "body",
    [
        {},
        {"ids": []},
        {"ids": "1"},
        {"ids": [0]},
        {"ids": ["1"]},
        {"ids": [True]},
        {"ids": [1] * 501},
        {"ids": [1], "x": 1},
    ],
)
def test_hygiene_actions_refuse_bad_bodies_and_change_nothing(workspace, key, path, body):
    junk = write(workspace, JUNK)
    response = call("POST", path, key("operator"), body)
    assert response.status_code == 422, response.content
    assert "detail" in response.json()
    junk.refresh_from_db()
    assert (junk.status, junk.review_kept_hash) == ("active", "")


@pytest.mark.parametrize("path", ["/hygiene/apply", "/hygiene/keep"])
def test_agents_cannot_archive_or_keep(workspace, key, path):
    junk = write(workspace, JUNK)
    assert call("POST", path, key("agent"), {"ids": [junk.pk]}).status_code == 403
    junk.refresh_from_db()
    assert (junk.status, junk.review_kept_hash) == ("active", "")


# --- disputes ----------------------------------------------------------------------------------


def dispute(
    workspace, first_text="Always use tabs for indentation", second_text="Never use tabs for indentation"
):
    a = new_entries.entry_create(workspace=workspace, content=first_text, entry_type="rule")
    b = new_entries.entry_create(workspace=workspace, content=second_text, entry_type="rule")
    return Dispute.objects.create(
        workspace=workspace, entry_a_id=a.pk, entry_b_id=b.pk, detected_by="sweep", similarity=0.8
    )


def test_disputes_are_listed_side_by_side_and_filtered_by_status(workspace, other_workspace, key):
    mine = dispute(workspace)
    dispute(other_workspace)
    agent = key("agent")
    body = call("GET", "/disputes", agent).json()
    assert body["count"] == 1
    (item,) = body["items"]
    assert item["id"] == mine.pk and item["status"] == "open" and item["resolution"] is None
    assert item["entry_a"]["content"] == "Always use tabs for indentation"
    assert item["entry_b"]["content"] == "Never use tabs for indentation"
    assert call("GET", "/disputes?status=resolved", agent).json()["count"] == 0
    assert call("GET", "/disputes?status=maybe", agent).status_code == 422


def test_the_dispute_list_costs_the_same_queries_for_2_and_20(workspace, other_workspace, key):
    def queries(ws, n):
        for i in range(n):
            dispute(ws, f"Always use tabs in module {i}", f"Never use tabs in module {i}")
        secret = key("agent", ws)
        with CaptureQueriesContext(connection) as ctx:
            assert call("GET", "/disputes", secret).status_code == 200
        return len(ctx.captured_queries)

    assert queries(workspace, 2) == queries(other_workspace, 20)


@pytest.mark.parametrize(
    ("resolution", "archived"), [("keep_both", []), ("keep_first", ["b"]), ("keep_second", ["a"])]
)
def test_an_operator_resolves_a_dispute(workspace, key, resolution, archived):
    d = dispute(workspace)
    response = call("POST", f"/disputes/{d.pk}/resolve", key("operator"), {"resolution": resolution})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dispute"]["status"] == "resolved" and body["dispute"]["resolution"] == resolution
    expected = sorted({"a": d.entry_a_id, "b": d.entry_b_id}[x] for x in archived)
    assert sorted(body["archived"]) == expected
    for entry_id in (d.entry_a_id, d.entry_b_id):
        assert Entry.objects.get(pk=entry_id).status == ("archived" if entry_id in expected else "active")
    # Resolving again is a conflict and changes nothing.
    again = call("POST", f"/disputes/{d.pk}/resolve", key("operator"), {"resolution": "keep_both"})
    assert again.status_code == 409


def test_supersede_links_the_winner_to_the_loser(workspace, key):
    d = dispute(workspace)
    body = call(
        "POST",
        f"/disputes/{d.pk}/resolve",
        key("operator"),
        {"resolution": "supersede", "winner_id": d.entry_a_id},
    ).json()
    assert body["archived"] == [d.entry_b_id]
    assert (
        Entry.objects.get(pk=d.entry_a_id)
        .links_out.filter(type="supersedes", to_entry_id=d.entry_b_id)
        .exists()
    )


def test_resolving_refuses_bad_input_and_other_workspaces(workspace, other_workspace, key):
    d = dispute(workspace)
    theirs = dispute(other_workspace)
    operator = key("operator")
    assert (
        call("POST", f"/disputes/{theirs.pk}/resolve", operator, {"resolution": "keep_both"}).status_code
        == 404
    )
    assert call("POST", "/disputes/999999/resolve", operator, {"resolution": "keep_both"}).status_code == 404
    for body in ({}, {"resolution": "merge"}, {"resolution": "keep_both", "extra": 1}, {"resolution": 1}):
        assert call("POST", f"/disputes/{d.pk}/resolve", operator, body).status_code == 422, body
    outsider = new_entries.entry_create(workspace=workspace, content="unrelated")
    refused = call(
        "POST", f"/disputes/{d.pk}/resolve", operator, {"resolution": "supersede", "winner_id": outsider.pk}
    )
    assert 400 <= refused.status_code < 500
    assert (
        call("POST", f"/disputes/{d.pk}/resolve", key("agent"), {"resolution": "keep_both"}).status_code
        == 403
    )
    d.refresh_from_db()
    assert d.status == "open"
    assert set(
        Entry.objects.filter(pk__in=[d.entry_a_id, d.entry_b_id]).values_list("status", flat=True)
    ) == {"active"}
