"""What every write shares: the acting actor and time, the tags, lifecycle events, the entry
lookups of a write, the score refresh of the entries it changed and the contradiction check
of a checked rule (installed by maintenance, which the domain does not import)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from django.db import connection
from django.utils import timezone

from memory import rawsql
from memory.errors import Conflict, NotFound
from memory.models import Entry, LifecycleEvent, Tag, Workspace
from memory.models.choices import VISIBLE_STATUSES, EntryType, Source, Tier
from memory.policy import PolicyValues
from memory.policy_model import MaintenancePolicy
from memory.scoring_db import rescore

SYSTEM_ACTOR = "system"


def resolve_now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


def tags_for_names(workspace: Workspace, names: Sequence[str]) -> list[Tag]:
    """The workspace's Tag rows for ``names`` (by name), creating missing ones: one query when
    all exist, three when some are new."""
    found = existing_tags(workspace, names)
    return found if found is not None else create_missing_tags(workspace, names)


def existing_tags(workspace: Workspace, names: Sequence[str]) -> list[Tag] | None:
    """The workspace's Tag rows for ``names`` (by name) if all exist, else None: one
    statement, written once per vendor (every write runs it)."""
    if not names:
        return []
    match, params = rawsql.in_values(list(dict.fromkeys(names)))
    with connection.cursor() as cursor:
        cursor.execute(_existing_tags_sql(connection.vendor, match), [workspace.pk, *params])
        rows = cursor.fetchall()
    if len(rows) != len(set(names)):
        return None
    return [
        rawsql.instance(Tag, ["id", "workspace_id", "name"], [pk, workspace.pk, name]) for pk, name in rows
    ]


@functools.lru_cache(maxsize=64)
def _existing_tags_sql(vendor: str, match: str) -> str:
    pk, name = rawsql.quote("id"), rawsql.column(Tag, "name")
    return (
        f"SELECT {pk}, {name} FROM {rawsql.table(Tag)} WHERE {rawsql.column(Tag, 'workspace')} = %s"
        f" AND {name} {match} ORDER BY {name}"
    )


def create_missing_tags(workspace: Workspace, names: Sequence[str]) -> list[Tag]:
    """Tag rows for ``names`` after a read found some missing: the missing ones are inserted
    (a concurrent writer's are kept) and all are read back (two queries)."""
    Tag.objects.bulk_create([Tag(workspace=workspace, name=n) for n in names], ignore_conflicts=True)
    return list(Tag.objects.filter(workspace=workspace, name__in=names))


def new_event(
    entry: Entry,
    *,
    from_status: str,
    to_status: str,
    reason: str,
    actor: str,
    now: datetime,
    run: Any = None,
    automatic: bool = False,
    details: Mapping[str, Any] | None = None,
) -> LifecycleEvent:
    """The lifecycle event of a change of ``entry`` (not saved)."""
    return LifecycleEvent(
        workspace_id=entry.workspace_id,
        entry=entry,
        entry_ref=entry.pk,
        from_status=from_status,
        to_status=to_status,
        reason=reason,
        actor=actor,
        run=run,
        automatic=automatic,
        created_at=now,
        details=dict(details or {}),
    )


def record_event(entry: Entry, **event: Any) -> LifecycleEvent:
    recorded = new_event(entry, **event)
    recorded.save(force_insert=True)
    return recorded


def write_policy(workspace: Workspace) -> PolicyValues:
    """The workspace's policy for a write's scores: as the request's API key lookup read it
    (``memory.auth``, the same request: fresh, and no second query), else read now."""
    read = workspace.__dict__.get("policy_at_auth")
    return read if isinstance(read, PolicyValues) else MaintenancePolicy.for_workspace(workspace)


def rescore_written(workspace: Workspace, ids: Iterable[int], now: datetime) -> None:
    rescore(workspace, ids, now=now, params=write_policy(workspace).decay_params)


def entry_get(*, workspace: Workspace, entry_id: Any) -> Entry:
    """Any version of an entry of this workspace; another workspace's id is not found."""
    try:
        pk = int(entry_id)
    except (TypeError, ValueError):
        raise NotFound(f"entry {entry_id!r} not found") from None
    entry = Entry.objects.filter(workspace=workspace, pk=pk).first()
    if entry is None:
        raise NotFound(f"entry {pk} not found")
    return entry


def latest_for_write(workspace: Workspace, entry_id: Any) -> Entry:
    entry = entry_get(workspace=workspace, entry_id=entry_id)
    if not entry.is_latest:
        latest = Entry.objects.filter(
            workspace=workspace, lineage_id=entry.lineage_id, is_latest=True
        ).first()
        raise Conflict(f"entry {entry.pk} is an old version; the latest is {latest.pk if latest else 'gone'}")
    return entry


def checked_on_write(entry: Entry) -> bool:
    """A write of this entry is checked for contradictions before it returns: a live latest
    constitutional entry, or a rule an operator wrote."""
    return (
        entry.is_latest
        and entry.status in VISIBLE_STATUSES
        and (
            entry.tier == Tier.CONSTITUTIONAL
            or (entry.source == Source.OPERATOR and entry.entry_type == EntryType.RULE)
        )
    )


class WriteCheck(Protocol):
    """What checks a written rule against the workspace's others: returns the open disputes
    the entry is part of."""

    def check_on_write(self, entry: Entry, *, now: datetime | None = None) -> list[Any]: ...


# The contradiction check of ``checked_on_write`` entries. The detector and its disputes belong
# to maintenance, which installs it when the app is ready (``MaintenanceConfig.ready``): the
# domain calls it without importing maintenance. Without one installed nothing is checked.
_write_checks: list[WriteCheck] = []


def install_write_check(check: WriteCheck) -> None:
    if check not in _write_checks:
        _write_checks.append(check)


def check_contradictions(entry: Entry, now: datetime) -> list[Any]:
    """On write, a constitutional entry or an operator's rule is checked for contradictions
    before the write returns; the open disputes it is part of are returned."""
    if not checked_on_write(entry):
        return []
    return [dispute for check in _write_checks for dispute in check.check_on_write(entry, now=now)]
