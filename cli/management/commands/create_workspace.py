"""``manage.py create_workspace SLUG [--name NAME] [--review-mode propose|apply] [--json]``: a
workspace and its policy row. New workspaces propose: automation archives and
tombstones nothing before an operator approved it, unless ``--review-mode apply`` says otherwise."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from cli.management.commands._base import JsonCommand, service_errors
from memory import accounts
from memory.policy import APPLY, PROPOSE


class Command(JsonCommand):
    help = "Create a workspace (with its default maintenance policy)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("slug", help="Letters, digits, '-' and '_'; unique.")
        parser.add_argument("--name", default="", help="Display name (defaults to the slug).")
        parser.add_argument(
            "--review-mode",
            choices=[PROPOSE, APPLY],
            default=PROPOSE,
            help="propose (default): runs record proposals an operator approves; "
            "apply: runs archive and tombstone at once.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with service_errors():
            workspace = accounts.workspace_create(
                slug=options["slug"], name=options["name"], review_mode=options["review_mode"]
            )
        mode = options["review_mode"]
        if options["json"]:
            self.emit_json(
                {"slug": workspace.slug, "name": workspace.name, "id": workspace.pk, "review_mode": mode}
            )
            return
        self.stdout.write(self.style.SUCCESS(f"Created workspace {workspace.slug!r} ({workspace.name})."))
        if mode == PROPOSE:
            self.stdout.write(
                "Review mode propose: maintenance runs propose archives and tombstones; nothing is "
                f"changed until you approve (manage.py proposals --workspace {workspace.slug})."
            )
        else:
            self.stdout.write(
                "Review mode apply: maintenance runs archive and tombstone at once; undo with "
                "manage.py revert_run."
            )
