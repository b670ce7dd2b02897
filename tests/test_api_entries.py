"""The memory endpoints of the agent API: entries, lifecycle, links and anchors."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from maintenance.models import Backup
from memory import accounts, entry_changes, entry_signals, new_entries, relationships, scoring
from memory.models import CodeAnchor, Entry, EntryAccess, LifecycleEvent, Relationship, Tag, Tombstone
from memory.models.choices import Status

API = "/api/v1"
CSRF_TOKEN = "csrftokencsrftokencsrftokencsrft"  # 32 characters, as Django makes them


@pytest.fixture(autouse=True)
def _no_rate_limit(settings):
    # Key ids repeat across tests and the limit's window is a wall-clock minute.
    settings.API_RATE_LIMIT_PER_MINUTE = 0


class Caller:
    """A test client that sends JSON with one bearer key (or none)."""

    def __init__(self, raw: str | None, client: Client | None = None, **headers: str):
        self.client = client or Client()
        self.headers = dict(headers)
        if raw:
            self.headers["HTTP_AUTHORIZATION"] = f"Bearer {raw}"

    def _send(self, method: str, path: str, body: Any = None, **extra: Any) -> Any:
        kwargs: dict[str, Any] = {**self.headers, **extra}
        if body is not None:
            kwargs["data"] = body if isinstance(body, bytes | str) else json.dumps(body)
            kwargs["content_type"] = "application/json"
        response = getattr(self.client, method)(API + path, **kwargs)
        assert response["Content-Type"].startswith("application/json"), response.content[:200]
        response.body = response.json()
        return response

    def get(self, path: str, **extra: Any) -> Any:
        return self._send("get", path, **extra)

    def post(self, path: str, body: Any = None, **extra: Any) -> Any:
        return self._send("post", path, body, **extra)

    def patch(self, path: str, body: Any = None, **extra: Any) -> Any:
        return self._send("patch", path, body, **extra)

    def delete(self, path: str, **extra: Any) -> Any:
        return self._send("delete", path, **extra)


@pytest.fixture
def agent(workspace) -> Caller:
    _, raw = accounts.api_key_create(workspace=workspace, name="agent", role="agent")
    return Caller(raw)


@pytest.fixture
def operator(workspace) -> Caller:
    _, raw = accounts.api_key_create(workspace=workspace, name="operator", role="operator")
    return Caller(raw)


@pytest.fixture
def stranger(other_workspace) -> Caller:
    """An admin key of another workspace."""
    _, raw = accounts.api_key_create(workspace=other_workspace, name="stranger", role="admin")
    return Caller(raw)


def make(workspace, content: str = "Use the connection pool for every worker.", **fields: Any) -> Entry:
    return new_entries.entry_create(workspace=workspace, content=content, **fields)


# --- create ---------------------------------------------------------------------------------------


def test_timestamps_are_iso_8601_utc_with_microseconds(workspace, agent):
    # The stored instant, exactly: a client can send it back or compare it without losing the
    # sub-millisecond part (Django's JSON encoder cut it to milliseconds).
    at = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
    entry = make(workspace, created_at=at, now=at)
    body = agent.get(f"/entries/{entry.pk}").body
    assert body["created_at"] == "2026-03-04T05:06:07.123456Z"
    assert datetime.fromisoformat(body["created_at"]) == at
    listed = agent.get("/entries").body["items"]
    assert [item["created_at"] for item in listed] == ["2026-03-04T05:06:07.123456Z"]


def test_an_agent_creates_an_entry_with_tags_anchors_and_links(workspace, agent):
    target = make(workspace, "The pool size is 20.")
    response = agent.post(
        "/entries",
        {
            "content": "Raise the pool size when the queue backs up.",
            "title": "Pool size",
            "entry_type": "decision",
            "tier": "semantic",
            "impact_score": 0.6,
            "significance_type": "architecture",
            "project": "billing",
            "session_key": "s-1",
            "external_id": "ext-1",
            "metadata": {"ticket": "OPS-7", "nested": [1, 2.5, None]},
            "tags": ["db", "perf", "db"],
            "anchors": [{"path": "app/pool.py", "repo": "acme/app", "commit": "abc1234", "line_start": 3}],
            "links": [{"to_id": target.pk, "type": "caused"}],
        },
    )
    assert response.status_code == 201, response.body
    body = response.body
    entry = Entry.objects.get(pk=body["id"])
    assert entry.workspace == workspace and entry.lineage_id == entry.pk
    assert body["title"] == "Pool size" and body["entry_type"] == "decision" and body["tier"] == "semantic"
    assert body["tags"] == ["db", "perf"]
    assert body["metadata"] == {"ticket": "OPS-7", "nested": [1, 2.5, None]}
    assert body["status"] == "active" and body["source"] == "agent" and body["is_latest"] is True
    assert body["importance"] == pytest.approx(entry.importance) and body["importance"] > 0
    assert CodeAnchor.objects.get(entry=entry).path == "app/pool.py"
    assert Relationship.objects.filter(from_entry=entry, to_entry=target, type="caused").exists()
    event = LifecycleEvent.objects.get(entry=entry)
    assert event.reason == "create" and event.actor.startswith("key:")


def test_a_staged_class_creates_a_staged_trace(workspace, agent):
    response = agent.post("/entries", {"content": "Maybe retry twice.", "staged_class": "evidence"})
    assert response.status_code == 201
    assert response.body["status"] == "staged" and response.body["ttl_expires_at"] is not None


def test_creating_without_a_key_or_with_a_revoked_key_is_unauthenticated(workspace):
    assert Caller(None).post("/entries", {"content": "x"}).status_code == 401
    key, raw = accounts.api_key_create(workspace=workspace, name="old", role="agent")
    accounts.api_key_revoke(workspace=workspace, key_id=key.pk)
    response = Caller(raw).post("/entries", {"content": "x"})
    assert response.status_code == 401 and "detail" in response.body
    assert Caller("msk_not-a-key").get("/entries").status_code == 401
    assert not Entry.objects.exists()


def test_agents_may_not_write_operator_or_system_sources(workspace, agent, operator):
    for source in ("operator", "system"):
        response = agent.post("/entries", {"content": "A rule.", "source": source})
        assert response.status_code == 403, response.body
    assert not Entry.objects.exists()
    assert operator.post("/entries", {"content": "A rule.", "source": "operator"}).status_code == 201
    entry = make(workspace)
    assert agent.patch(f"/entries/{entry.pk}", {"source": "system"}).status_code == 403
    assert agent.patch(f"/entries/{entry.pk}", {"source": "import"}).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"content": "x", "colour": "red"},
        {"content": ""},
        {"content": "x" * 50_001},
        {"content": "x", "title": "t" * 201},
        {"content": "x", "entry_type": "poem"},
        {"content": "x", "tier": "eternal"},
        {"content": "x", "validation_status": "maybe"},
        {"content": "x", "significance_type": "huge"},
        {"content": "x", "staged_class": "vague"},
        {"content": "x", "impact_score": 1.5},
        {"content": "x", "trust_score": -0.1},
        {"content": "x", "salience": 0.1},
        {"content": "x", "tags": [f"t{i}" for i in range(51)]},
        {"content": "x", "tags": ["t" * 101]},
        {"content": "x", "tags": "db"},
        {"content": "x", "anchors": [{"path": f"f{i}.py"} for i in range(101)]},
        {"content": "x", "anchors": [{"path": "a.py", "line_start": 0}]},
        {"content": "x", "anchors": [{"path": "a.py", "line_start": 9, "line_end": 3}]},
        {"content": "x", "anchors": [{"path": "a.py", "status": "valid"}]},
        {"content": "x", "links": [{"to_id": i + 1} for i in range(101)]},
        {"content": "x", "links": [{"to_id": 2**70}]},
        {"content": "x", "links": [{"to_id": 1, "type": "loves"}]},
        {"content": "x", "metadata": [1, 2]},
        {"content": "x\x00y"},
        {"content": "x", "project": "p\x00"},
        {"content": "x", "metadata": {"k": "v\x00"}},
        {"content": "   "},
        {"content": "x", "expires_at": "next tuesday"},
        {"content": "x", "expires_at": "9999-12-31T23:00:00-05:00"},
        {"content": "x", "pinned": "perhaps"},
        ["content", "x"],
        json.dumps("a JSON string, not an object"),
    ],
)
def test_invalid_entries_are_refused_with_422_and_write_nothing(workspace, agent, body):
    response = agent.post("/entries", body)
    assert response.status_code == 422, response.body
    assert "detail" in response.body
    assert not Entry.objects.exists()


def test_metadata_that_no_database_can_store_is_refused(workspace, agent):
    for raw in ('{"content": "x", "metadata": {"n": NaN}}', '{"content": "x", "metadata": {"s": "\\ud800"}}'):
        response = agent.post("/entries", raw)
        assert response.status_code == 422, response.body
    response = agent.post("/entries", '{"content": "\\ud800"}')
    assert response.status_code == 422
    assert not Entry.objects.exists()


@pytest.mark.parametrize("raw", [b'{"content": ', b"\xff\xfe{not json", b"{'content': 'x'}", b"[" * 100_000])
def test_malformed_or_non_utf8_json_answers_400(workspace, agent, raw):
    response = agent.post("/entries", raw)
    assert response.status_code == 400, response.body
    assert "detail" in response.body


def test_an_oversized_body_answers_413_json(workspace, agent, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = agent.post("/entries", {"content": "x" * 2000})
    assert response.status_code == 413 and response.body == {"detail": "request body too large"}
    assert not Entry.objects.exists()


def test_a_create_that_fails_halfway_writes_nothing(workspace, other_workspace, agent):
    foreign = make(other_workspace)
    response = agent.post("/entries", {"content": "x", "tags": ["new-tag"], "links": [{"to_id": foreign.pk}]})
    assert response.status_code == 404
    assert Entry.objects.filter(workspace=workspace).count() == 0
    assert not Tag.objects.filter(name="new-tag").exists()


def test_a_duplicate_external_id_conflicts(workspace, agent):
    make(workspace, external_id="ext-1")
    response = agent.post("/entries", {"content": "other", "external_id": "ext-1"})
    assert response.status_code == 409 and "ext-1" in response.body["detail"]


# --- list -----------------------------------------------------------------------------------------


def test_the_list_shows_latest_visible_entries_by_importance(workspace, agent, now):
    low = make(workspace, "Low.", impact_score=0.0)
    high = make(workspace, "High.", impact_score=1.0)
    archived = make(workspace, "Archived.")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual"
    )
    staged = make(workspace, "Staged.", staged_class="evidence")
    gone = make(workspace, "Gone.")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)
    old = make(workspace, "Old text.")
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="New text.").entry

    body = agent.get("/entries").body
    ids = [item["id"] for item in body["items"]]
    assert set(ids) == {low.pk, high.pk, new.pk}
    assert ids[0] == high.pk and ids.index(high.pk) < ids.index(low.pk)
    assert body["count"] == 3 and body["limit"] == 50 and body["offset"] == 0
    assert "anchors" not in body["items"][0] and "links" not in body["items"][0]

    with_archived = {i["id"] for i in agent.get("/entries?include_archived=true").body["items"]}
    assert with_archived == {low.pk, high.pk, new.pk, archived.pk}
    with_staged = {i["id"] for i in agent.get("/entries?include_staged=true").body["items"]}
    assert with_staged == {low.pk, high.pk, new.pk, staged.pk}
    assert [i["id"] for i in agent.get("/entries?status=archived").body["items"]] == [archived.pk]
    assert [i["id"] for i in agent.get("/entries?status=staged").body["items"]] == [staged.pk]
    assert agent.get("/entries?status=tombstoned").status_code == 422


def test_the_list_filters_by_type_tier_project_and_sorts(workspace, agent):
    a = make(workspace, "A.", entry_type="rule", tier="procedural", project="p1")
    b = make(workspace, "B.", entry_type="decision", project="p2", salience=2.0)
    c = make(workspace, "C.", entry_type="rule", project="p2", salience=0.25)

    def ids(query: str) -> list[int]:
        response = agent.get(f"/entries?{query}")
        assert response.status_code == 200, response.body
        return [i["id"] for i in response.body["items"]]

    assert set(ids("entry_type=rule")) == {a.pk, c.pk}
    assert ids("tier=procedural") == [a.pk]
    assert set(ids("project=p2")) == {b.pk, c.pk}
    assert ids("project=p2&entry_type=rule") == [c.pk]
    assert ids("sort=recent") == [c.pk, b.pk, a.pk]
    assert ids("sort=retention")[0] == b.pk and ids("sort=retention")[-1] == c.pk
    assert ids("sort=recent&limit=1&offset=1") == [b.pk]
    assert agent.get("/entries?sort=recent&limit=1&offset=1").body["count"] == 3


def test_the_tag_filter_matches_this_workspaces_tag_only(workspace, other_workspace, agent):
    tagged = make(workspace, "Tagged.", tags=["db", "perf"])
    make(workspace, "Untagged.", tags=["perf"])
    make(other_workspace, "Foreign.", tags=["db"])
    body = agent.get("/entries?tag=db").body
    assert [i["id"] for i in body["items"]] == [tagged.pk] and body["count"] == 1
    assert body["items"][0]["tags"] == ["db", "perf"]
    assert agent.get("/entries?tag=nope").body["count"] == 0


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=501",
        "limit=-1",
        "offset=-1",
        "offset=99999999999999999999",
        "sort=best",
        "entry_type=poem",
        "include_archived=perhaps",
        "limit=ten",
        "tag=" + "t" * 101,
        "project=a%00b",
    ],
)
def test_bad_list_parameters_answer_422(workspace, agent, query):
    response = agent.get(f"/entries?{query}")
    assert response.status_code == 422, response.body


def test_listing_costs_the_same_number_of_queries_for_5_and_50_entries(workspace, agent):
    def count_queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            response = agent.get("/entries?limit=100")
        assert response.status_code == 200
        return len(ctx.captured_queries)

    agent.get("/entries")  # the key's last_used_at is written on first use only
    for i in range(5):
        make(workspace, f"Entry {i}.", tags=["a", f"t{i}"])
    five = count_queries()
    for i in range(5, 50):
        make(workspace, f"Entry {i}.", tags=["a", f"t{i}"])
    fifty = count_queries()
    assert fifty == five <= 4
    assert len(agent.get("/entries?limit=100").body["items"]) == 50


def test_another_workspaces_entries_are_invisible(workspace, other_workspace, agent, stranger):
    make(workspace)
    assert stranger.get("/entries").body["count"] == 0


# --- detail ---------------------------------------------------------------------------------------


def test_the_detail_breakdown_equals_the_scoring_functions(workspace, agent, now):
    with time_machine.travel(now, tick=False):
        entry = make(
            workspace,
            "Retry with backoff.",
            impact_score=0.4,
            trust_score=0.7,
            validation_status="passed",
            tags=["net"],
            anchors=[{"path": "a.py", "status": "valid"}, {"path": "b.py", "status": "stale"}],
        )
        ends = [make(workspace, f"End {i}.") for i in range(4)]
        relationships.relationship_create(
            workspace=workspace, from_id=entry.pk, to_id=ends[0].pk, type="caused"
        )
        relationships.relationship_create(
            workspace=workspace, from_id=ends[1].pk, to_id=entry.pk, type="resolved"
        )
        relationships.relationship_create(workspace=workspace, from_id=entry.pk, to_id=ends[2].pk)
        pruned, _ = relationships.relationship_create(workspace=workspace, from_id=ends[3].pk, to_id=entry.pk)
        Relationship.objects.filter(pk=pruned.pk).update(pruned_at=now)
        gone = make(workspace, "Gone.")
        relationships.relationship_create(workspace=workspace, from_id=entry.pk, to_id=gone.pk, type="caused")
        entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)
        entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor="a1")
        entry_signals.entry_record_access(workspace=workspace, entry_id=entry.pk, actor="a2")
        created = Entry.objects.get(pk=entry.pk).created_at

    later = now + timedelta(days=10, hours=3)
    with time_machine.travel(later, tick=False):
        response = agent.get(f"/entries/{entry.pk}")
    assert response.status_code == 200, response.body
    body = response.body
    expected = scoring.importance_breakdown(
        impact_score=0.4,
        significance_type=None,
        relationship_count=3,
        causal_count=2,
        age_days=(later - created).total_seconds() / 86400,
        trust_score=0.7,
        validation_status="passed",
        anchor_status="stale",
    )
    breakdown = body["importance_breakdown"]
    for name in (
        "significance",
        "relationships",
        "causal",
        "recency",
        "anchor_multiplier",
        "trust_multiplier",
    ):
        assert breakdown[name] == pytest.approx(getattr(expected, name), abs=1e-12), name
    assert breakdown["importance"] == pytest.approx(expected.importance, abs=1e-12)
    assert breakdown["relationship_count"] == 3 and breakdown["causal_count"] == 2
    assert breakdown["anchor_status"] == "stale"
    assert body["readers"] == 2 and body["access_count"] == 2 and body["tags"] == ["net"]
    assert [a["path"] for a in body["anchors"]] == ["a.py", "b.py"]
    links = {(link["direction"], link["other_id"], link["type"]) for link in body["links"]}
    assert links == {
        ("out", ends[0].pk, "caused"),
        ("in", ends[1].pk, "resolved"),
        ("out", ends[2].pk, "references"),
        ("in", ends[3].pk, "references"),
        ("out", gone.pk, "caused"),
    }
    assert next(link for link in body["links"] if link["id"] == pruned.pk)["pruned_at"] is not None


def test_the_detail_breakdown_matches_the_stored_importance_at_the_same_instant(workspace, agent, now):
    with time_machine.travel(now, tick=False):
        entry = make(workspace, "Pin the versions.", significance_type="lesson_learned")
        body = agent.get(f"/entries/{entry.pk}").body
    assert body["importance_breakdown"]["importance"] == pytest.approx(body["importance"], abs=1e-9)


def test_the_detail_costs_a_constant_number_of_queries(workspace, agent):
    entry = make(workspace, tags=["a", "b"], anchors=[{"path": "a.py"}, {"path": "b.py"}])
    agent.get(f"/entries/{entry.pk}")
    with CaptureQueriesContext(connection) as small:
        agent.get(f"/entries/{entry.pk}")
    for i in range(10):
        other = make(workspace, f"Other {i}.")
        relationships.relationship_create(workspace=workspace, from_id=entry.pk, to_id=other.pk)
    entry_changes.entry_update(
        workspace=workspace, entry_id=entry.pk, anchors=[{"path": f"{i}.py"} for i in range(9)]
    )
    with CaptureQueriesContext(connection) as big:
        response = agent.get(f"/entries/{entry.pk}")
    assert len(response.body["links"]) == 10 and len(response.body["anchors"]) == 9
    assert len(big.captured_queries) == len(small.captured_queries)


def test_a_tombstoned_entry_is_not_found_but_an_archived_one_is(workspace, agent):
    archived = make(workspace, "Archived.")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual"
    )
    assert agent.get(f"/entries/{archived.pk}").body["status"] == "archived"
    old = make(workspace, "First.")
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="Second.").entry
    entry_changes.entry_tombstone(workspace=workspace, entry_id=new.pk)
    assert agent.get(f"/entries/{new.pk}").status_code == 404
    assert agent.get(f"/entries/{old.pk}").status_code == 404  # its lineage is tombstoned


def test_an_old_version_is_readable_by_its_id(workspace, agent):
    old = make(workspace, "First.")
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="Second.").entry
    body = agent.get(f"/entries/{old.pk}").body
    assert body["content"] == "First." and body["is_latest"] is False
    assert agent.get(f"/entries/{new.pk}").body["supersedes"] == old.pk


@pytest.mark.parametrize("path", ["abc", "1.5", str(2**70), str(2**63), "-1", "0", "%00"])
def test_ids_that_are_not_entry_ids_answer_404_or_422_never_500(workspace, agent, operator, path):
    make(workspace)
    for caller, method, suffix, body in [
        (agent, "get", "", None),
        (agent, "patch", "", {"title": "x"}),
        (agent, "delete", "", None),
        (operator, "delete", "?purge=true", None),
        (operator, "post", "/restore", None),
        (agent, "get", "/versions", None),
        (agent, "get", "/history", None),
        (agent, "post", "/access", {"actor": "a"}),
        (agent, "post", "/reinforce", None),
        (agent, "post", "/feedback", {"signal": "helpful"}),
    ]:
        send = getattr(caller, method)
        response = (
            send(f"/entries/{path}{suffix}", body) if body is not None else send(f"/entries/{path}{suffix}")
        )
        assert response.status_code in (404, 422), (method, suffix, response.status_code)
    assert agent.delete(f"/relationships/{path}").status_code in (404, 422)


def test_another_workspaces_entry_answers_404_everywhere(workspace, other_workspace, agent, operator):
    foreign = make(other_workspace)
    fid = foreign.pk
    assert agent.get(f"/entries/{fid}").status_code == 404
    assert agent.patch(f"/entries/{fid}", {"content": "mine now"}).status_code == 404
    assert agent.delete(f"/entries/{fid}").status_code == 404
    assert operator.delete(f"/entries/{fid}?purge=true").status_code == 404
    assert operator.post(f"/entries/{fid}/restore").status_code == 404
    assert agent.get(f"/entries/{fid}/versions").status_code == 404
    assert agent.get(f"/entries/{fid}/history").status_code == 404
    assert agent.post(f"/entries/{fid}/access", {"actor": "a"}).status_code == 404
    assert agent.post(f"/entries/{fid}/reinforce").status_code == 404
    assert agent.post(f"/entries/{fid}/feedback", {"signal": "wrong"}).status_code == 404
    mine = make(workspace)
    assert agent.post("/relationships", {"from_id": mine.pk, "to_id": fid}).status_code == 404
    foreign_link, _ = relationships.relationship_create(
        workspace=other_workspace, from_id=fid, to_id=make(other_workspace, "Other.").pk
    )
    assert agent.delete(f"/relationships/{foreign_link.pk}").status_code == 404
    foreign.refresh_from_db()
    assert foreign.content != "mine now" and foreign.status == Status.ACTIVE and foreign.access_count == 0
    assert Relationship.objects.filter(pk=foreign_link.pk).exists()


# --- update ---------------------------------------------------------------------------------------


def test_patching_content_makes_a_new_version(workspace, agent):
    entry = make(workspace, "First.", tags=["a"])
    response = agent.patch(f"/entries/{entry.pk}", {"content": "Second.", "title": "T", "tags": ["b"]})
    assert response.status_code == 200, response.body
    body = response.body
    assert body["new_version"] is True and body["supersedes"] == entry.pk
    assert body["entry"]["id"] != entry.pk and body["entry"]["supersedes"] == entry.pk
    assert body["entry"]["content"] == "Second." and body["entry"]["title"] == "T"
    assert body["entry"]["tags"] == ["b"] and body["entry"]["lineage_id"] == entry.pk
    entry.refresh_from_db()
    assert entry.is_latest is False and entry.content == "First."


def test_patching_identical_content_changes_fields_in_place(workspace, agent):
    entry = make(workspace, "Same.")
    body = agent.patch(
        f"/entries/{entry.pk}", {"content": "Same.", "pinned": True, "significance_type": "release"}
    ).body
    assert body["new_version"] is False and body["supersedes"] is None
    assert body["entry"]["id"] == entry.pk and body["entry"]["pinned"] is True
    assert body["entry"]["created_at"] == agent.get(f"/entries/{entry.pk}").body["created_at"]
    cleared = agent.patch(f"/entries/{entry.pk}", {"significance_type": None}).body
    assert cleared["entry"]["significance_type"] is None and cleared["entry"]["pinned"] is True


def test_patching_refuses_old_versions_tombstones_and_bad_fields(workspace, agent):
    old = make(workspace, "First.")
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="Second.").entry
    assert agent.patch(f"/entries/{old.pk}", {"title": "x"}).status_code == 409
    assert agent.patch(f"/entries/{new.pk}", {"staged_class": "evidence"}).status_code == 422
    assert agent.patch(f"/entries/{new.pk}", {"content": ""}).status_code == 422
    assert agent.patch(f"/entries/{new.pk}", {"entry_type": None}).status_code == 422
    assert agent.patch(f"/entries/{new.pk}", {"links": []}).status_code == 422
    entry_changes.entry_tombstone(workspace=workspace, entry_id=new.pk)
    assert agent.patch(f"/entries/{new.pk}", {"title": "x"}).status_code == 409


def test_a_viewer_cannot_patch(workspace):
    entry = make(workspace)
    viewer = _member_session(workspace, "viewer")
    response = viewer.patch(f"/entries/{entry.pk}", {"title": "x"})
    assert response.status_code == 403, response.body


# --- delete, purge, restore -------------------------------------------------------------------------


def test_deleting_tombstones_the_entry_with_reason_api(workspace, agent):
    entry = make(workspace)
    response = agent.delete(f"/entries/{entry.pk}")
    assert response.status_code == 200, response.body
    body = response.body
    tomb = Tombstone.objects.get(entry=entry)
    assert body["id"] == tomb.pk and body["entry_id"] == entry.pk and body["reason"] == "api"
    # Django's JSON encoder writes milliseconds.
    assert abs(datetime.fromisoformat(body["purge_after"]) - tomb.purge_after) < timedelta(milliseconds=1)
    entry.refresh_from_db()
    assert entry.status == Status.TOMBSTONED
    assert agent.delete(f"/entries/{entry.pk}").status_code == 409
    assert agent.get("/entries").body["count"] == 0


def test_purge_needs_the_operator_role(workspace, agent):
    entry = make(workspace)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk)
    assert agent.delete(f"/entries/{entry.pk}?purge=true").status_code == 403
    assert Entry.objects.filter(pk=entry.pk).exists()


def test_purging_an_entry_that_is_not_tombstoned_conflicts(workspace, operator, settings, tmp_path):
    settings.BACKUP_DIR = tmp_path
    entry = make(workspace)
    response = operator.delete(f"/entries/{entry.pk}?purge=true")
    assert response.status_code == 409, response.body
    assert Entry.objects.filter(pk=entry.pk).exists() and not Backup.objects.exists()


def test_purge_writes_a_backup_then_removes_the_whole_lineage(workspace, operator, settings, tmp_path):
    settings.BACKUP_DIR = tmp_path
    first = make(workspace, "First.", tags=["x"], anchors=[{"path": "a.py"}])
    neighbour = make(workspace, "Neighbour.")
    relationships.relationship_create(workspace=workspace, from_id=first.pk, to_id=neighbour.pk)
    entry_signals.entry_record_access(workspace=workspace, entry_id=first.pk, actor="reader")
    latest = entry_changes.entry_update(workspace=workspace, entry_id=first.pk, content="Second.").entry
    entry_changes.entry_tombstone(workspace=workspace, entry_id=latest.pk)
    keep = make(workspace, "Kept.")

    response = operator.delete(f"/entries/{first.pk}?purge=true")  # any version's id will do
    assert response.status_code == 200, response.body
    body = response.body
    assert body["purged"] is True and body["entry_id"] == latest.pk and body["lineage_id"] == first.pk
    backup = Backup.objects.get(workspace=workspace)
    assert backup.reason == "pre-prune" and body["backup_file"] == backup.file_name
    assert (Path(tmp_path) / workspace.slug / backup.file_name).is_file()
    assert backup.entry_count >= 3  # written before the delete: both versions were in it

    assert not Entry.objects.filter(lineage_id=first.pk).exists()
    assert not CodeAnchor.objects.filter(path="a.py").exists()
    assert not Relationship.objects.filter(to_entry=neighbour).exists()
    assert not EntryAccess.objects.filter(lineage_id=first.pk).exists()
    tomb = Tombstone.objects.get(entry_ref=latest.pk)
    assert tomb.entry is None and tomb.purged_at is not None and tomb.content_hash
    event = LifecycleEvent.objects.get(entry_ref=latest.pk, to_status="purged")
    assert event.automatic is False and event.actor.startswith("key:")
    assert Entry.objects.filter(pk__in=[neighbour.pk, keep.pk]).count() == 2
    assert operator.delete(f"/entries/{latest.pk}?purge=true").status_code == 404


def test_a_failed_backup_purges_nothing(workspace, operator, settings, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    settings.BACKUP_DIR = blocker
    entry = make(workspace)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk)
    response = operator.delete(f"/entries/{entry.pk}?purge=true")
    assert 400 <= response.status_code < 500 and "detail" in response.body
    assert Entry.objects.filter(pk=entry.pk).exists()
    assert Tombstone.objects.get(entry=entry).purged_at is None


def test_an_operator_restores_a_tombstoned_entry(workspace, agent, operator):
    entry = make(workspace)
    agent.delete(f"/entries/{entry.pk}")
    assert agent.post(f"/entries/{entry.pk}/restore").status_code == 403
    response = operator.post(f"/entries/{entry.pk}/restore")
    assert response.status_code == 200, response.body
    assert response.body["status"] == "active"
    assert Tombstone.objects.get(entry=entry).restored_at is not None
    assert operator.post(f"/entries/{entry.pk}/restore").status_code == 409


# --- versions and history -----------------------------------------------------------------------------


def test_versions_are_listed_oldest_first_from_any_version(workspace, agent, now):
    with time_machine.travel(now, tick=False):
        v1 = make(workspace, "One.")
    with time_machine.travel(now + timedelta(minutes=1), tick=False):
        v2 = entry_changes.entry_update(workspace=workspace, entry_id=v1.pk, content="Two.").entry
    with time_machine.travel(now + timedelta(minutes=2), tick=False):
        v3 = entry_changes.entry_update(workspace=workspace, entry_id=v2.pk, content="Three.").entry
    body = agent.get(f"/entries/{v2.pk}/versions").body
    assert [i["id"] for i in body["items"]] == [v1.pk, v2.pk, v3.pk] and body["count"] == 3
    assert [i["is_latest"] for i in body["items"]] == [False, False, True]
    page = agent.get(f"/entries/{v3.pk}/versions?limit=1&offset=2").body
    assert [i["id"] for i in page["items"]] == [v3.pk] and page["count"] == 3


def test_history_lists_the_lineages_events_newest_first(workspace, agent, operator, now):
    with time_machine.travel(now, tick=False):
        entry = make(workspace, "Stale soon.")
    with time_machine.travel(now + timedelta(hours=1), tick=False):
        entry_changes.entry_set_status(
            workspace=workspace, entry_id=entry.pk, status="archived", reason="manual"
        )
    with time_machine.travel(now + timedelta(hours=2), tick=False):
        operator.post(f"/entries/{entry.pk}/restore")
    with time_machine.travel(now + timedelta(hours=3), tick=False):
        agent.delete(f"/entries/{entry.pk}")
    body = agent.get(f"/entries/{entry.pk}/history").body
    assert [(e["from_status"], e["to_status"], e["reason"]) for e in body["items"]] == [
        ("active", "tombstoned", "api"),
        ("archived", "active", "restore"),
        ("active", "archived", "manual"),
        ("", "active", "create"),
    ]
    # The restore held the entry; its own event says so.
    assert body["items"][1]["details"] == {"hold": "restore"}
    assert (
        body["count"] == 4
        and body["items"][0]["reason"] == "api"
        and body["items"][0]["entry_id"] == entry.pk
    )
    assert len(agent.get(f"/entries/{entry.pk}/history?limit=2").body["items"]) == 2
    assert agent.get(f"/entries/{entry.pk}/history?limit=501").status_code == 422


# --- access, reinforce, feedback ------------------------------------------------------------------------


def test_recording_access_counts_readers_and_dispatches(workspace, agent):
    entry = make(workspace)
    body = agent.post(f"/entries/{entry.pk}/access", {"actor": "claude-1", "dispatch": True}).body
    assert body["access_count"] == 1 and body["retrieval_count"] == 1 and body["last_accessed_at"]
    body = agent.post(f"/entries/{entry.pk}/access", {"actor": "claude-2"}).body
    assert body["access_count"] == 2 and body["retrieval_count"] == 1
    assert agent.get(f"/entries/{entry.pk}").body["readers"] == 2
    for bad in (
        {"actor": ""},
        {"actor": "a" * 201},
        {},
        {"actor": "a", "dispatch": "sometimes"},
        {"actor": "a", "x": 1},
    ):
        assert agent.post(f"/entries/{entry.pk}/access", bad).status_code == 422, bad
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk)
    assert agent.post(f"/entries/{entry.pk}/access", {"actor": "a"}).status_code == 409


def test_reinforcing_marks_the_entry(workspace, agent):
    entry = make(workspace)
    response = agent.post(f"/entries/{entry.pk}/reinforce")
    assert response.status_code == 200 and response.body["reinforced_at"] is not None


def test_feedback_steps_salience(workspace, agent):
    entry = make(workspace)
    assert agent.post(f"/entries/{entry.pk}/feedback", {"signal": "helpful"}).body["salience"] == 1.25
    body = agent.post(f"/entries/{entry.pk}/feedback", {"signal": "wrong"}).body
    assert body["salience"] == 0.25 and body["last_feedback"] == "wrong"
    assert agent.post(f"/entries/{entry.pk}/feedback", {"signal": "meh"}).status_code == 422
    assert agent.post(f"/entries/{entry.pk}/feedback", {}).status_code == 422


def test_a_viewer_can_read_but_not_record_access(workspace):
    entry = make(workspace)
    viewer = _member_session(workspace, "viewer")
    assert viewer.get(f"/entries/{entry.pk}").status_code == 200
    assert viewer.get("/entries").body["count"] == 1
    assert viewer.post(f"/entries/{entry.pk}/access", {"actor": "me"}).status_code == 403
    assert viewer.post(f"/entries/{entry.pk}/reinforce").status_code == 403
    assert viewer.delete(f"/entries/{entry.pk}").status_code == 403
    assert Entry.objects.get(pk=entry.pk).access_count == 0


# --- relationships ------------------------------------------------------------------------------------


def test_linking_twice_answers_duplicate_instead_of_a_second_link(workspace, agent):
    a, b = make(workspace, "A."), make(workspace, "B.")
    first = agent.post("/relationships", {"from_id": a.pk, "to_id": b.pk, "type": "caused"})
    assert first.status_code == 201, first.body
    assert first.body["duplicate"] is False and first.body["from_id"] == a.pk and first.body["to_id"] == b.pk
    again = agent.post("/relationships", {"from_id": a.pk, "to_id": b.pk, "type": "caused"})
    assert (
        again.status_code == 200 and again.body["duplicate"] is True and again.body["id"] == first.body["id"]
    )
    reverse = agent.post("/relationships", {"from_id": b.pk, "to_id": a.pk, "type": "caused"})
    assert reverse.status_code == 201
    assert Relationship.objects.count() == 2


def test_bad_links_are_refused(workspace, agent):
    a = make(workspace, "A.")
    gone = make(workspace, "Gone.")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)
    assert agent.post("/relationships", {"from_id": a.pk, "to_id": a.pk}).status_code == 422
    assert agent.post("/relationships", {"from_id": a.pk, "to_id": 999_999}).status_code == 404
    assert agent.post("/relationships", {"from_id": a.pk, "to_id": gone.pk}).status_code == 409
    assert agent.post("/relationships", {"from_id": a.pk, "to_id": 2**64}).status_code == 422
    assert agent.post("/relationships", {"from_id": a.pk, "to_id": gone.pk, "type": "x"}).status_code == 422
    assert agent.post("/relationships", {"from_id": a.pk}).status_code == 422
    assert not Relationship.objects.exists()


def test_unlinking_deletes_the_link(workspace, agent):
    a, b = make(workspace, "A."), make(workspace, "B.")
    rel, _ = relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=b.pk)
    response = agent.delete(f"/relationships/{rel.pk}")
    assert response.status_code == 200 and response.body == {"deleted": True}
    assert not Relationship.objects.exists()
    assert agent.delete(f"/relationships/{rel.pk}").status_code == 404


# --- anchors ------------------------------------------------------------------------------------------


def test_checking_anchor_files_marks_them_and_returns_counts(workspace, agent):
    entry = make(
        workspace,
        anchors=[
            {"path": "a.py", "repo": "acme/app", "content_hash": "h1"},
            {"path": "b.py", "repo": "acme/app", "content_hash": "h2"},
            {"path": "c.py", "repo": "acme/app", "content_hash": "h3"},
        ],
    )
    files = [
        {"path": "a.py", "content_hash": "h1"},
        {"path": "./b.py", "content_hash": "changed"},
        {"path": "c.py", "content_hash": None},
    ]
    response = agent.post("/anchors/check", {"repo": "acme/app", "files": files})
    assert response.status_code == 200, response.body
    assert response.body == {"checked": 3, "valid": 1, "stale": 1, "invalidated": 1, "changed": 2}
    statuses = dict(CodeAnchor.objects.filter(entry=entry).values_list("path", "status"))
    assert statuses == {"a.py": "valid", "b.py": "stale", "c.py": "invalidated"}


@pytest.mark.parametrize(
    "body",
    [
        {"repo": "r", "files": [{"path": "a.py"}]},  # a forgotten hash must not invalidate
        {"repo": "r", "files": [{"path": "", "content_hash": None}]},
        {"repo": "r", "files": [{"path": "a\x00.py", "content_hash": None}]},
        {"repo": "r", "files": [{"path": f"{i}.py", "content_hash": None} for i in range(5001)]},
        {"repo": "r"},
        {"repo": "r", "files": [], "extra": 1},
    ],
)
def test_bad_anchor_reports_are_refused_with_422(workspace, agent, body):
    make(workspace, anchors=[{"path": "a.py", "repo": "r"}])
    response = agent.post("/anchors/check", body)
    assert response.status_code == 422, response.body
    assert CodeAnchor.objects.get().status == "valid"


# --- member sessions ----------------------------------------------------------------------------------


def _member_session(workspace, role: str, *, csrf: bool = True) -> Caller:
    user = get_user_model().objects.create_user(username=f"{role}-user", password="pw")
    accounts.membership_set(workspace=workspace, user=user, role=role)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    headers = {"HTTP_X_WORKSPACE": workspace.slug}
    if csrf:
        client.cookies["csrftoken"] = CSRF_TOKEN
        headers["HTTP_X_CSRFTOKEN"] = CSRF_TOKEN
    return Caller(None, client, **headers)


def test_a_member_session_writes_only_with_the_csrf_token(workspace):
    without = _member_session(workspace, "operator", csrf=False)
    response = without.post("/entries", {"content": "From the browser."})
    assert response.status_code == 403 and "CSRF" in response.body["detail"]
    assert without.get("/entries").status_code == 200  # safe methods need no token
    assert not Entry.objects.exists()

    user = get_user_model().objects.get(username="operator-user")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.cookies["csrftoken"] = CSRF_TOKEN
    with_token = Caller(None, client, HTTP_X_WORKSPACE=workspace.slug, HTTP_X_CSRFTOKEN=CSRF_TOKEN)
    response = with_token.post("/entries", {"content": "From the browser.", "source": "operator"})
    assert response.status_code == 201, response.body
    assert LifecycleEvent.objects.get(entry_id=response.body["id"]).actor == "user:operator-user"


def test_a_session_needs_membership_of_the_named_workspace(workspace, other_workspace):
    member = _member_session(workspace, "admin")
    assert member.get("/entries", HTTP_X_WORKSPACE=other_workspace.slug).status_code == 401
    assert member.get("/entries", HTTP_X_WORKSPACE="").status_code == 401
    assert member.get(f"/entries?workspace={workspace.slug}", HTTP_X_WORKSPACE="").status_code == 200


def test_an_operator_session_purges_with_a_backup(workspace, settings, tmp_path):
    settings.BACKUP_DIR = tmp_path
    entry = make(workspace)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=timezone.now())
    operator = _member_session(workspace, "operator")
    response = operator.delete(f"/entries/{entry.pk}?purge=true")
    assert response.status_code == 200, response.body
    assert not Entry.objects.filter(pk=entry.pk).exists() and Backup.objects.count() == 1


def test_expires_at_is_stored_in_utc(workspace, agent):
    response = agent.post("/entries", {"content": "Temporary.", "expires_at": "2030-01-01T12:00:00+02:00"})
    assert response.status_code == 201, response.body
    entry = Entry.objects.get(pk=response.body["id"])
    assert entry.expires_at == datetime(2030, 1, 1, 10, 0, tzinfo=UTC)
    # The create response shows what a read shows (it is not re-read from the database).
    assert response.body["expires_at"] == agent.get(f"/entries/{entry.pk}").body["expires_at"]
    assert response.body["expires_at"].startswith("2030-01-01T10:00:00")
    naive = agent.post("/entries", {"content": "Naive.", "expires_at": "2030-01-01T12:00:00"}).body
    assert Entry.objects.get(pk=naive["id"]).expires_at == datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_a_page_past_the_end_is_empty_with_the_true_count(workspace, agent):
    for n in range(3):
        new_entries.entry_create(workspace=workspace, content=f"counted memory {n}")
    for offset in (3, 10, 1000):
        body = agent.get(f"/entries?limit=2&offset={offset}").json()
        assert (body["items"], body["count"]) == ([], 3), offset


def test_a_list_counts_exactly_up_to_the_bound_then_serves_a_cached_count(workspace, agent, monkeypatch):
    from django.core.cache import cache

    from memory import selectors

    monkeypatch.setattr(selectors, "COUNT_EXACT_UP_TO", 3)
    for n in range(3):
        new_entries.entry_create(workspace=workspace, content=f"counted memory {n}")
    cache.clear()
    assert agent.get("/entries?limit=2").json()["count"] == 3  # exact at the bound
    new_entries.entry_create(workspace=workspace, content="counted memory 3")
    assert agent.get("/entries?limit=2").json()["count"] == 4  # above it: counted, then cached
    new_entries.entry_create(workspace=workspace, content="counted memory 4")
    assert agent.get("/entries?limit=2").json()["count"] == 4  # the cached total, for a while
    assert agent.get("/entries?limit=1").json()["count"] == 4  # the page size is not the query
    # A page that is not full is the last one: its count is exact without counting.
    assert agent.get("/entries?limit=50").json()["count"] == 5
    assert agent.get("/entries?limit=2&offset=4").json()["count"] == 5
    assert agent.get("/entries?limit=2&offset=2").json()["count"] == 4  # full page: the cache
    assert agent.get("/entries?limit=1&offset=4").json()["count"] == 5  # never below what it shows
    cache.clear()
    assert agent.get("/entries").json()["count"] == 5


def test_a_write_scores_with_the_policy_its_own_request_read(workspace, agent):
    # The key lookup reads the workspace's policy in the same query; a policy changed between
    # two requests is what the next write uses, and no write reads it a second time.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from memory.policy_model import MaintenancePolicy

    retentions = []
    for salience_default in (0.5, 1.5):
        MaintenancePolicy.objects.update_or_create(
            workspace=workspace, defaults={"salience_default": salience_default}
        )
        with CaptureQueriesContext(connection) as queries:
            response = agent.post("/entries", {"content": f"scored with {salience_default}"})
        assert response.status_code == 201, response.body
        policy_reads = [
            q["sql"] for q in queries.captured_queries if "maintenance_maintenancepolicy" in q["sql"]
        ]
        assert len(policy_reads) == 1 and "memory_apikey" in policy_reads[0]
        retentions.append(Entry.objects.get(pk=response.body["id"]).retention)
    assert retentions == [pytest.approx(0.5), pytest.approx(1.5)]


@pytest.mark.parametrize(
    "path", ["/entries?project=a&project=b", "/search?q=x&q=y", "/maintenance/runs?limit=1&limit=2"]
)
def test_a_query_parameter_given_twice_is_refused(agent, path):
    # Every query parameter of the API is one value; Django would silently take the last
    # (found by the schema fuzz test: a repeated `project` was accepted).
    response = agent.get(path)
    assert response.status_code == 422
    assert "more than once" in response.body["detail"]


@pytest.mark.parametrize("raw", ["%0A{}", "%20{}", "{}%20", "+{}", "{}.0", "{}_0"])
@pytest.mark.parametrize("route", ["/entries/{}", "/entries/{}/reinforce", "/maintenance/runs/{}"])
def test_a_path_id_not_written_as_an_integer_is_refused(workspace, agent, raw, route):
    # pydantic's lax parsing read "\n6" as 6 (found by the schema fuzz test: a reinforce of
    # "%0A6" was answered 200); the schema says integer.
    entry = make(workspace)
    method = agent.post if route.endswith("reinforce") else agent.get
    response = method(route.format(raw.format(entry.pk)))
    assert response.status_code == 422, response.body
    assert "must be an integer" in response.body["detail"]
    assert method(route.format(entry.pk)).status_code in (200, 404)  # the plain id still works
    assert agent.get("/entries/-1").status_code == 404  # a negative id is not found, as before


def test_a_tombstoned_lineages_versions_are_not_found_but_its_history_is_kept(workspace, agent):
    old = make(workspace, "First.")
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="Second.").entry
    assert agent.get(f"/entries/{old.pk}/versions").body["count"] == 2
    entry_changes.entry_tombstone(workspace=workspace, entry_id=new.pk)
    for version in (old, new):
        response = agent.get(f"/entries/{version.pk}/versions")
        assert response.status_code == 404 and "First." not in json.dumps(response.body)
    # The lifecycle events carry no content: the audit trail of why it went stays readable.
    history = agent.get(f"/entries/{old.pk}/history").body
    assert history["items"][0]["to_status"] == "tombstoned"
    entry_changes.entry_restore(workspace=workspace, entry_id=new.pk)
    assert agent.get(f"/entries/{old.pk}/versions").body["count"] == 2


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("get", "/nope", 404),
        ("get", "/entries/1/", 404),  # a trailing slash is not an endpoint
        ("post", "/entries/1/versions", 405),
        ("put", "/entries/1", 405),
        ("put", "/maintenance/run", 405),
        ("delete", "/search", 405),
    ],
)
@pytest.mark.parametrize("authenticated", [True, False])
def test_unknown_paths_and_methods_answer_the_json_error_shape(agent, method, path, status, authenticated):
    headers = agent.headers if authenticated else {}
    response = getattr(agent.client, method)(API + path, **headers)
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    assert set(response.json()) == {"detail"} and response.json()["detail"]
    if status == 405:
        assert response["Allow"]  # which methods the path does take


def test_a_json_404_keeps_the_headers_the_inner_layers_set(db, settings):
    settings.DEBUG = False
    response = Client().get(API + "/nope", secure=True)
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"


def test_the_async_middleware_chain_answers_json_too(db):
    # Django's async request handler, as under any ASGI server other than ours
    # (config.asgi; served for real in tests/test_serve.py).
    from django.test import AsyncClient

    from tests.test_asgi import _run

    async def calls() -> tuple[Any, Any]:
        return await AsyncClient().put(API + "/health"), await AsyncClient().get(API + "/nope")

    refused, missing = _run(calls)
    assert refused.status_code == 405 and refused["Content-Type"] == "application/json"
    assert "GET" in refused["Allow"] and set(refused.json()) == {"detail"}
    assert missing.status_code == 404 and missing["Content-Type"] == "application/json"


def test_pages_outside_the_api_keep_their_html_errors(db, client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404 and "application/json" not in response["Content-Type"]
