"""Links between entries: created and deleted in one transaction each, ids of old versions
resolved to their lineage's latest, and both ends rescored."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction

from memory import rawsql
from memory.errors import Conflict, InvalidInput, NotFound
from memory.models import Entry, Relationship, Workspace
from memory.models.choices import RelationshipType, Status
from memory.write_input import (
    valid_choice,
    valid_entry_id,
)
from memory.writes import (
    SYSTEM_ACTOR,
    rescore_written,
    resolve_now,
)


def link_partners(entry_ids: Iterable[int]) -> set[int]:
    """Ids at the other end of every link touching ``entry_ids`` — these entries included where
    they are linked to each other. One statement, each half an index lookup with the ids as one
    array: an OR of two id lists was a large share of every batch of a whole-run revert
    (bench/reports/maintenance.md, section "Cheaper reverts, verdicts made once and in the
    background")."""
    ids = list(entry_ids)
    if not ids:
        return set()
    out = Relationship.objects.filter(from_entry_id__any_of=ids).values_list("to_entry_id", flat=True)
    inc = Relationship.objects.filter(to_entry_id__any_of=ids).values_list("from_entry_id", flat=True)
    return set(out.union(inc, all=True))


def neighbour_ids(entry_ids: Iterable[int]) -> set[int]:
    """Ids at the other end of every link touching ``entry_ids`` (their importance counts them)."""
    ids = list(entry_ids)
    return link_partners(ids) - set(ids)


_TARGET_FIELDS = ("id", "workspace_id", "lineage_id", "is_latest", "status")  # what a link needs


@functools.lru_cache(maxsize=64)
def _link_targets_sql(vendor: str, match: str) -> str:
    """Each asked id of the workspace with its lineage's latest version (none if the lineage
    has none): one statement whatever the ids, written once (compiling its ORM twin on every
    linked write cost more than running it)."""
    e, pk = rawsql.table(Entry), rawsql.quote("id")

    def c(name: str, alias: str) -> str:
        return f"{alias}.{rawsql.column(Entry, name)}"

    latest = ", ".join(c(name, "l") for name in _target_fields())
    return (
        f"SELECT x.{pk}, {latest} FROM {e} x LEFT JOIN {e} l"
        f" ON {c('lineage_id', 'l')} = {c('lineage_id', 'x')}"
        f" AND {c('workspace', 'l')} = {c('workspace', 'x')} AND {c('is_latest', 'l')}"
        f" WHERE {c('workspace', 'x')} = %s AND x.{pk} {match}"
    )


def _target_fields() -> list[str]:
    """``_TARGET_FIELDS`` in the model's field order (as ``Model.from_db`` takes them)."""
    return [f.attname for f in Entry._meta.concrete_fields if f.attname in _TARGET_FIELDS]


def link_targets(workspace: Workspace, ids: Sequence[int]) -> dict[int, Entry]:
    """Latest versions for the given ids (an old version's id resolves to its lineage's
    latest), as Entry objects holding only what a link needs."""
    if not ids:
        return {}
    match, params = rawsql.in_values(sorted(set(ids)))
    with connection.cursor() as cursor:
        cursor.execute(_link_targets_sql(connection.vendor, match), [workspace.pk, *params])
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    missing = [i for i in ids if rows.get(i, (None,))[0] is None]
    if missing:  # every id is checked for existence before any for its state
        raise NotFound(f"entry {missing[0]} not found")
    names = _target_fields()
    found: dict[int, Entry] = {}
    for i in ids:
        target = rawsql.instance(Entry, names, rows[i])
        if target.status == Status.TOMBSTONED:
            raise Conflict(f"entry {i} is tombstoned; restore it before linking")
        found[i] = target
    return found


def _link(
    source: Entry, target: Entry, type_: str, *, actor: str, now: datetime
) -> tuple[Relationship, bool]:
    if source.pk == target.pk:
        raise InvalidInput("a memory cannot link to itself")
    existing = Relationship.objects.filter(from_entry=source, to_entry=target, type=type_).first()
    if existing is not None:
        if existing.pruned_at is not None:
            existing.pruned_at = None
            existing.save(update_fields=["pruned_at"])
        return existing, False
    try:
        with transaction.atomic():
            rel = Relationship.objects.create(
                workspace_id=source.workspace_id,
                from_entry=source,
                to_entry=target,
                type=type_,
                created_at=now,
                created_by=actor,
            )
    except IntegrityError:  # a concurrent writer made the same link first
        return Relationship.objects.get(from_entry=source, to_entry=target, type=type_), False
    return rel, True


def relationship_create(
    *,
    workspace: Workspace,
    from_id: Any,
    to_id: Any,
    type: str = RelationshipType.REFERENCES,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
) -> tuple[Relationship, bool]:
    """Link two entries of the workspace. Returns the link and whether it is new; an identical
    (from, to, type) is reported, not duplicated. Ids of old versions resolve to the latest."""
    now = resolve_now(now)
    valid_choice(type, RelationshipType.values, "type")
    ids = [valid_entry_id(from_id, "from_id"), valid_entry_id(to_id, "to_id")]
    if ids[0] == ids[1]:
        raise InvalidInput("a memory cannot link to itself")
    with transaction.atomic():
        targets = link_targets(workspace, ids)
        rel, created = _link(targets[ids[0]], targets[ids[1]], type, actor=actor, now=now)
        rescore_written(workspace, [rel.from_entry_id, rel.to_entry_id], now)
    return rel, created


def relationship_delete(*, workspace: Workspace, relationship_id: Any, now: datetime | None = None) -> None:
    now = resolve_now(now)
    with transaction.atomic():
        rel = Relationship.objects.filter(
            workspace=workspace, pk=_int_or_404(relationship_id, "relationship")
        ).first()
        if rel is None:
            raise NotFound(f"relationship {relationship_id} not found")
        ends = [rel.from_entry_id, rel.to_entry_id]
        rel.delete()
        rescore_written(workspace, ends, now)


def _int_or_404(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise NotFound(f"{what} {value!r} not found") from None
