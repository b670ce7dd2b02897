"""The MCP endpoint's door in-process: Host/Origin settings derived from the Django settings,
Django's own host check where the SDK's cannot stand in, and the answer without the ASGI
lifespan. (Everything else runs against a real server: test_mcp.py, test_mcp_isolation.py.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from api import mcp_http


def test_exact_allowed_hosts_become_the_sdk_s_allow_lists_with_any_port(settings) -> None:
    settings.ALLOWED_HOSTS = ["memory.example.com", "127.0.0.1"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.com", "https://*.example.org"]
    security, django_checks = mcp_http.transport_security()
    assert security.enable_dns_rebinding_protection and not django_checks
    assert {"memory.example.com", "memory.example.com:*", "127.0.0.1:*"} <= set(security.allowed_hosts)
    assert "https://memory.example.com" in security.allowed_origins
    assert "https://console.example.com" in security.allowed_origins
    assert not [o for o in security.allowed_origins if "*." in o]  # Django's wildcard: not the SDK's


@pytest.mark.parametrize(("hosts", "django_checks"), [(["*"], False), ([".example.com", "localhost"], True)])
def test_django_wildcards_turn_the_sdk_check_off_and_django_s_on(settings, hosts, django_checks) -> None:
    settings.ALLOWED_HOSTS = hosts
    security, checks = mcp_http.transport_security()
    assert not security.enable_dns_rebinding_protection
    assert checks is django_checks


def _call(door: mcp_http.McpDoor, host: str) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [(b"host", host.encode())]}
    asyncio.run(door(scope, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])


def test_a_wildcard_deployment_answers_421_for_a_host_django_would_refuse(settings) -> None:
    settings.ALLOWED_HOSTS = [".example.com"]
    door = mcp_http.McpDoor()
    door.running = True  # the check comes first: the SDK's app is not reached
    status, body = _call(door, "evil.test")
    assert status == 421 and "evil.test" in body["detail"]


def test_without_the_lifespan_the_endpoint_says_what_it_needs() -> None:
    door = mcp_http.McpDoor()
    status, body = _call(door, "127.0.0.1:8000")
    assert status == 503 and "lifespan" in body["detail"]
