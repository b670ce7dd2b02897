"""Rows written in bulk: the one path by which many entries are inserted at once (a journal
import, compaction's summaries), and the prepared INSERT it shares with a restore.

Invariants: one prepared statement per table run with executemany, values adapted once per
column (never through the ORM's per-value machinery); a new entry is its own lineage and gets
its tag links, anchors and creation event in the caller's transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connection, models
from django.db.models import F, Max
from django.utils.dateparse import parse_datetime

from memory import writes
from memory.models import CodeAnchor, Entry, LifecycleEvent, Workspace

CHUNK = 1000  # parameter rows per executemany call

# Columns whose Python value the database drivers take as it is.
PLAIN_FIELDS = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.FloatField,
    models.BooleanField,
    models.ForeignKey,
)


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def adapter(f: models.Field[Any, Any]) -> Callable[[Any], Any] | None:
    """What turns a value into a driver parameter, as the field's get_db_prep_save would (a
    datetime may come as ISO text, as a backup file holds it); None for the plain columns."""
    ops = connection.ops
    if isinstance(f, models.DateTimeField):
        return lambda v: ops.adapt_datetimefield_value(parse_datetime(v) if isinstance(v, str) else v)
    if isinstance(f, models.JSONField):
        return partial(ops.adapt_json_value, encoder=f.encoder)
    if isinstance(f, PLAIN_FIELDS):
        return None
    return partial(f.get_db_prep_save, connection=connection)


def params(fields: Sequence[models.Field[Any, Any]], rows: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """Each row ({attname: value}) as the statement's parameters; a missing column takes the
    field's default."""
    adapters = [(f, adapter(f)) for f in fields]
    out = []
    for row in rows:
        values = []
        for f, adapt in adapters:
            value = row[f.attname] if f.attname in row else f.get_default()
            values.append(value if adapt is None or value is None else adapt(value))
        out.append(values)
    return out


def insert_rows(model: type[models.Model], rows: Sequence[dict[str, Any]]) -> None:
    """INSERT rows given as {attname: value} into every concrete column but the primary key."""
    if not rows:
        return
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    qn = connection.ops.quote_name
    sql = (
        f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    with connection.cursor() as cursor:
        for chunk in chunks(params(fields, rows), CHUNK):
            cursor.executemany(sql, chunk)


@dataclass(frozen=True)
class NewEntry:
    """One entry to insert: its row ({attname: value}; the workspace is the call's), the names
    of its tags, its anchors (CodeAnchor rows without workspace and entry) and what its
    creation event records beyond the entry (``reason``, ``actor``, ``automatic``, ``run_id``,
    ``details``)."""

    row: dict[str, Any]
    event: dict[str, Any]
    tags: Sequence[str] = ()
    anchors: Sequence[dict[str, Any]] = field(default_factory=tuple)


def insert_entries(
    workspace: Workspace,
    new: Sequence[NewEntry],
    *,
    now: datetime,
    batch: int = 500,
    progress: Callable[[int], None] | None = None,
) -> list[int]:
    """Insert the entries, in order, with their tag links, anchors and creation events (inside
    the caller's transaction); returns their ids in the same order. ``progress(done)`` after
    each batch of entry rows."""
    if not new:
        return []
    last_id = Entry.objects.aggregate(last=Max("id"))["last"] or 0
    done = 0
    for part in chunks(new, batch):
        insert_rows(Entry, [{**n.row, "workspace_id": workspace.pk} for n in part])
        done += len(part)
        if progress is not None:
            progress(done)
    # executemany returns no ids. The new rows are the ones of this workspace above the old
    # maximum id that have no lineage yet (every committed entry has one; SQLite holds the
    # write lock and PostgreSQL hides other transactions' rows), in insert order; the check
    # makes any surprise abort the caller's transaction instead of mis-attributing rows.
    fresh = Entry.objects.filter(workspace=workspace, lineage_id__isnull=True, pk__gt=last_id)
    found = list(fresh.order_by("pk").values_list("pk", "external_id"))
    if [ext for _, ext in found] != [n.row.get("external_id") for n in new]:
        raise RuntimeError("could not identify the inserted entries; nothing was written")
    ids = [pk for pk, _ in found]
    fresh.update(lineage_id=F("id"))

    names = sorted({name for n in new for name in n.tags})
    tag_ids: dict[str, int] = {}
    for chunk in chunks(names, batch):
        tag_ids.update({t.name: t.pk for t in writes.tags_for_names(workspace, list(chunk))})
    insert_rows(
        Entry.tags.through,
        [
            {"entry_id": pk, "tag_id": tag_ids[name]}
            for n, pk in zip(new, ids, strict=True)
            for name in n.tags
        ],
    )
    insert_rows(
        CodeAnchor,
        [
            {**anchor, "workspace_id": workspace.pk, "entry_id": pk, "created_at": now}
            for n, pk in zip(new, ids, strict=True)
            for anchor in n.anchors
        ],
    )
    insert_rows(
        LifecycleEvent,
        [
            {
                "automatic": False,
                **n.event,
                "workspace_id": workspace.pk,
                "entry_id": pk,
                "entry_ref": pk,
                "from_status": "",
                "to_status": n.row["status"],
                "created_at": now,
            }
            for n, pk in zip(new, ids, strict=True)
        ],
    )
    return ids
