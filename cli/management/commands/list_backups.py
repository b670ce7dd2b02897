"""``manage.py list_backups --workspace SLUG [--json]``: a workspace's backups, newest first."""

from __future__ import annotations

from typing import Any

from cli.management.commands._base import WorkspaceCommand
from maintenance import backups


class Command(WorkspaceCommand):
    help = "List a workspace's backups, newest first."

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        rows = [
            {
                "file": b.file_name,
                "reason": b.reason,
                "entries": b.entry_count,
                "size_bytes": b.size_bytes,
                "sha256": b.sha256,
                "created_at": b.created_at.isoformat(),
            }
            for b in backups.list_backups(workspace)
        ]
        if options["json"]:
            self.emit_json({"workspace": workspace.slug, "backups": rows})
            return
        if not rows:
            self.stdout.write(f"No backups of workspace {workspace.slug!r}.")
        for row in rows:
            self.stdout.write(
                f"{row['file']}  {row['reason']:<9}  {row['entries']:>7} entries  "
                f"{row['size_bytes']:>10} bytes  {row['created_at']}"
            )
