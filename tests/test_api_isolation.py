"""Authentication, roles and workspace isolation of EVERY endpoint.

The list of endpoints is read from the live OpenAPI schema of the one NinjaAPI, so an endpoint
added later is tested the moment it exists, and fails until it is described in the two tables
below: the minimum role it needs (MIN_ROLE) and, for each kind of id in its path, how to make
a real object of that kind (OBJECTS). For every (method, path):

- no credentials, or a revoked key → 401;
- a key of another workspace on ids of this one → 404, and this workspace is unchanged;
- a read without ids by another workspace never shows this workspace's data;
- the role just below the minimum → 403, and nothing changes; the minimum role itself → not 403.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.forms.models import model_to_dict
from django.test import Client
from django.utils import timezone

from config.api import api
from maintenance.models import Dispute, MaintenanceRun, Proposal
from memory import accounts, entry_changes, new_entries, relationships
from memory.models import (
    CodeAnchor,
    Entry,
    EntryAccess,
    LifecycleEvent,
    Relationship,
    Tag,
    Tombstone,
    Workspace,
)
from memory.policy_model import MaintenancePolicy
from tests.helpers_runs import work_queued_runs

pytestmark = pytest.mark.django_db

PREFIX = "/api/v1"
PUBLIC = {("GET", "/health")}
CSRF = "c" * 32  # any 32-character alphanumeric secret is a valid CSRF cookie and token
MARKER = "zebracorn"  # a word in this workspace's data that no other workspace may ever see

# The least role each endpoint accepts. An endpoint missing here fails its tests.
MIN_ROLE: dict[tuple[str, str], str] = {
    ("POST", "/entries"): "agent",
    ("GET", "/entries"): "viewer",
    ("GET", "/entries/{entry_id}"): "viewer",
    ("PATCH", "/entries/{entry_id}"): "agent",
    ("DELETE", "/entries/{entry_id}"): "agent",
    ("POST", "/entries/{entry_id}/restore"): "operator",
    ("GET", "/entries/{entry_id}/versions"): "viewer",
    ("GET", "/entries/{entry_id}/history"): "viewer",
    ("POST", "/entries/{entry_id}/access"): "agent",
    ("POST", "/entries/{entry_id}/reinforce"): "agent",
    ("POST", "/entries/{entry_id}/feedback"): "agent",
    ("POST", "/relationships"): "agent",
    ("DELETE", "/relationships/{relationship_id}"): "agent",
    ("POST", "/anchors/check"): "agent",
    ("GET", "/search"): "viewer",
    ("POST", "/maintenance/run"): "agent",
    ("POST", "/maintenance/prune"): "agent",
    ("POST", "/maintenance/sweep-decay"): "agent",
    ("GET", "/maintenance/runs"): "viewer",
    ("GET", "/maintenance/runs/folded"): "viewer",
    ("GET", "/maintenance/runs/{id}"): "viewer",
    ("GET", "/maintenance/runs/{id}/affected"): "viewer",
    ("POST", "/maintenance/runs/{id}/revert"): "operator",
    ("GET", "/hygiene/preview"): "viewer",
    ("POST", "/hygiene/apply"): "operator",
    ("POST", "/hygiene/keep"): "operator",
    ("GET", "/disputes"): "viewer",
    ("POST", "/disputes/{id}/resolve"): "operator",
    ("POST", "/disputes/{dispute_id}/resolve"): "operator",
    ("GET", "/tombstones"): "viewer",
    ("GET", "/backups"): "viewer",
    ("GET", "/stats"): "viewer",
    ("GET", "/policy"): "viewer",
    ("PUT", "/policy"): "admin",
    ("GET", "/proposals"): "viewer",
    ("POST", "/proposals/approve"): "operator",
    ("POST", "/proposals/reject"): "operator",
    ("POST", "/entries/{entry_id}/release"): "operator",
}

# Variants of an endpoint that need more than its minimum: (method, path, query, body, role).
STRICTER: list[tuple[str, str, str, Any, str]] = [
    ("POST", "/maintenance/run", "", {"dry_run": False}, "operator"),
    ("POST", "/maintenance/prune", "", {"dry_run": False}, "operator"),
    ("POST", "/maintenance/sweep-decay", "", {"dry_run": False}, "operator"),
    ("DELETE", "/entries/{entry_id}", "?purge=true", None, "operator"),
]

# Bodies the schema-derived minimal body cannot guess (ids of this workspace, real choices).
BODIES: dict[tuple[str, str], Callable[[dict[str, Any]], Any]] = {
    ("POST", "/relationships"): lambda ids: {"from_id": ids["entry"], "to_id": ids["other_entry"]},
    ("POST", "/hygiene/apply"): lambda ids: {"ids": [ids["entry"]]},
    ("POST", "/hygiene/keep"): lambda ids: {"ids": [ids["entry"]]},
    ("POST", "/disputes/{id}/resolve"): lambda ids: {"resolution": "keep_both"},
    ("POST", "/disputes/{dispute_id}/resolve"): lambda ids: {"resolution": "keep_both"},
    ("POST", "/proposals/approve"): lambda ids: {"ids": [ids["entry"], ids["other_entry"]]},
    ("POST", "/proposals/reject"): lambda ids: {"ids": [ids["entry"], ids["other_entry"]]},
}

ROLE_BELOW = {"agent": "viewer", "operator": "agent", "admin": "operator"}


SCHEMA = api.get_openapi_schema()


def _operations() -> list[tuple[str, str]]:
    found = []
    for path, methods in SCHEMA["paths"].items():
        assert path.startswith(PREFIX), path
        for method in methods:
            operation = (method.upper(), path.removeprefix(PREFIX))
            if operation not in PUBLIC:
                found.append(operation)
    return found


OPERATIONS = _operations()
IDS = [f"{method} {path}" for method, path in OPERATIONS]
# Endpoints some member role may not use (those missing from MIN_ROLE too, so that they fail).
GUARDED = [op for op in OPERATIONS if MIN_ROLE.get(op) != "viewer"]


# --- this workspace, another one, and who calls ------------------------------------------------


def _make_entry(workspace: Workspace, text: str, **fields: Any) -> Entry:
    return new_entries.entry_create(
        workspace=workspace, title=f"{MARKER} {text}", content=f"{MARKER} {text} about caches", **fields
    )


@pytest.fixture
def world(workspace, other_workspace, settings, tmp_path) -> dict[str, Any]:
    """This workspace with one object of every kind, and another workspace with its own."""
    settings.BACKUP_DIR = tmp_path
    entry = _make_entry(workspace, "first", tags=[MARKER], project=MARKER)
    other = _make_entry(workspace, "second")
    gone = _make_entry(workspace, "third")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)
    link, _ = relationships.relationship_create(workspace=workspace, from_id=entry.pk, to_id=other.pk)
    CodeAnchor.objects.create(workspace=workspace, entry=entry, repo=MARKER, path=f"{MARKER}.py")
    run = MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="cli", status="succeeded")
    first, second = sorted([entry.pk, other.pk])
    dispute = Dispute.objects.create(
        workspace=workspace, entry_a_id=first, entry_b_id=second, detected_by="sweep", similarity=0.5
    )
    # An open proposal for each live entry, and an operator hold on the first (to release).
    for proposed in (entry, other):
        Proposal.objects.create(
            workspace=workspace,
            run=run,
            entry=proposed,
            entry_ref=proposed.pk,
            action="tombstone",
            reason="evicted",
            values={"retention": 0.1, "cold_threshold": 0.2},
            why=f"retention 0.10 < 0.20 ({MARKER})",
        )
    Entry.objects.filter(pk=entry.pk).update(held_at=timezone.now(), held_by=MARKER, hold_reason="restore")
    new_entries.entry_create(workspace=other_workspace, content="globex knows nothing else")
    return {
        "workspace": workspace,
        "other_workspace": other_workspace,
        "ids": {
            "entry": entry.pk,
            "other_entry": other.pk,
            "tombstoned_entry": gone.pk,
            "relationship": link.pk,
            "run": run.pk,
            "dispute": dispute.pk,
        },
    }


# The object a path parameter names, by the collection it follows ("/entries/{entry_id}").
OBJECTS: dict[str, str] = {
    "entries": "entry",
    "relationships": "relationship",
    "runs": "run",
    "disputes": "dispute",
}


def fill_path(path: str, ids: dict[str, int], *, entry_kind: str = "entry") -> str:
    def object_id(match: re.Match[str]) -> str:
        collection = path[: match.start()].rstrip("/").rsplit("/", 1)[-1]
        if collection not in OBJECTS:
            pytest.fail(
                f"{path}: no object kind for {{{match.group(1)}}} after /{collection}/; add it to OBJECTS"
            )
        kind = OBJECTS[collection]
        return str(ids[entry_kind if kind == "entry" else kind])

    return re.sub(r"\{(\w+)\}", object_id, path)


def min_role(method: str, path: str) -> str:
    if (method, path) not in MIN_ROLE:
        pytest.fail(f"{method} {path} is not in MIN_ROLE: say which role it needs")
    return MIN_ROLE[(method, path)]


# --- requests ----------------------------------------------------------------------------------


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SCHEMA["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def minimal(schema: dict[str, Any], text: str = "filler") -> Any:
    """The smallest value valid for a JSON schema: required properties only, lowest bounds."""
    schema = _resolve(schema)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if _resolve(o).get("type") != "null"]
            return minimal(options[0], text) if options else None
    if "allOf" in schema:
        return minimal(schema["allOf"][0], text)
    kind = schema.get("type", "object")
    if kind == "object":
        props = schema.get("properties", {})
        return {name: minimal(props[name], text) for name in schema.get("required", [])}
    if kind == "array":
        return [minimal(schema.get("items", {}), text) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        if schema.get("format") == "date-time":
            return timezone.now().isoformat()
        return (text * 10)[: max(schema.get("minLength", 1), len(text))][: schema.get("maxLength", 1000)]
    if kind == "integer":
        return max(schema.get("minimum", 1), 1)
    if kind == "number":
        return schema.get("minimum", 0.5)
    if kind == "boolean":
        return False
    return None


def request_parts(method: str, path: str, ids: dict[str, int]) -> tuple[str, Any]:
    """The query string and body of a valid request to an endpoint. Required query strings
    search for this workspace's marker word (another workspace must find nothing)."""
    operation = SCHEMA["paths"][PREFIX + path][method.lower()]
    query = {
        p["name"]: minimal(p["schema"], MARKER)
        for p in operation.get("parameters", [])
        if p["in"] == "query" and p.get("required")
    }
    body = None
    if (method, path) in BODIES:
        body = BODIES[(method, path)](ids)
    elif operation.get("requestBody"):
        body = minimal(operation["requestBody"]["content"]["application/json"]["schema"]) or {}
    query_string = "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
    return query_string, body


class Caller:
    """One identity: a bearer key, a member's browser session (with CSRF), or nobody."""

    def __init__(self, client: Client, headers: dict[str, str]):
        self.client = client
        self.headers = headers

    def __call__(self, method: str, url: str, body: Any = None):
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs = {"data": json.dumps(body), "content_type": "application/json"}
        return getattr(self.client, method.lower())(PREFIX + url, **kwargs, **self.headers)


def key_caller(workspace: Workspace, role: str, *, revoked: bool = False) -> Caller:
    key, raw = accounts.api_key_create(workspace=workspace, name=role, role=role)
    if revoked:
        accounts.api_key_revoke(workspace=workspace, key_id=key.pk)
    return Caller(Client(), {"HTTP_AUTHORIZATION": f"Bearer {raw}"})


def session_caller(workspace: Workspace, role: str) -> Caller:
    user = get_user_model().objects.create_user(username=f"{role}-{workspace.slug}", password="x")
    accounts.membership_set(workspace=workspace, user=user, role=role)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.cookies["csrftoken"] = CSRF
    return Caller(client, {"HTTP_X_WORKSPACE": workspace.slug, "HTTP_X_CSRFTOKEN": CSRF})


def caller(workspace: Workspace, role: str) -> Caller:
    # Viewers exist only as members; every other role as a key.
    return session_caller(workspace, role) if role == "viewer" else key_caller(workspace, role)


def snapshot(workspace: Workspace) -> dict[str, Any]:
    """Everything a request could change in a workspace."""
    return {
        "entries": list(Entry.objects.filter(workspace=workspace).order_by("pk").values()),
        "relationships": list(Relationship.objects.filter(workspace=workspace).order_by("pk").values()),
        "tombstones": list(Tombstone.objects.filter(workspace=workspace).order_by("pk").values()),
        "anchors": list(CodeAnchor.objects.filter(workspace=workspace).order_by("pk").values()),
        "tags": list(Tag.objects.filter(workspace=workspace).order_by("pk").values()),
        "access": list(EntryAccess.objects.filter(workspace=workspace).order_by("pk").values()),
        "events": LifecycleEvent.objects.filter(workspace=workspace).count(),
        "runs": list(MaintenanceRun.objects.filter(workspace=workspace).order_by("pk").values()),
        "disputes": list(Dispute.objects.filter(workspace=workspace).order_by("pk").values()),
        "proposals": list(Proposal.objects.filter(workspace=workspace).order_by("pk").values()),
        "policy": [model_to_dict(p) for p in MaintenancePolicy.objects.filter(workspace=workspace)],
    }


# --- the tables cover every endpoint -------------------------------------------------------------


def test_the_schema_lists_the_endpoints_of_every_router():
    paths = {path for _, path in OPERATIONS}
    assert {"/entries", "/search", "/maintenance/run", "/policy"} <= paths


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=IDS)
def test_every_endpoint_has_a_minimum_role_and_known_ids(method, path):
    assert min_role(method, path) in ROLE_BELOW or min_role(method, path) == "viewer"
    fill_path(path, dict.fromkeys(OBJECTS.values(), 1))


# --- 401 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=IDS)
def test_without_valid_credentials_every_endpoint_answers_401(workspace, other_workspace, method, path):
    """No credentials, a revoked or unknown key, a session naming a workspace its user is not a
    member of: 401 before anything else is looked at (the ids need not even exist)."""
    url = fill_path(path, dict.fromkeys(OBJECTS.values(), 1))
    before = snapshot(workspace)
    member = session_caller(other_workspace, "admin")
    member.headers["HTTP_X_WORKSPACE"] = workspace.slug
    for who in (
        Caller(Client(), {}),
        key_caller(workspace, "admin", revoked=True),
        Caller(Client(), {"HTTP_AUTHORIZATION": "Bearer msk_not-a-key"}),
        Caller(Client(), {"HTTP_AUTHORIZATION": "Basic YWRtaW46YWRtaW4="}),
        member,
    ):
        response = who(method, url, None if method == "GET" else {})
        assert response.status_code == 401, response.content
        assert "detail" in response.json()
    assert snapshot(workspace) == before


# --- another workspace -------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=IDS)
def test_another_workspace_never_reaches_this_one(world, method, path):
    """Ids of this workspace are 404 to another's admin; reads without ids show nothing of it;
    nothing in this workspace changes either way."""
    min_role(method, path)
    ids = world["ids"]
    query, body = request_parts(method, path, ids)
    before = snapshot(world["workspace"])
    foreign = key_caller(world["other_workspace"], "admin")
    response = foreign(method, fill_path(path, ids) + query, body)
    assert response.status_code < 500, response.content
    if "{" in path:
        assert response.status_code == 404, response.content
    elif (method, path) == ("POST", "/relationships"):
        assert response.status_code in (404, 422), response.content
    assert MARKER not in response.content.decode(), response.content
    assert snapshot(world["workspace"]) == before


# --- roles -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), GUARDED, ids=[f"{m} {p}" for m, p in GUARDED])
def test_the_role_below_the_minimum_answers_403_and_changes_nothing(world, method, path):
    needed = min_role(method, path)
    query, body = request_parts(method, path, world["ids"])
    before = snapshot(world["workspace"])
    response = caller(world["workspace"], ROLE_BELOW[needed])(
        method, fill_path(path, world["ids"]) + query, body
    )
    assert response.status_code == 403, response.content
    assert snapshot(world["workspace"]) == before


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=IDS)
def test_the_minimum_role_is_let_in(world, method, path):
    needed = min_role(method, path)
    query, body = request_parts(method, path, world["ids"])
    response = caller(world["workspace"], needed)(method, fill_path(path, world["ids"]) + query, body)
    assert response.status_code not in (401, 403), response.content
    assert response.status_code < 500, response.content


@pytest.mark.parametrize(
    ("method", "path", "query", "body", "needed"),
    STRICTER,
    ids=[f"{m} {p}{q} {json.dumps(b) if b is not None else ''}".strip() for m, p, q, b, _ in STRICTER],
)
def test_stricter_variants_need_their_role(world, method, path, query, body, needed):
    if (method, path) not in OPERATIONS:
        pytest.fail(f"{method} {path} no longer exists; update STRICTER")
    ids = {**world["ids"], "entry": world["ids"]["tombstoned_entry"]}
    url = fill_path(path, ids) + query
    before = snapshot(world["workspace"])
    assert caller(world["workspace"], ROLE_BELOW[needed])(method, url, body).status_code == 403
    assert snapshot(world["workspace"]) == before
    response = caller(world["workspace"], needed)(method, url, body)
    # A real maintenance run is queued for the worker (202); the others answer at once.
    assert response.status_code == (202 if path.startswith("/maintenance/") else 200), response.content


def test_a_key_answers_for_its_own_workspace_only(world):
    """The same request by two workspaces' keys sees two different worlds."""
    ours = key_caller(world["workspace"], "agent")("GET", "/entries").json()
    theirs = key_caller(world["other_workspace"], "agent")("GET", "/entries").json()
    assert ours["count"] == 2
    assert theirs["count"] == 1
    assert not {e["id"] for e in ours["items"]} & {e["id"] for e in theirs["items"]}


def test_a_run_of_another_workspace_leaves_this_one_alone(world):
    Entry.objects.filter(workspace=world["workspace"]).update(created_at=timezone.now() - timedelta(days=400))
    before = snapshot(world["workspace"])
    response = key_caller(world["other_workspace"], "admin")("POST", "/maintenance/run", {"force": True})
    assert response.status_code == 202
    assert work_queued_runs() == [response.json()["run_id"]]  # the worker does the run
    assert MaintenanceRun.objects.get(pk=response.json()["run_id"]).status == "succeeded"
    assert snapshot(world["workspace"]) == before
