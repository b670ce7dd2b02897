from typing import Any

from django.core.management.base import CommandError, CommandParser

from cli.management.commands._base import WorkspaceCommand
from cli.management.commands._run import pass_progress, summary
from maintenance.models import RunStatus
from maintenance.run_results import prune_result
from maintenance.run_start import run_maintenance


class Command(WorkspaceCommand):
    help = "Prune a workspace (passes 1, 5, 8, 13) with parameters overriding its policy."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--dry-run", action="store_true")
        parser.add_argument("--force", action="store_true", help="Apply even if the circuit breaker trips.")
        parser.add_argument("--exclude-tags", default=None, help="Comma-separated tags no pass may touch.")
        parser.add_argument("--archive-older-than-days", type=int, default=None)
        parser.add_argument("--prune-older-than-days", type=int, default=None)
        parser.add_argument("--hard-delete-older-than-days", type=int, default=None)
        parser.add_argument("--importance-threshold", type=float, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        params = {
            name: options[name]
            for name in (
                "archive_older_than_days",
                "prune_older_than_days",
                "hard_delete_older_than_days",
                "importance_threshold",
                "exclude_tags",
            )
        }
        with pass_progress("prune", enabled=not options["json"]) as progress:
            result = run_maintenance(
                workspace=workspace,
                kind="prune",
                trigger="cli",
                dry_run=options["dry_run"],
                force=options["force"],
                params=params,
                progress=progress,
            )
        if options["json"]:
            self.emit_json(prune_result(result))
        else:
            self.stdout.write(summary(result, command="prune"))
        if result["status"] == RunStatus.FAILED:
            raise CommandError(f"run {result['run_id']} failed: see its error in the run history")
