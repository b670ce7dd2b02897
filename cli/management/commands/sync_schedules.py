"""``manage.py sync_schedules [--json]``: upsert the schedules declared in
``maintenance.schedules`` by name (``migrate`` does the same after every run)."""

from __future__ import annotations

from typing import Any

from cli.management.commands._base import JsonCommand
from maintenance.schedules import sync_schedules


class Command(JsonCommand):
    help = "Create, update or remove django-q2 schedules to match the ones declared in code."

    def handle(self, *args: Any, **options: Any) -> None:
        result = sync_schedules()
        if options["json"]:
            self.emit_json(result)
            return
        for action in ("created", "updated", "removed", "unchanged"):
            for name in result[action]:
                self.stdout.write(f"{action:>9}  {name}")
        changes = sum(len(result[a]) for a in ("created", "updated", "removed"))
        self.stdout.write(self.style.SUCCESS(f"Schedules in sync ({changes} change(s))."))
