"""What readers tell about an entry: an access (or dispatch), a reinforcement, feedback. Each
runs in one transaction on the latest version and rescores it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F

from memory import lifecycle
from memory.errors import Conflict
from memory.models import Entry, EntryAccess, Workspace
from memory.models.choices import FeedbackSignal, Status
from memory.policy_model import MaintenancePolicy
from memory.scoring import step_salience
from memory.write_input import (
    valid_choice,
    valid_text,
)
from memory.writes import (
    SYSTEM_ACTOR,
    latest_for_write,
    rescore_written,
    resolve_now,
)


def entry_record_access(
    *,
    workspace: Workspace,
    entry_id: Any,
    actor: str,
    dispatch: bool = False,
    now: datetime | None = None,
) -> Entry:
    """An actor read the entry; ``dispatch`` means it was injected into a real agent context
    (counts toward graduation). One counter row per (lineage, actor) gives readers."""
    now = resolve_now(now)
    actor = valid_text(actor, "actor", 200, required=True)
    with transaction.atomic():
        entry = latest_for_write(workspace, entry_id)
        if entry.status == Status.TOMBSTONED:
            raise Conflict(f"entry {entry.pk} is tombstoned")
        Entry.objects.filter(pk=entry.pk).update(
            access_count=F("access_count") + 1,
            retrieval_count=F("retrieval_count") + (1 if dispatch else 0),
            last_accessed_at=now,
        )
        lineage = entry.lineage_id or entry.pk
        updated = EntryAccess.objects.filter(lineage_id=lineage, actor=actor).update(
            count=F("count") + 1, last_at=now
        )
        if not updated:
            EntryAccess.objects.create(
                workspace=workspace,
                lineage_id=lineage,
                actor=actor,
                count=1,
                first_at=now,
                last_at=now,
            )
        entry.refresh_from_db()
        if entry.status == Status.STALE:
            lifecycle.change_entry(entry, Status.ACTIVE, reason="access", actor=actor, now=now)
        rescore_written(workspace, [entry.pk], now)
    entry.refresh_from_db()
    return entry


def entry_reinforce(
    *, workspace: Workspace, entry_id: Any, actor: str = SYSTEM_ACTOR, now: datetime | None = None
) -> Entry:
    """Mark the memory as confirmed useful (staged traces need this or two dispatches to graduate)."""
    now = resolve_now(now)
    with transaction.atomic():
        entry = latest_for_write(workspace, entry_id)
        if entry.status == Status.TOMBSTONED:
            raise Conflict(f"entry {entry.pk} is tombstoned")
        entry.reinforced_at = now
        entry.updated_at = now
        entry.save(update_fields=["reinforced_at", "updated_at"])
        rescore_written(workspace, [entry.pk], now)
    entry.refresh_from_db()
    return entry


def entry_feedback(
    *,
    workspace: Workspace,
    entry_id: Any,
    signal: str,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
) -> Entry:
    """Step salience by the signal; stale/wrong also flag the entry for review."""
    now = resolve_now(now)
    valid_choice(signal, FeedbackSignal.values, "signal")
    with transaction.atomic():
        entry = latest_for_write(workspace, entry_id)
        if entry.status == Status.TOMBSTONED:
            raise Conflict(f"entry {entry.pk} is tombstoned")
        default = MaintenancePolicy.for_workspace(workspace).salience_default
        entry.salience = step_salience(entry.salience, signal, default=default)
        entry.last_feedback = signal
        entry.feedback_at = now
        entry.updated_at = now
        entry.save(update_fields=["salience", "last_feedback", "feedback_at", "updated_at"])
        rescore_written(workspace, [entry.pk], now)
    entry.refresh_from_db()
    return entry
