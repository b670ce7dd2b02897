"""``manage.py check_anchors --repo PATH --workspace SLUG [--repo-name NAME] [--json]``: mark the
workspace's code anchors valid, stale or invalidated against the HEAD of a local git checkout."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from cli.management.commands._base import WorkspaceCommand, service_errors
from maintenance.anchors import check_anchors


class Command(WorkspaceCommand):
    help = "Check a workspace's code anchors against a local git checkout (file gone / changed since)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--repo", required=True, metavar="PATH", help="A local git checkout.")
        parser.add_argument(
            "--repo-name",
            default=None,
            metavar="NAME",
            help="Only check anchors whose repo is NAME (or blank); default: every anchor.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        with service_errors():
            counts = check_anchors(workspace, options["repo"], repo_name=options["repo_name"])
        if options["json"]:
            self.emit_json(counts)
            return
        self.stdout.write(
            self.style.SUCCESS(
                f"Checked {counts['checked']} anchor(s) of {workspace.slug}: {counts['valid']} valid, "
                f"{counts['stale']} stale, {counts['invalidated']} invalidated "
                f"({counts['changed']} changed)."
            )
        )
