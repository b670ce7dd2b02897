"""``manage.py backup --workspace SLUG [--json]``: write a manual backup."""

from __future__ import annotations

from typing import Any

from cli.management.commands._base import WorkspaceCommand, service_errors
from cli.management.commands._progress import row_progress
from maintenance import backup_files, backups


class Command(WorkspaceCommand):
    help = "Write a manual backup of a workspace into the backups storage (BACKUP_DIR/<slug>/ by default)."

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        with service_errors(), row_progress("backup", enabled=not options["json"]) as progress:
            backup = backups.write_backup(workspace, reason="manual", progress=progress)
        if options["json"]:
            self.emit_json(
                {
                    "file": backup.file_name,
                    "entries": backup.entry_count,
                    "size_bytes": backup.size_bytes,
                    "sha256": backup.sha256,
                }
            )
            return
        path = backup_files.stored_name(workspace.slug, backup.file_name)
        self.stdout.write(
            self.style.SUCCESS(
                f"Wrote {path} to the backups storage ({backup.entry_count} entries, "
                f"{backup.size_bytes} bytes, "
                f"sha256 {backup.sha256})."
            )
        )
