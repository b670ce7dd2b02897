"""``/mcp`` over Streamable HTTP: the SDK's app for the tools of ``api.mcp``, behind the API key.

Invariants: stateless (no session, plain JSON answers), so any web process answers any
request; the bearer token is an API key checked by the JSON API's own door
(``memory.auth.key_principal``), refusals answered with the API's statuses and bodies; Host
and Origin are checked against ``ALLOWED_HOSTS`` and ``CSRF_TRUSTED_ORIGINS`` (Django's
wildcards fall back to Django's host check). ``config.asgi`` mounts ``app`` and enters
``running()`` in its lifespan: the SDK's session manager must run for the app to answer.
The contract: docs/mcp.md.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from django.conf import settings
from django.db import DatabaseError
from django.http.request import split_domain_port, validate_host
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import AnyHttpUrl

from api.mcp import build_server
from api.mcp_calls import KeyAccess, in_django
from config.middleware import RETRY_AFTER_SECONDS
from memory.auth import RateLimited, key_principal

log = logging.getLogger(__name__)

PATH = "/mcp"
METADATA_PATH = "/.well-known/oauth-protected-resource"
PATHS = (PATH, METADATA_PATH, METADATA_PATH + PATH)

# The refusals of this request's key check that are not "unknown key" (see McpDoor).
_REFUSALS: contextvars.ContextVar[list[tuple[int, str, dict[str, str]]] | None] = contextvars.ContextVar(
    "mcp_refusals", default=None
)


def public_url() -> str:
    """The URL clients use for /mcp: the resource the protected-resource metadata names."""
    configured = getattr(settings, "MCP_PUBLIC_URL", "")
    if configured:
        return str(configured).rstrip("/")
    return f"http://127.0.0.1:{settings.PORT}{PATH}"


class KeyVerifier:
    """The SDK's TokenVerifier: a bearer token is an API key of this workspace service."""

    async def verify_token(self, token: str) -> KeyAccess | None:
        try:
            who = await anyio.to_thread.run_sync(in_django, lambda: key_principal(token))
        except RateLimited as exc:
            _refuse(429, exc.detail, {"Retry-After": str(exc.retry_after)})
            return None
        except DatabaseError as exc:
            log.warning("MCP key check: database unavailable: %s", exc)
            _refuse(503, "database unavailable; retry shortly", {"Retry-After": str(RETRY_AFTER_SECONDS)})
            return None
        if who is None or who.key is None:
            return None
        return KeyAccess(
            token=who.key.secret_hash,
            client_id=f"key-{who.key.pk}",
            scopes=[who.role],
            subject=who.actor,
            principal=who,
        )


def _refuse(status: int, detail: str, headers: dict[str, str]) -> None:
    refusals = _REFUSALS.get()
    if refusals is not None:
        refusals.append((status, detail, headers))


def transport_security() -> tuple[TransportSecuritySettings, bool]:
    """The SDK's Host/Origin checks from the Django settings, and whether Django's own host
    check must stand in for them (a wildcard the SDK cannot express)."""
    hosts = list(settings.ALLOWED_HOSTS)
    if any(h == "*" or h.startswith(".") for h in hosts):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False), "*" not in hosts
    allowed_hosts, origins = [], []
    for host in hosts:
        allowed_hosts += [host, f"{host}:*"]
        origins += [f"http://{host}", f"http://{host}:*", f"https://{host}", f"https://{host}:*"]
    origins += [o for o in settings.CSRF_TRUSTED_ORIGINS if "*" not in o]
    return (
        TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=allowed_hosts, allowed_origins=origins
        ),
        False,
    )


def _server() -> MCPServer:
    url = public_url()
    return build_server(
        token_verifier=KeyVerifier(),
        auth=AuthSettings(
            # No OAuth server of ours issues these tokens: the site that issues the keys is named.
            issuer_url=AnyHttpUrl(url.removesuffix(PATH) or url),
            resource_server_url=AnyHttpUrl(url),
            validate_token_resource=False,  # an API key is for this service, whatever its URL
        ),
    )


class McpDoor:
    """The SDK's Starlette app behind two amendments: Django's host check where the SDK's
    cannot stand in, and the key check's refusals other than "unknown key" (rate limit,
    database) answered as the JSON API answers them instead of the SDK's 401."""

    def __init__(self) -> None:
        self.server = _server()
        security, self.check_host = transport_security()
        self.app = self.server.streamable_http_app(
            streamable_http_path=PATH,
            json_response=True,
            stateless_http=True,
            transport_security=security,
            max_request_body_size=int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2_621_440),
        )
        self.running = False

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        async with self.server.session_manager.run():
            self.running = True
            try:
                yield
            finally:
                self.running = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not self.running:
            await _json(send, 503, "the MCP endpoint needs the ASGI lifespan (uvicorn --lifespan on or auto)")
            return
        if self.check_host:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            domain, _port = split_domain_port(host)
            if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
                await _json(send, 421, f"host {host!r} is not served here")
                return
        if scope["path"] == METADATA_PATH:  # the metadata at the host's root names the same resource
            scope = {**scope, "path": METADATA_PATH + PATH, "raw_path": (METADATA_PATH + PATH).encode()}
        refusals: list[tuple[int, str, dict[str, str]]] = []
        reset = _REFUSALS.set(refusals)
        replaced = False

        async def amended(message: MutableMapping[str, Any]) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and message["status"] == 401 and refusals:
                replaced = True
                status, detail, headers = refusals[-1]
                await _json(send, status, detail, headers)
                return
            if replaced:  # the SDK's 401 body, already answered
                return
            await send(message)

        try:
            await self.app(scope, receive, amended)
        finally:
            _REFUSALS.reset(reset)


async def _json(send: Any, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    head += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


def serves(scope: dict[str, Any]) -> bool:
    return scope["type"] == "http" and scope["path"] in PATHS
