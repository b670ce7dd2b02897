"""``manage.py restore_backup FILE [--workspace SLUG] [--force] [--json]``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from cli.management.commands._base import WorkspaceCommand, service_errors
from cli.management.commands._progress import row_progress
from maintenance import backup_files, restore


class Command(WorkspaceCommand):
    help = (
        "Restore a workspace from a backup of the backups storage (its name SLUG/FILE, or a "
        "bare file name with --workspace) or from a local copy of one (a path). Verifies the checksum first, "
        "runs in one transaction and never deletes rows; refuses to overwrite rows changed "
        "after the backup unless --force, and always refuses ids held by another workspace."
    )
    # The workspace may be gone: the restore brings it back. When given, it must match.
    workspace_required = False

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "file", metavar="FILE", help="Backup: SLUG/FILE or FILE of the storage, or a path."
        )
        parser.add_argument(
            "--force", action="store_true", help="Overwrite rows changed after the backup was taken."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = backup_files.resolve_backup(options["file"], options["workspace"])
        with service_errors(), row_progress("reading backup", enabled=not options["json"]) as progress:
            result = restore.restore_backup(
                path, workspace_slug=options["workspace"], force=options["force"], progress=progress
            )
        if options["json"]:
            self.emit_json(result)
            return
        inserted = sum(result["restored"].values())
        overwritten = sum(result["overwritten"].values())
        self.stdout.write(
            self.style.SUCCESS(
                f"Restored workspace {result['workspace']!r} from {result['file']}: "
                f"{inserted} rows inserted, {overwritten} overwritten, "
                f"{result['kept_newer']} newer entries kept."
            )
        )
