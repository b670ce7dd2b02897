"""Signal handlers of the maintenance app (connected in ``MaintenanceConfig.ready()``)."""

from __future__ import annotations

import sys
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django_q.models import Schedule

from maintenance.schedules import sync_schedules


def sync_schedules_after_migrate(
    *, using: str = DEFAULT_DB_ALIAS, verbosity: int = 1, stdout: Any = None, **kwargs: Any
) -> None:
    """Upsert the declared schedules after ``migrate``.

    ``migrate maintenance`` can run before django_q's own migrations (or django_q may be
    migrated back to zero): then there is no table to write to yet, and the next full
    ``migrate`` syncs. Checking the table list is one cheap introspection query.
    """
    if Schedule._meta.db_table not in connections[using].introspection.table_names():
        return
    result = sync_schedules(using=using)
    if verbosity >= 2:
        out = stdout or sys.stdout
        for action in ("created", "updated", "removed"):
            for name in result[action]:
                out.write(f"  Schedule {name}: {action}\n")
