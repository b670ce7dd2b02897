"""Changes of an existing entry: update (a new version when the content changes), tombstone,
restore, release, status and pin. Each runs in one transaction on the latest version, changes a
status only through ``memory.lifecycle`` and rescores the entries whose score inputs changed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q

from memory import holds, lifecycle
from memory.errors import Conflict
from memory.models import CodeAnchor, Entry, LifecycleEvent, Relationship, Tombstone, Workspace
from memory.models.choices import CONTENT_MAX, HoldReason, Status, TombstoneReason
from memory.policy_model import MaintenancePolicy
from memory.relationships import neighbour_ids
from memory.write_input import (
    AnchorIn,
    clean_tag_names,
    content_hash,
    valid_bool,
    valid_choice,
    valid_text,
    validate_writable,
)
from memory.writes import (
    SYSTEM_ACTOR,
    check_contradictions,
    latest_for_write,
    rescore_written,
    resolve_now,
    tags_for_names,
)


@dataclass(frozen=True)
class UpdateResult:
    entry: Entry
    new_version: bool
    supersedes: int | None
    disputes: tuple[Any, ...] = ()  # open disputes named by a checked write


def entry_update(
    *,
    workspace: Workspace,
    entry_id: Any,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
    content: str | None = None,
    tags: Iterable[str] | None = None,
    anchors: Iterable[Mapping[str, Any]] | None = None,
    **fields: Any,
) -> UpdateResult:
    """Update the latest version of an entry.

    Changed content adds a version: a new row with ``supersedes`` and the same lineage, the
    old row kept with ``is_latest = false``; links, anchors (unless replaced), tags and access
    history move to the new version, whose age starts now. Identical content changes the other
    fields in place and leaves the decay clock (``created_at``) alone.
    """
    now = resolve_now(now)
    values = validate_writable(fields)
    tag_names = clean_tag_names(tags) if tags is not None else None
    anchor_list = [AnchorIn.parse(a) for a in anchors] if anchors is not None else None
    if content is not None:
        content = valid_text(content, "content", CONTENT_MAX, required=True)

    with transaction.atomic():
        old = latest_for_write(workspace, entry_id)
        if old.status == Status.TOMBSTONED:
            raise Conflict(f"entry {old.pk} is tombstoned; restore it before updating")
        new_external = values.get("external_id")
        if (
            new_external
            and new_external != old.external_id
            and Entry.objects.filter(workspace=workspace, external_id=new_external, is_latest=True).exists()
        ):
            raise Conflict(f"external_id {new_external!r} already exists in this workspace")
        changed = content is not None and content_hash(content) != old.content_hash
        if not changed:
            entry = old
            for name, value in values.items():
                setattr(entry, name, value)
            entry.updated_at = now
            entry.save(update_fields=[*values.keys(), "updated_at"])
            if tag_names is not None:
                entry.tags.set(tags_for_names(workspace, tag_names))
            if anchor_list is not None:
                entry.anchors.all().delete()
                CodeAnchor.objects.bulk_create([a.row(entry) for a in anchor_list])
            rescore_written(workspace, [entry.pk], now)
            text_or_kind = {"title", "tier", "source", "entry_type"} & values.keys()
            disputes = check_contradictions(entry, now) if text_or_kind else []
            entry.refresh_from_db()
            return UpdateResult(entry=entry, new_version=False, supersedes=None, disputes=tuple(disputes))

        assert content is not None
        old_tags = list(old.tags.all()) if tag_names is None else tags_for_names(workspace, tag_names)
        Entry.objects.filter(pk=old.pk).update(is_latest=False, updated_at=now)
        new = Entry.objects.get(pk=old.pk)
        new.pk = None
        new.id = None
        new._state.adding = True
        for name, value in values.items():
            setattr(new, name, value)
        new.content = content
        new.content_hash = content_hash(content)
        new.supersedes_id = old.pk
        new.is_latest = True
        new.created_at = now
        new.updated_at = now
        new.review_kept_hash = ""
        # An operator's hold was a decision about the old content: the new version starts free.
        new.held_at = None
        new.held_by = ""
        new.hold_reason = ""
        new.save()  # in the old version's status: a change of it is recorded below
        new.tags.set(old_tags)
        Relationship.objects.filter(from_entry_id=old.pk).update(from_entry_id=new.pk)
        Relationship.objects.filter(to_entry_id=old.pk).update(to_entry_id=new.pk)
        if anchor_list is None:
            CodeAnchor.objects.filter(entry_id=old.pk).update(entry_id=new.pk)
        else:
            CodeAnchor.objects.bulk_create([a.row(new) for a in anchor_list])
        if new.status == Status.STALE:
            # An update is activity: a stale memory that is being rewritten is in use again.
            lifecycle.change_entry(new, Status.ACTIVE, reason="update", actor=actor, now=now)
        rescore_written(workspace, [new.pk, *neighbour_ids([new.pk])], now)
        disputes = check_contradictions(new, now)
    new.refresh_from_db()
    return UpdateResult(entry=new, new_version=True, supersedes=old.pk, disputes=tuple(disputes))


def entry_tombstone(
    *,
    workspace: Workspace,
    entry_id: Any,
    reason: str = TombstoneReason.MANUAL,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
    run: Any = None,
) -> Tombstone:
    """Soft-delete the latest version: status tombstoned plus a Tombstone whose purge_after
    is now + the workspace's purge grace. Nothing is removed until purge."""
    now = resolve_now(now)
    valid_choice(reason, TombstoneReason.values, "reason")
    with transaction.atomic():
        entry = latest_for_write(workspace, entry_id)
        if entry.status == Status.TOMBSTONED:
            raise Conflict(f"entry {entry.pk} is already tombstoned")
        grace = MaintenancePolicy.for_workspace(workspace).purge_grace_days
        lifecycle.change_entry(
            entry,
            Status.TOMBSTONED,
            reason=reason,
            actor=actor,
            now=now,
            run_id=getattr(run, "pk", run),
            tombstone=lifecycle.Tombstoning(reason, now + timedelta(days=grace)),
        )
        rescore_written(workspace, [entry.pk, *neighbour_ids([entry.pk])], now)
    return Tombstone.objects.get(entry=entry, restored_at__isnull=True, purged_at__isnull=True)


def restore_target(entry: Entry) -> str:
    """The live status an entry returns to: the last staged/active status it left, else active."""
    # The whole lineage: a version made while archived has no event of its own leaving staged.
    versions = Entry.objects.filter(workspace_id=entry.workspace_id, lineage_id=entry.lineage_id or entry.pk)
    froms = (
        LifecycleEvent.objects.filter(
            Q(entry_ref=entry.pk) | Q(entry_ref__in=versions.values("pk")),
            workspace_id=entry.workspace_id,
        )
        .order_by("-created_at", "-pk")
        .values_list("from_status", flat=True)
    )
    for status in froms:
        if status in (Status.STAGED, Status.ACTIVE):
            return status
    return Status.ACTIVE


def entry_restore(
    *,
    workspace: Workspace,
    entry_id: Any,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
    reason: str = "restore",
) -> Entry:
    """Bring a stale, archived or tombstoned entry back to its previous live status."""
    now = resolve_now(now)
    with transaction.atomic():
        entry = latest_for_write(workspace, entry_id)
        if entry.status not in (Status.STALE, Status.ARCHIVED, Status.TOMBSTONED):
            raise Conflict(
                f"entry {entry.pk} is {entry.status}; "
                "only stale, archived or tombstoned entries can be restored"
            )
        # Out of the tombstone (its Tombstone closed) or the archive. The operator's decision
        # sticks: a hold, placed with the status, keeps every automatic pass away from it.
        lifecycle.change_entry(
            entry,
            restore_target(entry),
            reason=reason,
            actor=actor,
            now=now,
            details={"hold": HoldReason.RESTORE},
            columns=holds.columns(HoldReason.RESTORE, actor, now),
        )
        rescore_written(workspace, [entry.pk, *neighbour_ids([entry.pk])], now)
    entry.refresh_from_db()
    return entry


def entry_release(
    *, workspace: Workspace, entry_id: Any, actor: str = SYSTEM_ACTOR, now: datetime | None = None
) -> Entry:
    """Clear an operator hold: automation may change the entry again."""
    entry = latest_for_write(workspace, entry_id)
    return holds.release(workspace, entry, actor=actor, now=resolve_now(now))


def entry_set_status(
    *,
    workspace: Workspace,
    entry_id: Any,
    status: str,
    reason: str,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
) -> Entry:
    """An operator's manual archive (or other non-deleting transition) of one entry."""
    now = resolve_now(now)
    valid_choice(status, [Status.ACTIVE, Status.STALE, Status.ARCHIVED], "status")
    with transaction.atomic():
        entry = latest_for_write(workspace, entry_id)
        if entry.status == Status.TOMBSTONED:
            raise Conflict(f"entry {entry.pk} is tombstoned; restore it first")
        if entry.status != status:
            lifecycle.change_entry(entry, status, reason=reason, actor=actor, now=now)
            rescore_written(workspace, [entry.pk, *neighbour_ids([entry.pk])], now)
    return entry


def entry_set_pinned(
    *,
    workspace: Workspace,
    entry_id: Any,
    pinned: bool,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
) -> Entry:
    now = resolve_now(now)
    valid_bool(pinned, "pinned")
    with transaction.atomic():
        entry = latest_for_write(workspace, entry_id)
        if entry.pinned != pinned:
            entry.pinned = pinned
            entry.updated_at = now
            entry.save(update_fields=["pinned", "updated_at"])
    return entry
