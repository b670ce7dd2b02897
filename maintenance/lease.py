"""The maintenance lease of a workspace (SPEC §4.1).

One row per workspace, claimed with a conditional UPDATE (filter by workspace *and* by "free or
expired"; go on only if one row changed), so it works the same on SQLite and PostgreSQL and
across any number of worker machines. The holder renews it after every batch; a lease not
renewed for LEASE_TTL is free again, so a killed run never blocks its workspace for long.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.db.models import Q

from maintenance.models import MaintenanceLease, MaintenanceRun
from memory.models import Workspace

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


def release(workspace: Workspace, *, holder: str) -> None:
    MaintenanceLease.objects.filter(workspace=workspace, holder=holder).update(holder="", run=None)


def holder_of(workspace: Workspace) -> str:
    return MaintenanceLease.objects.filter(workspace=workspace).values_list("holder", flat=True).first() or ""
