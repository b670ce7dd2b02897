"""Import a journal JSONL file into an existing workspace; safe to run again.

The summary ends with what maintenance will do with the import: in a propose-mode workspace
(the default) its runs only propose, so nothing imported is archived or tombstoned before an
operator has seen and approved a proposal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from cli.management.commands._base import WorkspaceCommand
from memory import journal_import
from memory.policy_model import MaintenancePolicy


class _ProgressBar:
    """A tqdm bar that follows the stages of the import (reading, writing, linking, scoring)."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.stage = ""

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(file=sys.stderr, unit="rec", dynamic_ncols=True, desc=stage, total=total or None)
        elif stage != self.stage:
            self.bar.set_description(stage)
            self.bar.reset(total=total or None)
        self.stage = stage
        self.bar.n = done
        self.bar.update(0)  # redraws at most every mininterval

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Command(WorkspaceCommand):
    help = (
        "Import journal JSONL (the flask corpus format) into a workspace. Records are matched on "
        "their id, so importing the same file again adds nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("file", help="Path of the .jsonl file.")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["workspace"]
        try:
            workspace = self.get_workspace(slug)
        except CommandError as exc:
            raise CommandError(f"{exc}; create it first (manage.py create_workspace {slug})") from None
        path = Path(options["file"])
        if not path.is_file():
            raise CommandError(f"{path}: no such file")

        bar = _ProgressBar() if not options["json"] and sys.stderr.isatty() else None
        try:
            counts = journal_import.import_journal(workspace=workspace, path=path, progress=bar)
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror or exc}") from None
        finally:
            if bar is not None:
                bar.close()

        if options["json"]:
            self.emit_json(counts.as_dict())
            return
        self.stdout.write(
            f"Imported {counts.file} into workspace {counts.workspace!r}: {counts.records} records — "
            f"{counts.created} created, {counts.updated} updated, {counts.unchanged} unchanged, "
            f"{counts.invalid} invalid."
        )
        self.stdout.write(
            f"Links: {counts.links_created} created, {counts.links_unresolved} unresolved "
            f"(target not in the workspace). Anchors created: {counts.anchors_created}. "
            f"Tags created: {counts.tags_created}."
        )
        if counts.errors:
            shown = len(counts.errors)
            more = f" (first {shown} of {counts.invalid})" if counts.invalid > shown else ""
            self.stdout.write(self.style.WARNING(f"Skipped invalid records{more}:"))
            for error in counts.errors:
                self.stdout.write(f"  {error}")
        if MaintenancePolicy.for_workspace(workspace).proposes:
            self.stdout.write(
                "Review mode propose: maintenance will propose archives and tombstones for these "
                "entries and change none of them until you approve "
                f"(manage.py proposals --workspace {workspace.slug})."
            )
        else:
            self.stdout.write(
                self.style.WARNING(
                    "Review mode apply: the next maintenance run archives and tombstones at once "
                    "(the scheduler starts one within minutes); check it first with manage.py maintain "
                    f"--workspace {workspace.slug} --dry-run, or switch the workspace to propose."
                )
            )
