from typing import Any

from django.core.management.base import CommandError, CommandParser

from cli.management.commands._base import WorkspaceCommand
from cli.management.commands._run import pass_progress, summary
from maintenance.models import RunKind, RunStatus
from maintenance.run_start import run_maintenance


class Command(WorkspaceCommand):
    help = (
        "Run the maintenance of a workspace: every maintenance pass in order, or with --kind only the "
        "hygiene, contradiction or compaction pass (after scoring)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--dry-run", action="store_true", help="Report what would change; change nothing."
        )
        parser.add_argument("--force", action="store_true", help="Apply even if the circuit breaker trips.")
        parser.add_argument(
            "--kind",
            choices=[RunKind.FULL, RunKind.HYGIENE, RunKind.CONTRADICTIONS, RunKind.CONSOLIDATE],
            default=RunKind.FULL,
            help="full (default), or one quality pass alone",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        with pass_progress(options["kind"], enabled=not options["json"]) as progress:
            result = run_maintenance(
                workspace=workspace,
                kind=options["kind"],
                trigger="cli",
                dry_run=options["dry_run"],
                force=options["force"],
                progress=progress,
            )
        if options["json"]:
            self.emit_json(result)
        else:
            self.stdout.write(summary(result, command="maintain"))
        if result["status"] == RunStatus.FAILED:
            raise CommandError(f"run {result['run_id']} failed: see its error in the run history")
