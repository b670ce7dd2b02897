"""``manage.py revoke_api_key --workspace SLUG PREFIX [--json]``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from cli.management.commands._base import WorkspaceCommand, service_errors
from memory import accounts
from memory.models import ApiKey


class Command(WorkspaceCommand):
    help = "Revoke an API key of a workspace, named by its prefix. Revoking twice changes nothing."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("prefix", help="The key's prefix as shown by create_api_key and the admin.")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        prefix = options["prefix"]
        # Scoped to the workspace: another workspace's prefix is simply not found.
        keys = ApiKey.objects.filter(workspace=workspace, prefix=prefix)
        key_id = keys.values_list("pk", flat=True).first()
        if key_id is None:
            raise CommandError(f"api key {prefix!r} not found in workspace {workspace.slug!r}")
        with service_errors():
            key = accounts.api_key_revoke(workspace=workspace, key_id=key_id)
        if options["json"]:
            self.emit_json(
                {
                    "prefix": key.prefix,
                    "workspace": workspace.slug,
                    "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
                }
            )
            return
        self.stdout.write(self.style.SUCCESS(f"Revoked key {key.prefix}… ({key.name}) at {key.revoked_at}."))
