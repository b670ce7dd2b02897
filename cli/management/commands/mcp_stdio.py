"""``manage.py mcp_stdio --key KEY``: the MCP tools, resources and prompt of ``/mcp`` over stdio,
for a local client that launches its servers as subprocesses.

The key fixes the workspace and the role, as over HTTP; it is checked now (an unknown or revoked
key exits with status 1) and again on every call through the JSON API's key door, so revoking
it stops this process's tools at once and the per-key rate limit counts every call. The key
may come from the environment (``MEMORY_STEWARD_KEY``) instead of the command line, where
other users of the machine could read it. Stdout carries only the protocol; logs go to stderr.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
from django.core.management.base import BaseCommand, CommandError, CommandParser

from api import mcp, mcp_calls
from memory.auth import key_principal

KEY_ENV = "MEMORY_STEWARD_KEY"


class Command(BaseCommand):
    help = "Serve the MCP tools over stdio with an API key (the key fixes workspace and role)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--key", default=None, help=f"The API key (default: ${KEY_ENV}).")

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["key"] or os.environ.get(KEY_ENV, "")
        if not key:
            raise CommandError(f"an API key is needed: --key KEY or ${KEY_ENV}")
        who = mcp_calls.in_django(lambda: key_principal(key))
        if who is None:
            raise CommandError("the API key is unknown or revoked")
        self.stderr.write(f"MCP over stdio: workspace {who.workspace.slug!r}, role {who.role}")
        mcp_calls.STDIO.key = key
        anyio.run(mcp.build_server().run_stdio_async)
