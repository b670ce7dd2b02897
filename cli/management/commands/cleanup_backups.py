"""``manage.py cleanup_backups --workspace SLUG --keep N [--json]``: delete older backups."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from cli.management.commands._base import WorkspaceCommand, service_errors
from maintenance import backups


class Command(WorkspaceCommand):
    help = "Delete all but the newest N backups of a workspace (files and records, any reason)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--keep", type=int, required=True, metavar="N", help="Backups to keep (≥ 1).")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        with service_errors():
            deleted = backups.cleanup_backups(workspace, options["keep"])
        kept = len(backups.list_backups(workspace))
        if options["json"]:
            self.emit_json({"deleted": deleted, "kept": kept})
            return
        for name in deleted:
            self.stdout.write(f"Deleted {name}")
        self.stdout.write(self.style.SUCCESS(f"Deleted {len(deleted)} backups; {kept} kept."))
