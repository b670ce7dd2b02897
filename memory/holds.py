"""Operator holds: an operator's corrective decision sticks.

Restore, revert, a rejected proposal, a hygiene "keep" and a dispute resolved in an entry's
favour put a hold on the entry; the one protection rule (``memory.models.entries.protected``) keeps
every automatic pass away from a held entry until an operator releases it, its content changes
(a new version starts unheld) or ``operator_hold_days`` have passed. The entry's history says
who decided, when and why: a restore or revert names the hold in its own event's details; a
hold without a status change (reject, keep, a dispute) and a release each write a
LifecycleEvent that changes no status (reason ``hold`` / ``release``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from memory import lifecycle
from memory.errors import Conflict
from memory.models import Entry, LifecycleEvent, Workspace

HOLD = "hold"
RELEASE = "release"
# Events that record a decision without changing the entry's status.
EVENT_REASONS = (HOLD, RELEASE)
CHUNK = 500  # ids per IN (...)


def columns(reason: str, actor: str, now: datetime) -> dict[str, Any]:
    """The entry columns of a hold placed now, for a hold placed with a status change (a
    restore, a revert): ``memory.lifecycle.change_status`` sets status and hold in one
    statement, records the hold in the change's event and announces it."""
    return {"held_at": now, "held_by": actor, "hold_reason": reason}


def hold(
    workspace: Workspace,
    entry_ids: Iterable[int],
    *,
    reason: str,
    actor: str,
    now: datetime,
) -> int:
    """Put (or renew) an operator hold on the latest entries among ``entry_ids`` of the
    workspace; returns how many. Runs in the caller's transaction when there is one."""
    ids = sorted(set(entry_ids))
    if not ids:
        return 0
    rows: list[tuple[int, str]] = []
    with transaction.atomic():
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            found = list(
                Entry.objects.filter(workspace=workspace, pk__in=chunk, is_latest=True).values_list(
                    "pk", "status"
                )
            )
            Entry.objects.filter(pk__in=[pk for pk, _ in found]).update(**columns(reason, actor, now))
            rows += found
        LifecycleEvent.objects.bulk_create(
            LifecycleEvent(
                workspace=workspace,
                entry_id=pk,
                entry_ref=pk,
                from_status=status,
                to_status=status,
                reason=HOLD,
                actor=actor,
                created_at=now,
                details={"hold_reason": reason},
            )
            for pk, status in rows
        )
    lifecycle.announce(workspace.pk)  # keep, reject, dispute: any door
    return len(rows)


def release(workspace: Workspace, entry: Entry, *, actor: str, now: datetime | None = None) -> Entry:
    """Clear the operator hold of ``entry`` (the latest version, already looked up in the
    workspace); the event keeps who had held it, since when and why."""
    now = now or timezone.now()
    with transaction.atomic():
        current = Entry.objects.select_for_update().get(pk=entry.pk, workspace=workspace)
        if current.held_at is None:
            raise Conflict(f"entry {current.pk} is not held")
        LifecycleEvent.objects.create(
            workspace=workspace,
            entry=current,
            entry_ref=current.pk,
            from_status=current.status,
            to_status=current.status,
            reason=RELEASE,
            actor=actor,
            created_at=now,
            details={
                "held_by": current.held_by,
                "held_at": current.held_at.isoformat(),
                "hold_reason": current.hold_reason,
            },
        )
        current.held_at = None
        current.held_by = ""
        current.hold_reason = ""
        current.save(update_fields=["held_at", "held_by", "hold_reason"])
    lifecycle.announce(workspace.pk)
    return current
