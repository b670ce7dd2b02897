from typing import Any

from django.core.management.base import CommandParser

from cli.management.commands._base import WorkspaceCommand, service_errors
from maintenance.revert import revert_run


class Command(WorkspaceCommand):
    help = "Undo what a maintenance run archived or tombstoned (entries not purged since)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("run_id", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        with service_errors():
            result = revert_run(workspace, options["run_id"], actor="cli")
        if options["json"]:
            self.emit_json(result)
        else:
            self.stdout.write(
                f"run {result['run_id']}: reverted {len(result['reverted'])} entries, "
                f"skipped {len(result['skipped'])} changed since, restored {result['links_restored']} links"
            )
