"""The MCP endpoint for real: uvicorn (``manage.py serve``) started here on a database of its
own, spoken to by the official SDK's client over Streamable HTTP (and over stdio), its answers
compared with the JSON API's for the same data.

Roles and workspace isolation of every tool, and arguments generated from the advertised
schemas, are in test_mcp_isolation.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters

from tests.mcp_live import RATE_LIMIT, ROOT, Alternating, Live, McpClient, free_port

TOOLS = {
    "memory_store",
    "memory_search",
    "memory_get",
    "memory_recent",
    "memory_update",
    "memory_forget",
    "memory_feedback",
    "memory_access",
    "memory_link",
    "memory_maintenance_preview",
    "memory_stats",
}
READ_ONLY = {"memory_search", "memory_get", "memory_recent", "memory_maintenance_preview", "memory_stats"}
MISSING = 9_999_999  # an id no seeded row has


@pytest.fixture(scope="module")
def live(mcp_live: Live) -> Live:
    return mcp_live


@pytest.fixture(scope="module")
def clients(live: Live) -> Iterator[dict[tuple[str, str], McpClient]]:
    opened: dict[tuple[str, str], McpClient] = {}
    yield opened
    for each in opened.values():
        each.close()


@pytest.fixture
def mcp(live: Live, clients: dict[tuple[str, str], McpClient]):
    """``mcp(slug, key_name)``: a connected client with that workspace's key (one per module)."""

    def connect(slug: str = "acme", name: str = "agent") -> McpClient:
        if (slug, name) not in clients:
            clients[slug, name] = McpClient(live.url, live.key(slug, name))
        return clients[slug, name]

    return connect


def ok(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content[0].text
    assert result.structured_content is not None
    # The text the model reads is the same object.
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def refused(result: Any, tool: str, *fragments: str) -> str:
    """A tool error (never the SDK's bare internal-error text) containing each fragment."""
    assert result.is_error, result.structured_content
    text = result.content[0].text
    assert text.startswith(f"Error executing tool {tool}: "), text  # a bare name is a crash
    for fragment in fragments:
        assert fragment in text, text
    return text


def _raw(
    live: Live,
    key: str | None,
    body: Any,
    headers: dict[str, str] | None = None,
    http: httpx2.Client | None = None,
) -> httpx2.Response:
    """A hand-written JSON-RPC POST."""
    head = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if key:
        head["Authorization"] = f"Bearer {key}"
    if http is None:
        return httpx2.post(live.url, json=body, headers={**head, **(headers or {})}, timeout=30)
    return http.post(live.url, json=body, headers={**head, **(headers or {})})


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


# --- discovery, schemas, auth ----------------------------------------------------------------------


def test_clients_of_both_protocols_discover_the_server_and_its_tools(live: Live, mcp) -> None:
    modern = mcp()
    assert modern.protocol_version == "2026-07-28"
    with McpClient(live.url, live.key("acme", "agent"), mode="legacy") as legacy:
        assert legacy.protocol_version.startswith("2025")
        assert {t.name for t in legacy.tools()} == TOOLS
    # A 2025 client gets no session to come back to: any process may answer its next request.
    answer = _raw(live, live.key("acme", "agent"), INITIALIZE)
    assert answer.status_code == 200, answer.text
    assert "mcp-session-id" not in answer.headers
    assert answer.json()["result"]["serverInfo"]["name"] == "memory-steward"


def test_every_tool_is_listed_with_strict_input_schema_output_schema_and_annotations(mcp) -> None:
    tools = {t.name: t for t in mcp().tools()}
    assert set(tools) == TOOLS
    assert not {name for name in tools if any(w in name for w in ("purge", "approve", "restore", "run"))}
    for name, tool in tools.items():
        assert tool.description and tool.title
        assert tool.input_schema["type"] == "object"
        assert tool.input_schema.get("additionalProperties") is False, name
        assert tool.output_schema and tool.output_schema["type"] == "object", name
        hints = tool.annotations
        assert hints.read_only_hint is (name in READ_ONLY), name
        assert hints.destructive_hint is (name == "memory_forget"), name
        assert hints.idempotent_hint is not None and hints.open_world_hint is False
    assert "workspace" not in json.dumps([t.input_schema for t in tools.values()])
    assert tools["memory_search"].input_schema["properties"]["limit"]["maximum"] == 500
    assert tools["memory_recent"].input_schema["properties"]["limit"]["maximum"] == 500


@pytest.mark.parametrize("key_name", [None, "wrong", "revoked"])
def test_a_missing_wrong_or_revoked_key_is_401_naming_the_protected_resource_metadata(
    live: Live, key_name: str | None
) -> None:
    key = {None: None, "wrong": "msk_not-a-key-of-ours", "revoked": live.key("acme", "revoked")}[key_name]
    answer = _raw(live, key, INITIALIZE)
    assert answer.status_code == 401
    challenge = answer.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    metadata_url = f"{live.base}/.well-known/oauth-protected-resource/mcp"
    assert f'resource_metadata="{metadata_url}"' in challenge
    for url in (metadata_url, f"{live.base}/.well-known/oauth-protected-resource"):
        metadata = httpx2.get(url, timeout=10).json()
        assert metadata["resource"] == live.url
        assert metadata["bearer_methods_supported"] == ["header"]
    with pytest.raises(Exception):  # noqa: B017 - the SDK's client refuses to connect, whatever its wording
        McpClient(live.url, key).close()


def test_the_key_check_is_the_api_s_one_door_last_used_at_and_the_rate_limit_shared(live: Live) -> None:
    key = live.key("acme", "limit")
    accepted = 0  # in a row: the limit counts in one-minute windows, and one may end meanwhile
    with httpx2.Client(timeout=30) as http:
        for _ in range(2 * RATE_LIMIT + 1):
            answer = _raw(live, key, INITIALIZE, http=http)
            if answer.status_code != 200:
                break
            accepted += 1
    assert answer.status_code == 429 and accepted >= RATE_LIMIT
    assert int(answer.headers["retry-after"]) >= 1
    assert answer.json()["detail"].startswith("rate limit exceeded")
    # The JSON API counts in the same bucket: the key is spent there too.
    status, body = live.api("GET", "/stats", key)
    assert status == 429 and body["detail"].startswith("rate limit exceeded")
    used = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from memory.models import ApiKey; "
            f"print(ApiKey.objects.get(prefix={key[:12]!r}).last_used_at is not None)",
        ],
        cwd=ROOT,
        env=live.env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert used.stdout.strip() == "True"


def test_hosts_not_allowed_are_refused_421_and_foreign_origins_403(live: Live) -> None:
    key = live.key("acme", "agent")
    assert _raw(live, key, INITIALIZE, {"Host": "evil.example"}).status_code == 421
    assert _raw(live, key, INITIALIZE, {"Origin": "http://evil.example"}).status_code == 403
    assert (
        _raw(live, key, INITIALIZE, {"Host": "localhost", "Origin": "http://localhost:3000"}).status_code
        == 200
    )


# --- every tool's happy path, next to the JSON API -------------------------------------------------


def _without_clock(detail: dict[str, Any]) -> dict[str, Any]:
    """An entry detail without what moves with the clock between two reads (its age)."""
    detail = json.loads(json.dumps(detail))
    for name in ("recency", "age_days", "importance"):
        detail["importance_breakdown"].pop(name, None)
    return detail


def test_store_get_update_and_the_json_api_see_the_same_memory(live: Live, mcp) -> None:
    client, key, ids = mcp(), live.key("acme", "agent"), live.ids("acme")
    stored = ok(
        client.call(
            "memory_store",
            {
                "content": "acme the release checklist lives in docs/release.md",
                "title": "acme release checklist",
                "entry_type": "decision",
                "tier": "semantic",
                "tags": ["release", "acme"],
                "anchors": [{"path": "docs/release.md", "repo": "acme"}],
                "links": [{"to_id": ids["entry"], "type": "references"}],
                "impact_score": 0.7,
                "trust_score": 0.9,
                "significance_type": "decision",
                "pinned": True,
                "expires_at": "2099-01-01T00:00:00Z",
            },
        )
    )
    assert stored["disputes"] == [] and stored["pinned"] is True and stored["tags"] == ["acme", "release"]
    status, twin = live.api("POST", "/entries", key, {"content": "acme a twin made through the API"})
    assert status == 201 and set(twin) == set(stored)

    got = ok(client.call("memory_get", {"id": stored["id"]}))
    status, api_detail = live.api("GET", f"/entries/{stored['id']}", key)
    assert status == 200 and _without_clock(got) == _without_clock(api_detail)
    assert [a["path"] for a in got["anchors"]] == ["docs/release.md"]
    assert [(link["direction"], link["other_id"]) for link in got["links"]] == [("out", ids["entry"])]

    updated = ok(client.call("memory_update", {"id": stored["id"], "content": "acme the checklist moved"}))
    assert updated["new_version"] is True and updated["supersedes"] == stored["id"]
    status, api_new = live.api("GET", f"/entries/{updated['entry']['id']}", key)
    assert status == 200 and api_new["content"] == "acme the checklist moved"
    retitled = ok(client.call("memory_update", {"id": updated["entry"]["id"], "title": "acme checklist"}))
    assert retitled["new_version"] is False and retitled["entry"]["content"] == "acme the checklist moved"


def test_search_recent_and_stats_answer_what_the_json_api_answers(live: Live, mcp) -> None:
    client, key = mcp("soylent"), live.key("soylent", "agent")
    found = ok(client.call("memory_search", {"query": "soylent backoff", "limit": 5}))
    status, api_found = live.api("GET", "/search?q=soylent%20backoff&limit=5", key)
    assert status == 200 and found == api_found
    assert [hit["id"] for hit in found["items"]] == [live.ids("soylent")["other_entry"]]
    assert "«" in found["items"][0]["snippet"]

    page = ok(client.call("memory_recent", {"limit": 2, "offset": 1}))
    status, api_page = live.api("GET", "/entries?sort=recent&limit=2&offset=1", key)
    assert status == 200 and page == api_page
    assert page["count"] == 4 and len(page["items"]) == 2  # the tombstoned one is not listed
    by_importance = ok(client.call("memory_recent", {"sort": "importance", "tier": "constitutional"}))
    assert [e["id"] for e in by_importance["items"]] == [live.ids("soylent")["rule"]]

    stats = ok(client.call("memory_stats"))
    status, api_stats = live.api("GET", "/stats", key)
    assert status == 200 and stats == api_stats
    assert stats["workspace"] == "soylent" and stats["entries"]["tombstoned"] == 1


def test_search_and_recent_are_paginated_and_bounded(mcp) -> None:
    client = mcp()
    first = ok(client.call("memory_search", {"query": "acme", "limit": 2}))
    second = ok(client.call("memory_search", {"query": "acme", "limit": 2, "offset": 2}))
    assert first["count"] == second["count"] >= 4
    assert len(first["items"]) == 2 and not {h["id"] for h in first["items"]} & {
        h["id"] for h in second["items"]
    }
    default = ok(client.call("memory_search", {"query": "acme"}))
    assert default["limit"] == 10
    past = ok(client.call("memory_recent", {"offset": 1000}))
    assert past["items"] == [] and past["count"] >= 4 and past["limit"] == 20
    refused(client.call("memory_recent", {"limit": 501}), "memory_recent", "limit")


def test_feedback_access_and_link_change_what_the_api_shows(live: Live, mcp) -> None:
    client, key, ids = mcp(), live.key("acme", "agent"), live.ids("acme")
    target = ids["third"]
    fed = ok(client.call("memory_feedback", {"id": target, "signal": "helpful"}))
    assert fed["last_feedback"] == "helpful"
    before = live.api("GET", f"/entries/{target}", key)[1]
    read = ok(client.call("memory_access", {"id": target, "dispatch": True}))
    assert read["retrieval_count"] == before["retrieval_count"] + 1
    assert read["access_count"] == before["access_count"] + 1
    again = ok(client.call("memory_access", {"id": target, "actor": "claude-code"}))
    assert again["retrieval_count"] == read["retrieval_count"]
    assert live.api("GET", f"/entries/{target}", key)[1]["readers"] == 2  # this key, then claude-code

    link = ok(client.call("memory_link", {"from_id": target, "to_id": ids["rule"], "type": "implements"}))
    assert link["duplicate"] is False and (link["from_id"], link["to_id"]) == (target, ids["rule"])
    repeat = ok(client.call("memory_link", {"from_id": target, "to_id": ids["rule"], "type": "implements"}))
    assert repeat["duplicate"] is True and repeat["id"] == link["id"]


def test_maintenance_preview_is_a_dry_run_for_every_kind_and_changes_nothing(live: Live, mcp) -> None:
    client, admin = mcp("acme", "operator"), live.key("acme", "admin")
    before = live.api("GET", "/entries?include_archived=true&include_staged=true&limit=500", admin)[1]
    for kind in ("full", "prune", "decay", "hygiene", "contradictions", "consolidate"):
        preview = ok(client.call("memory_maintenance_preview", {"kind": kind, "top": 1}))
        assert preview["dry_run"] is True and preview["kind"] == kind
        assert all(len(ids) <= 1 for ids in preview["affected_top"].values())
        status, run = live.api("GET", f"/maintenance/runs/{preview['run_id']}", admin)
        assert status == 200 and run["dry_run"] is True
    assert live.api("GET", "/entries?include_archived=true&include_staged=true&limit=500", admin)[1] == before


# --- a forgotten memory is gone from every tool and resource ------------------------------------------


def test_a_forgotten_memory_is_invisible_through_every_tool_and_resource(live: Live, mcp) -> None:
    client, key, ids = mcp("initech"), live.key("initech", "agent"), live.ids("initech")
    made = ok(client.call("memory_store", {"content": "initech quokka migration plan", "tags": ["quokka"]}))
    assert ok(client.call("memory_search", {"query": "quokka"}))["count"] == 1
    gone = ok(client.call("memory_forget", {"id": made["id"]}))
    assert gone["entry_id"] == made["id"] and gone["reason"] == "api"
    assert live.api("GET", f"/entries/{made['id']}", key)[0] == 404

    assert ok(client.call("memory_search", {"query": "quokka"}))["count"] == 0
    assert ok(client.call("memory_search", {"query": "quokka", "include_archived": True}))["count"] == 0
    for sort in ("recent", "importance", "retention"):
        listed = ok(client.call("memory_recent", {"sort": sort, "include_archived": True, "limit": 500}))
        assert made["id"] not in {e["id"] for e in listed["items"]}
    for tool, args in [
        ("memory_get", {"id": made["id"]}),
        ("memory_update", {"id": made["id"], "title": "back"}),
        ("memory_feedback", {"id": made["id"], "signal": "helpful"}),
        ("memory_access", {"id": made["id"]}),
        ("memory_link", {"from_id": ids["entry"], "to_id": made["id"]}),
    ]:
        text = refused(client.call(tool, args), tool, f"entry {made['id']}")
        path = {"memory_get": "", "memory_update": "", "memory_feedback": "/feedback"}.get(tool)
        if path is not None:  # the JSON API refuses it alike
            method = {"memory_get": "GET", "memory_update": "PATCH"}.get(tool, "POST")
            body = {k: v for k, v in args.items() if k != "id"} if method != "GET" else None
            status, answer = live.api(method, f"/entries/{made['id']}{path}", key, body)
            assert text.endswith(f"{status} {HTTPStatus(status).phrase}: {answer['detail']}"), (text, answer)
    refused(client.call("memory_forget", {"id": made["id"]}), "memory_forget", "already tombstoned")
    assert "quokka" not in client.read("memory://briefing?budget=20000")
    with pytest.raises(MCPError, match="404 Not Found"):
        client.read(f"memory://entry/{made['id']}")
    assert ok(client.call("memory_stats"))["entries"]["tombstoned"] == 2
    # An operator restores it (in the console or the API); every door shows it again.
    restored = live.api("POST", f"/entries/{made['id']}/restore", live.key("initech", "operator"))
    assert restored[0] == 200
    assert ok(client.call("memory_search", {"query": "quokka"}))["count"] == 1


# --- bad input: a tool error with the API's message, and nothing written ------------------------------


def _bad_inputs(ids: dict[str, int], other: dict[str, int]) -> list[tuple[str, dict[str, Any], list[str]]]:
    entry, foreign = ids["entry"], other["entry"]
    return [
        ("memory_store", {"content": 5}, ["content"]),
        ("memory_store", {"content": " "}, ["content"]),
        ("memory_store", {"content": "x", "impact_score": 2.0}, ["impact_score"]),
        ("memory_store", {"content": "x", "tier": "eternal"}, ["tier"]),
        ("memory_store", {"content": "x", "workspace": "globex"}, ["workspace", "Extra inputs"]),
        ("memory_store", {"content": "x", "links": [{"to_id": MISSING}]}, ["404 Not Found"]),
        ("memory_store", {"content": "x", "links": [{"to_id": foreign}]}, ["404 Not Found"]),
        ("memory_store", {"content": "x", "source": "operator"}, ["403 Forbidden", "operator role"]),
        ("memory_store", {"content": "x" * 50_001}, ["content"]),
        ("memory_search", {"query": ""}, ["query"]),
        ("memory_search", {"query": 5}, ["query"]),
        ("memory_search", {"query": "x", "limit": 0}, ["limit"]),
        ("memory_search", {"query": "x", "offset": -1}, ["offset"]),
        ("memory_search", {"query": "x" * 501}, ["query"]),
        ("memory_get", {"id": "one"}, ["id"]),
        ("memory_get", {"id": 0}, ["id"]),
        ("memory_get", {"id": 2**63}, ["id"]),
        ("memory_get", {"id": MISSING}, ["404 Not Found", f"entry {MISSING} not found"]),
        ("memory_get", {"id": foreign}, ["404 Not Found", f"entry {foreign} not found"]),
        ("memory_get", {}, ["id"]),
        ("memory_recent", {"limit": 0}, ["limit"]),
        ("memory_recent", {"sort": "random"}, ["sort"]),
        ("memory_recent", {"status": "tombstoned"}, ["status"]),
        ("memory_recent", {"include_archived": "yes"}, ["include_archived"]),
        ("memory_update", {"id": entry, "content": ""}, ["content"]),
        ("memory_update", {"id": entry, "pinned": None}, ["pinned"]),
        ("memory_update", {"id": MISSING, "title": "t"}, ["404 Not Found"]),
        ("memory_update", {"id": foreign, "title": "t"}, ["404 Not Found"]),
        ("memory_forget", {"id": MISSING}, ["404 Not Found"]),
        ("memory_forget", {"id": foreign}, ["404 Not Found"]),
        ("memory_forget", {"id": ids["tombstoned"]}, ["409 Conflict", "already tombstoned"]),
        ("memory_feedback", {"id": entry, "signal": "meh"}, ["signal"]),
        ("memory_feedback", {"id": foreign, "signal": "helpful"}, ["404 Not Found"]),
        ("memory_access", {"id": entry, "actor": " "}, ["actor"]),
        ("memory_access", {"id": entry, "dispatch": 1}, ["dispatch"]),
        ("memory_access", {"id": foreign}, ["404 Not Found"]),
        ("memory_link", {"from_id": entry, "to_id": entry}, ["422 Unprocessable", "cannot link to itself"]),
        ("memory_link", {"from_id": entry, "to_id": MISSING}, ["404 Not Found"]),
        ("memory_link", {"from_id": entry, "to_id": foreign}, ["404 Not Found"]),
        ("memory_link", {"from_id": entry, "to_id": ids["rule"], "type": "loves"}, ["type"]),
        ("memory_maintenance_preview", {"kind": "purge"}, ["kind"]),
        ("memory_maintenance_preview", {"top": 0}, ["top"]),
        ("memory_maintenance_preview", {"dry_run": False}, ["dry_run", "Extra inputs"]),
        ("memory_stats", {"workspace": "globex"}, ["Extra inputs"]),
    ]


def test_bad_arguments_are_tool_errors_with_the_api_s_message_and_write_nothing(live: Live, mcp) -> None:
    client, admin = mcp("acme"), live.key("acme", "admin")
    cases = _bad_inputs(live.ids("acme"), live.ids("globex"))
    assert {tool for tool, _, _ in cases} == TOOLS  # every tool has its bad inputs
    before = live.api("GET", "/entries?include_archived=true&include_staged=true&limit=500", admin)[1]
    other_before = live.api("GET", "/stats", live.key("globex", "admin"))[1]["entries"]
    for tool, args, fragments in cases:
        refused(client.call(tool, args), tool, *fragments)
    assert live.api("GET", "/entries?include_archived=true&include_staged=true&limit=500", admin)[1] == before
    assert live.api("GET", "/stats", live.key("globex", "admin"))[1]["entries"] == other_before
    assert "Unknown tool" in client.call("memory_purge", {"id": 1}).content[0].text


# --- resources and the prompt -----------------------------------------------------------------------


def test_the_briefing_puts_constitutional_rules_first_within_a_budget_with_a_cursor(live: Live, mcp) -> None:
    client, ids = mcp("globex"), live.ids("globex")
    text = client.read("memory://briefing")
    assert text.index(f"#{ids['rule']} ") < min(text.index(f"#{ids[n]} ") for n in ("entry", "other_entry"))
    assert "forgotten words" not in text and "acme" not in text
    live_count = ok(client.call("memory_recent", {"limit": 500}))["count"]
    seen: list[int] = []
    uri = "memory://briefing?budget=200"
    while True:
        page = client.read(uri)
        assert len(page) <= 200 * 4 + 200, page  # the budget, and the line naming the next page
        seen += [int(line.split()[1][1:]) for line in page.splitlines() if line.startswith("## #")]
        if "More: " not in page:
            break
        uri = page.rsplit("More: ", 1)[1].strip()
    assert len(seen) == len(set(seen)) == live_count and seen[0] == ids["rule"]
    for bad in (
        "memory://briefing?budget=many",
        "memory://briefing?budget=10",
        "memory://briefing?cursor=9.x",
    ):
        with pytest.raises(MCPError) as refusal:
            client.read(bad)
        assert refusal.value.error.code == -32602 and "422" in refusal.value.error.message


def test_the_entry_resource_is_memory_get_and_another_workspace_s_entry_is_not_found(live: Live, mcp) -> None:
    client, ids = mcp("globex"), live.ids("globex")
    as_resource = json.loads(client.read(f"memory://entry/{ids['entry']}"))
    assert _without_clock(as_resource) == _without_clock(ok(client.call("memory_get", {"id": ids["entry"]})))
    for other in (live.ids("acme")["entry"], ids["tombstoned"], MISSING, "x1"):
        with pytest.raises(MCPError, match="404 Not Found"):
            client.read(f"memory://entry/{other}")
    resources = client.run(lambda c: c.list_resources()).resources
    assert [str(r.uri) for r in resources] == ["memory://briefing"]
    templates = client.run(lambda c: c.list_resource_templates()).resource_templates
    assert {t.uri_template for t in templates} == {"memory://briefing{?budget,cursor}", "memory://entry/{id}"}


def test_the_session_summary_prompt_has_its_three_sections_and_recent_memories(live: Live, mcp) -> None:
    client = mcp("globex")
    prompts = client.run(lambda c: c.list_prompts()).prompts
    assert [p.name for p in prompts] == ["session-summary"]
    text = client.run(lambda c: c.get_prompt("session-summary", {})).messages[0].content.text
    for section in ("## Accomplished", "## Unfinished", "## Context for Next Session"):
        assert section in text
    assert "globex retries use exponential backoff" in text and "forgotten words" not in text
    assert "acme" not in text
    scoped = client.run(lambda c: c.get_prompt("session-summary", {"project": "nothing-here"}))
    assert "(no memories yet)" in scoped.messages[0].content.text


# --- stateless: two processes answer one client ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_two_server_processes_answer_alternate_requests_of_one_client(live: Live, mode: str) -> None:
    if not hasattr(live, "second_port"):
        port = free_port()
        # Plain uvicorn with its default --lifespan auto: the ASGI root runs the MCP manager.
        live.start(["-m", "uvicorn", "config.asgi:application", "--port", str(port)], port)
        live.second_port = port  # type: ignore[attr-defined]
    first, second = int(live.base.rsplit(":", 1)[1]), live.second_port  # type: ignore[attr-defined]
    transport = Alternating([first, second])
    with McpClient(live.url, live.key("initech", "agent"), mode=mode, transport=transport) as client:
        made = ok(client.call("memory_store", {"content": f"initech wombat handover {mode}"}))
        for _ in range(2):
            assert ok(client.call("memory_get", {"id": made["id"]}))["id"] == made["id"]
            assert ok(client.call("memory_search", {"query": f"wombat {mode}"}))["count"] == 1
        ok(client.call("memory_forget", {"id": made["id"]}))
        refused(client.call("memory_get", {"id": made["id"]}), "memory_get", "404 Not Found")
    answered = {port for port, status in transport.answered if status == 200}
    assert answered == {first, second}, transport.answered
    assert all(status in (200, 202) for _, status in transport.answered), transport.answered


# --- stdio ----------------------------------------------------------------------------------------


def test_mcp_stdio_serves_the_same_tools_with_the_key_s_role(live: Live) -> None:
    import anyio

    def params(key: str) -> StdioServerParameters:
        return StdioServerParameters(
            command=sys.executable,
            args=[str(ROOT / "manage.py"), "mcp_stdio", "--key", key],
            env={k: live.env[k] for k in ("DATABASE_URL", "BACKUP_DIR", "DJANGO_SETTINGS_MODULE", "PATH")},
            cwd=str(ROOT),
        )

    async def session() -> None:
        async with Client(params(live.key("globex", "viewer"))) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS
            found = await client.call_tool("memory_search", {"query": "backoff"})
            assert ok(found)["items"][0]["id"] == live.ids("globex")["other_entry"]
            stored = await client.call_tool("memory_store", {"content": "x"})
            refused(stored, "memory_store", "403 Forbidden", "needs the agent role")
            assert "globex never deploy" in (await client.read_resource("memory://briefing")).contents[0].text

    anyio.run(session)
    revoked = subprocess.run(
        [sys.executable, "manage.py", "mcp_stdio", "--key", live.key("globex", "revoked")],
        cwd=ROOT,
        env=live.env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert revoked.returncode == 1 and "unknown or revoked" in revoked.stderr
