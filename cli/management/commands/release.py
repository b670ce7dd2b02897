"""``manage.py release ENTRY_ID --workspace SLUG [--json]``: end an operator hold."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from cli.management.commands._base import WorkspaceCommand, service_errors
from memory import entry_changes
from memory.holds import RELEASE
from memory.models import LifecycleEvent


class Command(WorkspaceCommand):
    help = "Release an entry's operator hold: automatic passes may archive or tombstone it again."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("entry_id", type=int, help="The entry's id (its latest version).")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        with service_errors():
            entry = entry_changes.entry_release(
                workspace=workspace, entry_id=options["entry_id"], actor="cli"
            )
        # The release event keeps the hold that ended: who had held the entry, since when, why.
        events = LifecycleEvent.objects.filter(entry=entry, reason=RELEASE)
        event = events.order_by("-created_at", "-pk").first()
        was = event.details if event is not None else {}
        if options["json"]:
            self.emit_json(
                {
                    "id": entry.pk,
                    "status": entry.status,
                    "held": False,
                    "released_hold": {k: was.get(k) for k in ("held_by", "held_at", "hold_reason")},
                }
            )
            return
        self.stdout.write(
            f"entry {entry.pk} ({entry.status}) released: it was held by {was.get('held_by')} since "
            f"{str(was.get('held_at'))[:16]} ({was.get('hold_reason')}); automatic passes may change it "
            "again."
        )
