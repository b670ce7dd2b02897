"""``manage.py create_api_key --workspace SLUG --role R --name N [--json]``: prints the key once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from cli.management.commands._base import WorkspaceCommand, service_errors
from memory import accounts
from memory.models.choices import KeyRole


class Command(WorkspaceCommand):
    help = "Create an API key. The key is printed once; only its sha256 is stored."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--role", required=True, choices=KeyRole.values)
        parser.add_argument("--name", required=True, help="What the key is for (shown in the admin).")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        with service_errors():
            key, raw = accounts.api_key_create(
                workspace=workspace, name=options["name"], role=options["role"], actor="cli"
            )
        if options["json"]:
            self.emit_json({"key": raw, "prefix": key.prefix, "role": key.role, "workspace": workspace.slug})
            return
        self.stdout.write(f"Key {key.prefix}… ({key.role}) for workspace {workspace.slug!r}:")
        self.stdout.write(raw)
        self.stdout.write(self.style.WARNING("Store it now: it cannot be shown again."))
