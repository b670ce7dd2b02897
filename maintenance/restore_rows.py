"""A restore's rows: matched to the database's, then inserted or updated in batches.

Matching is by id within the workspace, then by a kind's natural key; an id another workspace
holds is counted as a clash, never written. Writes are plain prepared statements (executemany,
or UPDATE from arrays on PostgreSQL) that only ever touch rows of the restored workspace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from django.db import connection, models

from maintenance.backup_files import ENTRY_TAG, KIND_BY_NAME, Kind
from maintenance.backups import encode_value
from memory import bulk_insert
from memory.policy_model import MaintenancePolicy

BATCH = 2000  # rows per lookup while restoring
WRITE_BATCH = 1000  # rows per executemany while restoring


def parse_datetime(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def chunks(items: list[Any], size: int = BATCH) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class _Update(NamedTuple):
    row: dict[str, Any]  # the backed-up values, with the id of the row they overwrite
    columns: tuple[str, ...]  # the columns whose values differ


@dataclass
class _Plan:
    kind: Kind
    inserts: list[dict[str, Any]] = field(default_factory=list)
    updates: list[_Update] = field(default_factory=list)
    newer: int = 0
    clashes: int = 0
    remap: dict[int, int] = field(default_factory=dict)  # backup id → id of the matched row


def _changed(kind: Kind, row: dict[str, Any], existing: dict[str, Any]) -> tuple[str, ...]:
    """The columns whose backed-up value differs from the row's now. A column the file lacks
    (written before the column existed) is left as it is. A datetime is compared with the
    instant its text names: parsing the text costs a fraction of printing the value, and a
    restore after a first run compares some eight of them on each of 600,000 entries."""
    changed = []
    for c in kind.columns:
        if c == "id" or c not in row:
            continue
        new, old = row[c], existing[c]
        if new == old:
            continue
        if isinstance(old, datetime) and isinstance(new, str):
            try:
                if parse_datetime(new) == old:
                    continue
            except ValueError:  # the verifying scan parsed it: only a file changed since fails here
                pass
        changed.append(c)
    return tuple(changed)


def _is_newer(kind: Kind, existing: dict[str, Any], taken_at: datetime) -> bool:
    return any(existing.get(f) is not None and existing[f] > taken_at for f in kind.newer)


def plan_rows(
    kind: Kind,
    rows: list[dict[str, Any]],
    ws_id: int | None,
    taken_at: datetime,
    leaving: set[int] | frozenset[int] = frozenset(),
    known: Mapping[int, dict[str, Any]] | None = None,
    before_read: Callable[[], None] = lambda: None,
) -> _Plan:
    """Match backup rows to existing ones: by id within the workspace, then by the natural key
    within the workspace; an id held by another workspace is a clash; the rest are inserted.
    ``leaving``: entries the restore already made not latest, compared as they were.
    ``known``: rows of this workspace the caller has read already (``kind.columns`` by id):
    only the other ids are looked up."""
    plan = _Plan(kind)
    manager = kind.model._default_manager
    wanted = ["workspace_id", *kind.columns]
    known = known or {}
    for chunk in chunks(rows):
        by_pk = {r["id"]: {**known[r["id"]], "workspace_id": ws_id} for r in chunk if r["id"] in known}
        ask = [r["id"] for r in chunk if r["id"] not in by_pk]
        if ask:
            before_read()
            by_pk.update((r["id"], r) for r in manager.filter(pk__any_of=ask).values(*wanted))
        for pk in leaving.intersection(by_pk):
            by_pk[pk] = {**by_pk[pk], "is_latest": True}
        by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
        if kind.natural and ws_id is not None:
            before_read()
            first = kind.natural[0]
            lookup = {f"{first}__in": list({r.get(first) for r in chunk})}
            for existing in manager.filter(workspace_id=ws_id, **lookup).values(*wanted):
                by_key[tuple(encode_value(existing[c]) for c in kind.natural)] = existing
        for row in chunk:
            match = by_pk.get(row["id"])
            if kind.history:
                if match is None:
                    plan.inserts.append(row)
                continue
            if match is not None and match["workspace_id"] != ws_id:
                clash, match = True, None
            else:
                clash = False
            if match is None and kind.natural:
                match = by_key.get(tuple(row.get(c) for c in kind.natural))
            if match is None:
                if clash:
                    plan.clashes += 1
                else:
                    plan.inserts.append(row)
                continue
            if match["id"] != row["id"]:
                plan.remap[row["id"]] = match["id"]
            changed = _changed(kind, row, match)
            if changed:
                plan.newer += _is_newer(kind, match, taken_at)
                plan.updates.append(_Update({**row, "id": match["id"]}, changed))
    return plan


def plan_policy(rows: list[dict[str, Any]], ws_id: int | None, taken_at: datetime) -> _Plan:
    """One policy per workspace: matched by workspace; its id is kept only when free."""
    kind = KIND_BY_NAME["policy"]
    plan = _Plan(kind)
    for row in rows[:1]:
        existing = (
            MaintenancePolicy.objects.filter(workspace_id=ws_id).values(*kind.columns).first()
            if ws_id is not None
            else None
        )
        if existing is None:
            free = not MaintenancePolicy.objects.filter(pk=row["id"]).exists()
            plan.inserts.append(row if free else {**row, "id": None})
        elif changed := _changed(kind, row, existing):
            plan.newer += _is_newer(kind, existing, taken_at)
            plan.updates.append(_Update({**row, "id": existing["id"]}, changed))
    return plan


def plan_entry_tags(rows: list[dict[str, Any]], tag_ids: dict[int, int]) -> _Plan:
    """Entry↔tag pairs are matched by the pair; a pair's id is kept only when free."""
    plan = _Plan(KIND_BY_NAME["entry_tag"])
    pairs = [{**r, "tag_id": tag_ids.get(r["tag_id"], r["tag_id"])} for r in rows]
    for chunk in chunks(pairs):
        # A pair naming no integer entry matches nothing (its insert fails and refuses the file).
        entry_ids = list({r["entry_id"] for r in chunk if type(r["entry_id"]) is int})
        have = set(
            ENTRY_TAG._default_manager.filter(entry_id__any_of=entry_ids).values_list("entry_id", "tag_id")
        )
        used = set(
            ENTRY_TAG._default_manager.filter(pk__any_of=[r["id"] for r in chunk]).values_list(
                "pk", flat=True
            )
        )
        for row in chunk:
            if (row["entry_id"], row["tag_id"]) not in have:
                plan.inserts.append(row if row["id"] not in used else {**row, "id": None})
    return plan


def _executemany(sql: str, params: list[list[Any]]) -> None:
    with connection.cursor() as cursor:
        for chunk in chunks(params, WRITE_BATCH):
            cursor.executemany(sql, chunk)


def insert_rows(kind: Kind, rows: list[dict[str, Any]], ws_id: int) -> None:
    """INSERT rows with the ids they carry, or with a new id where the plan set it to None:
    one prepared statement per batch."""
    qn = connection.ops.quote_name
    for keep_id in (True, False):
        group = [r for r in rows if (r["id"] is not None) == keep_id]
        if not group:
            continue
        fields = [f for f in kind.fields if keep_id or not f.primary_key]
        columns = [qn(f.column) for f in fields]
        params = bulk_insert.params(fields, group)
        if kind.scoped:
            columns.append(qn("workspace_id"))
            params = [[*values, ws_id] for values in params]
        placeholders = ", ".join(["%s"] * len(columns))
        _executemany(
            f"INSERT INTO {qn(kind.model._meta.db_table)} ({', '.join(columns)}) VALUES ({placeholders})",
            params,
        )


def update_rows(kind: Kind, updates: list[_Update], ws_id: int) -> None:
    """UPDATE the changed columns of rows of this workspace (never another's): one prepared
    statement per set of changed columns and batch.

    Only changed columns: besides writing less, rewriting Entry.supersedes (a self-referencing
    foreign key) even to its own value makes SQLite's cost per row grow with the rows already
    updated in the transaction — minutes for 20,000 entries instead of seconds.
    """
    assert kind.scoped, "entry↔tag pairs are only ever inserted"
    qn = connection.ops.quote_name
    by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for update in updates:
        by_columns.setdefault(update.columns, []).append(update.row)
    for columns, rows in by_columns.items():
        fields = [f for f in kind.fields if f.attname in columns]
        if connection.vendor == "postgresql":
            _update_from_arrays(kind, fields, rows, ws_id)
            continue
        assignments = ", ".join(f"{qn(f.column)} = %s" for f in fields)
        params = [
            [*values, row["id"], ws_id]
            for values, row in zip(bulk_insert.params(fields, rows), rows, strict=True)
        ]
        _executemany(
            f"UPDATE {qn(kind.model._meta.db_table)} SET {assignments} "
            f"WHERE {qn('id')} = %s AND {qn('workspace_id')} = %s",
            params,
        )


def _update_from_arrays(
    kind: Kind, fields: list[models.Field[Any, Any]], rows: list[dict[str, Any]], ws_id: int
) -> None:
    """PostgreSQL: the same UPDATE set-based, one statement per WRITE_BATCH rows, each column's
    values as one array parameter (``UPDATE … FROM unnest(ids, col1, …)``): the server plans and
    starts one statement per batch instead of one per row."""
    qn = connection.ops.quote_name
    names = [qn(f.column) for f in fields]
    arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
    sql = (
        f"UPDATE {qn(kind.model._meta.db_table)} AS t SET "
        + ", ".join(f"{n} = v.{n}" for n in names)
        + f" FROM unnest(%s::bigint[], {arrays}) AS v(restored_id, {', '.join(names)})"
        + f" WHERE t.{qn('id')} = v.restored_id AND t.{qn('workspace_id')} = %s"
    )
    floats = [isinstance(f, models.FloatField) for f in fields]
    with connection.cursor() as cursor:
        for chunk in chunks(rows, WRITE_BATCH):
            values = bulk_insert.params(fields, chunk)
            # One Python type per array: a float column's whole numbers come back from JSON as int.
            columns = [
                [None if v[i] is None else float(v[i]) for v in values]
                if is_float
                else [v[i] for v in values]
                for i, is_float in enumerate(floats)
            ]
            cursor.execute(sql, [[row["id"] for row in chunk], *columns, ws_id])
