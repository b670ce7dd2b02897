"""``manage.py create_workspace SLUG [--name NAME] [--json]``: a workspace and its policy row."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from memory import services
from memory.management.commands._base import JsonCommand, service_errors


class Command(JsonCommand):
    help = "Create a workspace (with its default maintenance policy)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("slug", help="Letters, digits, '-' and '_'; unique.")
        parser.add_argument("--name", default="", help="Display name (defaults to the slug).")

    def handle(self, *args: Any, **options: Any) -> None:
        with service_errors():
            workspace = services.workspace_create(slug=options["slug"], name=options["name"])
        if options["json"]:
            self.emit_json({"slug": workspace.slug, "name": workspace.name, "id": workspace.pk})
            return
        self.stdout.write(self.style.SUCCESS(f"Created workspace {workspace.slug!r} ({workspace.name})."))
