"""Export a workspace as journal JSONL, the format import_entries reads."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from cli.management.commands._base import WorkspaceCommand
from memory import journal_export


class Command(WorkspaceCommand):
    help = (
        "Write every latest, not tombstoned entry of a workspace as journal JSONL (to stdout "
        "unless --output is given); import_entries reads it back unchanged. With --output, "
        "--json prints a summary of what was written."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--output", metavar="FILE", help="File to write (replaced whole); stdout when absent."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])

        if not options["output"]:
            journal_export.export_journal(workspace=workspace, out=self.stdout)
            return

        target = Path(options["output"])
        # Written beside the target and renamed over it: a failed export never leaves half a file.
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        except OSError as exc:
            raise CommandError(f"{target}: {exc.strerror or exc}") from None
        try:
            os.chmod(tmp, 0o644)  # mkstemp makes it private; an export is an ordinary file
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
                counts = journal_export.export_journal(workspace=workspace, out=out)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

        summary = {**counts.as_dict(), "file": str(target)}
        if options["json"]:
            self.emit_json(summary)
        else:
            self.stdout.write(
                f"Exported {counts.entries} entries ({counts.anchors} anchors, {counts.links} links) "
                f"of workspace {counts.workspace!r} to {target}."
            )
