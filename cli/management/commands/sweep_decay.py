from typing import Any

from django.core.management.base import CommandError, CommandParser

from cli.management.commands._base import WorkspaceCommand
from cli.management.commands._run import pass_progress, summary
from maintenance.models import RunStatus
from maintenance.run_results import decay_result
from maintenance.run_start import run_maintenance


class Command(WorkspaceCommand):
    help = "Decay sweep of a workspace (passes 1, 9, 10, 13): evict cold memories, expire TTLs."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--dry-run", action="store_true")
        parser.add_argument("--force", action="store_true", help="Apply even if the circuit breaker trips.")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        with pass_progress("decay", enabled=not options["json"]) as progress:
            result = run_maintenance(
                workspace=workspace,
                kind="decay",
                trigger="cli",
                dry_run=options["dry_run"],
                force=options["force"],
                progress=progress,
            )
        if options["json"]:
            self.emit_json(decay_result(result))
        else:
            self.stdout.write(summary(result, command="sweep_decay"))
        if result["status"] == RunStatus.FAILED:
            raise CommandError(f"run {result['run_id']} failed: see its error in the run history")
