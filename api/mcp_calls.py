"""Who calls an MCP tool or resource, and how a call runs.

Who calls is fixed by the API key, never by an argument: over HTTP the key is the bearer token
(``api.mcp_http`` verifies it through ``memory.auth.key_principal``, the JSON API's door);
over stdio (``manage.py mcp_stdio --key``) the same function checks the key on every call, so
a revoked key stops working at once and the per-key rate limit counts every call.

Tools run on the SDK's worker threads (plain ``def`` handlers); each call hands its database
connection back afterwards, as a request does at request_finished.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from django.db import close_old_connections
from django.http import HttpRequest
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from pydantic import BaseModel, ConfigDict, Field

from memory.auth import Principal, key_principal
from memory.errors import Forbidden, ServiceError


class KeyAccess(AccessToken):
    """The SDK's access token of a verified API key, carrying its principal."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    principal: Principal = Field(exclude=True)


@dataclass
class _Stdio:
    key: str | None = None


STDIO = _Stdio()  # set by ``manage.py mcp_stdio``: the key every stdio call is checked with


def caller() -> Principal:
    """The principal of the current call: the bearer key's (HTTP), else the stdio key's."""
    token = get_access_token()
    if isinstance(token, KeyAccess):
        return token.principal
    if STDIO.key is not None:
        found = key_principal(STDIO.key)
        if found is None:
            raise Forbidden("the API key is unknown or revoked")
        return found
    raise Forbidden("authentication required: Authorization: Bearer <key>")


def call_request(who: Principal) -> HttpRequest:
    """A request standing for the call, as the API's endpoint functions read it."""
    request = HttpRequest()
    request.method = "POST"
    request.principal = who  # type: ignore[attr-defined]
    return request


def refusal_text(exc: ServiceError) -> str:
    """The API's answer to a refusal as one line: status, reason phrase, detail (and the ids a
    client needs to act on it, as the API puts them beside ``detail``)."""
    text = f"{exc.status_code} {HTTPStatus(exc.status_code).phrase}: {exc.detail}"
    if exc.fields:
        text += " " + json.dumps(exc.fields, default=str, sort_keys=True)
    return text


def in_django(work: Callable[[], Any]) -> Any:
    """Run ``work`` as a request's thread would: stale connections closed first, the
    connection handed back after."""
    close_old_connections()
    try:
        return work()
    finally:
        close_old_connections()


def dump(out: type[BaseModel], value: Any, request: HttpRequest) -> tuple[dict[str, Any], str]:
    """``value`` through the out-schema, as the API would render it: the JSON object and its
    text (both written by pydantic's compiled serialiser)."""
    model = out.model_validate(value, context={"request": request})
    return model.model_dump(mode="json"), model.model_dump_json()


def output_schema(out: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of what ``dump`` writes (field names, not aliases, as the API renders)."""
    return out.model_json_schema(mode="serialization", by_alias=False)
