"""Roles and workspace isolation of EVERY MCP tool, and arguments generated from the schemas the
server advertises, against a real server (tests/mcp_live.py).

The tools are read from the live ``tools/list``: a tool added later is tested the moment it
exists, and fails until it is described in the two tables below, the least role it needs
(MIN_ROLE) and arguments naming objects of the workspace (ARGS). For every tool:

- a revoked key, or none, is 401 before any tool runs (a hand-written JSON-RPC request);
- a key of another workspace (even an operator's) on this workspace's ids is the API's 404,
  and a read without ids never shows this workspace's data;
- the role just below the minimum is 403 with the API's message; all of it changes nothing;
- the minimum role itself is answered.

Then each tool is called with arguments generated from its advertised input schema
(hypothesis): never an internal error, and every result matches the advertised output schema
(the SDK's client checks it; jsonschema again here).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings

from tests.mcp_live import Live, McpClient
from tests.schema_strategies import from_schema

THIS, OTHER, FUZZ = "umbrella", "hooli", "piedpiper"  # THIS's slug is a word of all its memories

MIN_ROLE: dict[str, str] = {
    "memory_store": "agent",
    "memory_search": "viewer",
    "memory_get": "viewer",
    "memory_recent": "viewer",
    "memory_update": "agent",
    "memory_forget": "agent",
    "memory_feedback": "agent",
    "memory_access": "agent",
    "memory_link": "agent",
    "memory_maintenance_preview": "agent",
    "memory_stats": "viewer",
}
ACCEPT = "application/json, text/event-stream"
ROLE_BELOW = {"agent": "viewer", "operator": "agent", "admin": "operator"}

# Arguments naming THIS workspace's objects; ``names_ids``: the tool looks an id of them up.
ARGS: dict[str, tuple[Callable[[dict[str, int]], dict[str, Any]], bool]] = {
    "memory_store": (lambda ids: {"content": f"{THIS} more", "links": [{"to_id": ids["entry"]}]}, True),
    "memory_search": (lambda ids: {"query": THIS, "include_archived": True}, False),
    "memory_get": (lambda ids: {"id": ids["entry"]}, True),
    "memory_recent": (lambda ids: {"include_archived": True, "include_staged": True, "limit": 500}, False),
    "memory_update": (lambda ids: {"id": ids["entry"], "title": f"{THIS} retitled"}, True),
    "memory_forget": (lambda ids: {"id": ids["other_entry"]}, True),
    "memory_feedback": (lambda ids: {"id": ids["entry"], "signal": "wrong"}, True),
    "memory_access": (lambda ids: {"id": ids["entry"], "dispatch": True}, True),
    "memory_link": (lambda ids: {"from_id": ids["third"], "to_id": ids["rule"], "type": "caused"}, True),
    "memory_maintenance_preview": (lambda ids: {"kind": "full"}, False),
    "memory_stats": (lambda ids: {}, False),
}


@pytest.fixture(scope="module")
def live(mcp_live: Live) -> Live:
    return mcp_live


@pytest.fixture(scope="module")
def connect(live: Live) -> Iterator[Callable[[str, str], McpClient]]:
    opened: dict[tuple[str, str], McpClient] = {}

    def client(slug: str, name: str) -> McpClient:
        if (slug, name) not in opened:
            opened[slug, name] = McpClient(live.url, live.key(slug, name))
        return opened[slug, name]

    yield client
    for each in opened.values():
        each.close()


@pytest.fixture(scope="module")
def tools(connect: Callable[[str, str], McpClient]) -> dict[str, Any]:
    return {tool.name: tool for tool in connect(THIS, "viewer").tools()}


def fingerprint(live: Live, slug: str) -> Any:
    """Every row of the workspace a tool could change, as its admin reads them through the API."""
    admin = live.key(slug, "admin")
    paths = [
        "/entries?include_archived=true&include_staged=true&limit=500",
        "/tombstones?include_restored=true&include_purged=true&limit=500",
        "/maintenance/runs?limit=500",
    ]
    found = [live.api("GET", path, admin) for path in paths]
    for tombstone in found[1][1]["items"]:
        del tombstone["seconds_until_purge"]  # the clock's, not the row's
    stats = live.api("GET", "/stats", admin)[1]
    assert all(status == 200 for status, _ in found)
    return [body for _, body in found], stats["entries"], stats["links"], stats["anchors"]


def assert_same(now: Any, before: Any) -> None:
    if now != before:  # name what changed
        a, b = json.dumps(before, indent=1).splitlines(), json.dumps(now, indent=1).splitlines()
        import difflib

        pytest.fail(
            "the workspace changed:\n" + "\n".join(list(difflib.unified_diff(a, b, lineterm=""))[:40])
        )


def test_every_tool_has_a_role_and_arguments_in_the_tables(tools: dict[str, Any]) -> None:
    missing = [name for name in tools if name not in MIN_ROLE or name not in ARGS]
    assert not missing, f"add these tools to MIN_ROLE and ARGS: {missing}"
    assert set(MIN_ROLE) == set(ARGS) == set(tools), "the tables name tools the server has not"
    for name, tool in tools.items():  # a tool that writes needs more than the viewer role
        assert tool.annotations.read_only_hint or MIN_ROLE[name] != "viewer", name


def test_no_key_or_a_revoked_key_is_401_for_every_tool(live: Live, tools: dict[str, Any]) -> None:
    ids = live.ids(THIS)
    before = fingerprint(live, THIS)
    with httpx2.Client(timeout=30) as http:
        for name in tools:
            call = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": name, "arguments": ARGS[name][0](ids)},
            }
            for key in (None, live.key(THIS, "revoked")):
                headers = {
                    "Content-Type": "application/json",
                    "Accept": "application/json, text/event-stream",
                }
                if key:
                    headers["Authorization"] = f"Bearer {key}"
                answer = http.post(live.url, json=call, headers=headers)
                assert answer.status_code == 401, (name, answer.text)
                assert "resource_metadata=" in answer.headers["www-authenticate"]
    assert_same(fingerprint(live, THIS), before)


def test_another_workspace_gets_404_for_this_workspace_s_ids_and_never_sees_its_data(
    live: Live, connect: Callable[[str, str], McpClient], tools: dict[str, Any]
) -> None:
    ids = live.ids(THIS)
    outsider = connect(OTHER, "operator")  # the highest role that may use every tool
    before = fingerprint(live, THIS)
    for name in tools:
        make, names_ids = ARGS[name]
        result = outsider.call(name, make(ids))
        text = result.content[0].text
        if names_ids:
            assert result.is_error and "404 Not Found" in text, (name, text)
        else:
            assert not result.is_error, (name, text)
            assert THIS not in text, (name, text)
    assert THIS not in outsider.read("memory://briefing?budget=20000")
    for name in ("entry", "rule", "tombstoned"):
        with pytest.raises(Exception, match="404 Not Found"):
            outsider.read(f"memory://entry/{ids[name]}")
    assert_same(fingerprint(live, THIS), before)


def test_the_role_below_each_tool_s_minimum_is_refused_and_changes_nothing(
    live: Live, connect: Callable[[str, str], McpClient], tools: dict[str, Any]
) -> None:
    ids = live.ids(THIS)
    before = fingerprint(live, THIS)
    for name in tools:
        least = MIN_ROLE[name]
        if least not in ROLE_BELOW:
            continue
        below = ROLE_BELOW[least]
        result = connect(THIS, below).call(name, ARGS[name][0](ids))
        text = result.content[0].text
        assert result.is_error, (name, below)
        assert f"403 Forbidden: this action needs the {least} role; your role is {below}" in text, text
    assert_same(fingerprint(live, THIS), before)


def test_each_tool_s_minimum_role_is_answered(
    live: Live, connect: Callable[[str, str], McpClient], tools: dict[str, Any]
) -> None:
    ids = live.ids(THIS)
    for name in tools:
        result = connect(THIS, MIN_ROLE[name]).call(name, ARGS[name][0](ids))
        assert not result.is_error, (name, result.content[0].text)
    assert live.api("GET", f"/entries/{ids['other_entry']}", live.key(THIS, "admin"))[0] == 404  # forgotten


# --- arguments generated from the advertised schemas ----------------------------------------------


def test_generated_arguments_never_crash_a_tool_and_results_match_the_output_schema(
    connect: Callable[[str, str], McpClient], tools: dict[str, Any]
) -> None:
    writer, reader = connect(FUZZ, "fuzz"), connect(FUZZ, "spare")
    answered: dict[str, int] = dict.fromkeys(tools, 0)
    for name, tool in tools.items():
        client = reader if tool.annotations.read_only_hint else writer
        validator = jsonschema.Draft202012Validator(tool.output_schema)
        _fuzz(name, tool, client, validator, answered)()
    # Arguments the schema allows are mostly good ones: these tools answered some of them.
    for name in (
        "memory_store",
        "memory_search",
        "memory_recent",
        "memory_maintenance_preview",
        "memory_stats",
    ):
        assert answered[name] > 0, answered


def _fuzz(
    name: str,
    tool: Any,
    client: McpClient,
    validator: jsonschema.Draft202012Validator,
    answered: dict[str, int],
) -> Any:
    @settings(
        max_examples=12,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(arguments=from_schema(tool.input_schema))
    def check(arguments: dict[str, Any]) -> None:
        result = client.call(name, arguments)  # the SDK's client validates the output too
        text = result.content[0].text
        if result.is_error:
            assert text.startswith(f"Error executing tool {name}: "), (arguments, text)
        else:
            validator.validate(result.structured_content)
            assert json.loads(text) == result.structured_content
            answered[name] += 1

    return check
