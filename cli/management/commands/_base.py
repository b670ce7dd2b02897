"""Shared plumbing for the management commands: ``--json`` output and ``--workspace SLUG``.

Commands stay thin: they parse options, call one service and print what it returned. Service
errors become ``CommandError`` so the process exits with status 1 and a one-line message
instead of a traceback. (The leading underscore keeps Django from listing this module as a
command.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from memory import accounts
from memory.errors import ServiceError
from memory.models import Workspace


@contextmanager
def service_errors() -> Iterator[None]:
    """Turn a service's refusal (not found, conflict, invalid input) into a CommandError."""
    try:
        yield
    except ServiceError as exc:
        raise CommandError(exc.detail) from exc


class JsonCommand(BaseCommand):
    """A command with ``--json``: one JSON object on stdout instead of the human-readable lines."""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json", action="store_true", help="Print the result as one JSON object on stdout."
        )

    def emit_json(self, data: Any) -> None:
        # Key order is part of the output contract (each command prints its keys in a fixed
        # order), so no sort_keys.
        self.stdout.write(json.dumps(data, sort_keys=False, default=str))


class WorkspaceCommand(JsonCommand):
    """A ``JsonCommand`` that works on one workspace, named with ``--workspace SLUG``."""

    # Set to False in a command that can also run over every workspace.
    workspace_required = True

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--workspace",
            required=self.workspace_required,
            metavar="SLUG",
            help="The workspace's slug.",
        )

    def get_workspace(self, slug: str) -> Workspace:
        with service_errors():
            return accounts.workspace_get(slug)
