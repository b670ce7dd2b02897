"""The maintenance lease of a workspace.

One row per workspace, claimed with a conditional UPDATE (filter by workspace *and* by "free or
expired"; go on only if one row changed), so it works the same on SQLite and PostgreSQL and
across any number of worker machines. The holder renews it between batches (``renewer``); a
lease not renewed for LEASE_TTL is free again, so a killed run never blocks its workspace for
long.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Q
from django.utils import timezone

from maintenance.models import MaintenanceLease, MaintenanceRun
from memory.models import Workspace

log = logging.getLogger(__name__)

LEASE_TTL = timedelta(seconds=60)


def new_holder() -> str:
    return uuid.uuid4().hex


def acquire(workspace: Workspace, *, holder: str, now: datetime, run: MaintenanceRun | None = None) -> bool:
    """Claim the workspace's lease for ``holder``. True if it is ours now."""
    MaintenanceLease.objects.get_or_create(workspace=workspace)
    claimed = (
        MaintenanceLease.objects.filter(workspace=workspace)
        .filter(Q(holder="") | Q(renewed_at__isnull=True) | Q(renewed_at__lt=now - LEASE_TTL))
        .update(holder=holder, run=run, acquired_at=now, renewed_at=now)
    )
    return claimed == 1


def renew(workspace: Workspace, *, holder: str, now: datetime) -> bool:
    """Extend our lease. False means we lost it (we stalled past the TTL and someone took over):
    the caller must stop before its next batch."""
    return MaintenanceLease.objects.filter(workspace=workspace, holder=holder).update(renewed_at=now) == 1


RENEW_EVERY = 5.0  # seconds between two renewals of a run's own (``renewer``)


def renewer(workspace: Workspace, *, holder: str) -> Callable[[], bool]:
    """A run's renewal after each of its batches: ``renew``, but at most every RENEW_EVERY
    seconds; in between it answers True without asking. A lease renewed less than LEASE_TTL
    ago cannot have been taken over (``acquire`` takes only one not renewed for that long), so
    there is nothing to check; after a stall longer than RENEW_EVERY the next call renews, and
    notices a loss, before the next batch. One UPDATE and commit per batch was 1.8 s of a first
    run over 1,000,000 entries (bench/reports/maintenance.md)."""
    last: list[float | None] = [None]

    def renew_now() -> bool:
        started = time.monotonic()
        if last[0] is not None and started - last[0] < RENEW_EVERY:
            return True
        kept = renew(workspace, holder=holder, now=timezone.now())
        last[0] = started if kept else None
        return kept

    return renew_now


def release(workspace: Workspace, *, holder: str) -> None:
    MaintenanceLease.objects.filter(workspace=workspace, holder=holder).update(holder="", run=None)


def holder_of(workspace: Workspace) -> str:
    return MaintenanceLease.objects.filter(workspace=workspace).values_list("holder", flat=True).first() or ""


def holding_run_id(workspace: Workspace) -> int | None:
    """The id of the run that holds the workspace's lease, if a run holds it."""
    return (
        MaintenanceLease.objects.filter(workspace=workspace)
        .exclude(holder="")
        .values_list("run_id", flat=True)
        .first()
    )


def held(workspace: Workspace, *, now: datetime) -> tuple[bool, int | None]:
    """Whether someone holds the workspace's lease now (claimed and renewed within LEASE_TTL),
    and the id of the run that holds it (None when the holder is not a run: an approval)."""
    row = (
        MaintenanceLease.objects.filter(workspace=workspace)
        .exclude(holder="")
        .filter(renewed_at__gte=now - LEASE_TTL)
        .values_list("run_id", flat=True)
    )
    found = list(row[:1])
    return (bool(found), found[0] if found else None)


KEEP_ALIVE_EVERY = 10.0  # seconds between two renewals from the side connection


def keep_alive(workspace: Workspace, *, holder: str, reading: bool = False) -> Callable[[], bool] | None:
    """A renewal for a phase that runs inside one long transaction (the plan, rolled back at
    its end: a renewal inside it would be rolled back too; the pre-prune backup, one read
    snapshot). It renews from a connection of its own, committed at once, at most every
    KEEP_ALIVE_EVERY seconds (on PostgreSQL never waiting for a row lock: SKIP LOCKED), so a
    phase longer than the lease's TTL keeps it; a renewal that fails is logged, not raised. It
    only extends; it never reports the lease lost — the caller checks on its own connection
    once the phase is over, as before. None where it cannot work:
    inside a caller's transaction, and on SQLite for a phase that writes the database (no other
    connection could write meanwhile); a ``reading`` phase on SQLite — the backup, and the plan
    working on its copy of the database (``plan_snapshot``) — leaves the write lock to the
    renewal."""
    if connection.in_atomic_block or (connection.vendor != "postgresql" and not reading):
        return None
    last = [time.monotonic()]

    def renew_aside() -> bool:
        if time.monotonic() - last[0] < KEEP_ALIVE_EVERY:
            return True
        last[0] = time.monotonic()
        try:
            _renew_from(connections.create_connection(DEFAULT_DB_ALIAS), workspace, holder)
        except Exception:  # a courtesy: the run checks its lease itself after the phase
            log.warning(
                "lease of workspace %s not renewed from a side connection", workspace.pk, exc_info=True
            )
        return True

    return renew_aside


def _renew_from(side: Any, workspace: Workspace, holder: str) -> None:
    """One renewal of our lease on the connection ``side``, closed afterwards."""
    try:
        table = MaintenanceLease._meta.db_table
        with side.cursor() as cursor:
            if side.vendor == "postgresql":
                cursor.execute(
                    f"UPDATE {table} SET renewed_at = %s WHERE id = (SELECT id FROM {table}"
                    " WHERE workspace_id = %s AND holder = %s FOR UPDATE SKIP LOCKED)",
                    [side.ops.adapt_datetimefield_value(timezone.now()), workspace.pk, holder],
                )
            else:  # SQLite: one writer at a time (it waits up to the busy timeout), no row locks
                cursor.execute(
                    f"UPDATE {table} SET renewed_at = %s WHERE workspace_id = %s AND holder = %s",
                    [side.ops.adapt_datetimefield_value(timezone.now()), workspace.pk, holder],
                )
    finally:
        side.close()
