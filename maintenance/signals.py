"""The maintenance app's signals, and its handlers (connected in ``MaintenanceConfig.ready()``).

``run_changed`` — a run was recorded or started (``stage="started"``), began its next pass
(``"progress"``) or ended, whatever its status (``"finished"``). Keyword arguments: ``run``
(the MaintenanceRun row in hand, its ``progress`` current) and ``stage``; for progress told
from inside a plan's long transaction, ``cursor``: a cursor of a connection of its own, through
which a receiver tells at once (its writes commit on their own). Receivers of the other stages
act after commit. The console's live layer receives it and pushes the run's page, the run list
and, after a run that changed entries, the review counts.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.dispatch import Signal
from django_q.models import Schedule

from maintenance.models import HygieneRankDirty, HygieneRankState, MaintenanceRun
from maintenance.schedules import sync_schedules

log = logging.getLogger(__name__)

run_changed = Signal()


def announce_run(run: MaintenanceRun, stage: str, *, cursor: Any = None) -> None:
    """Send ``run_changed``; a receiver's failure is logged, never raised (telling is a
    courtesy: it never fails the run)."""
    for receiver, result in run_changed.send_robust(
        sender=MaintenanceRun, run=run, stage=stage, cursor=cursor
    ):
        if isinstance(result, Exception):
            log.warning("run %s (%s) not told by %r", run.pk, stage, receiver, exc_info=result)


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


def lock_rank_state(sender: Any, instance: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    """Before a workspace's rows are deleted (inside the deletion's transaction), take its
    hygiene rank's state row: a fold takes it before the rank rows, and a deletion taking the
    rank rows first, then the state row, could deadlock with one."""
    HygieneRankState.objects.using(using).select_for_update().filter(workspace_id=instance.pk).first()


def forget_rank_marks(sender: Any, instance: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    """A deleted workspace's hygiene rank marks (``HygieneRankDirty`` names its workspace by id
    only, so that the triggers can write it while the entries are deleted) go with it."""
    HygieneRankDirty.objects.using(using).filter(workspace_id=instance.pk).delete()
