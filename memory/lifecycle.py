"""Status changes of entries: the one function that moves entries to a status.

Every writer that changes the status of existing entries (API, console, agents' reads, passes
and approvals, graduation, reverts, a dispute's loser) calls ``change_status`` (``change_entry``
for one loaded entry) inside its transaction, on rows it has locked. Invariants:

- ``archived_at``: moving to archived stamps it (coming out of the tombstone it keeps its
  date); moving to tombstoned keeps it; any other status clears it.
- ``updated_at`` moves only when a person or a key changes the entry (``automatic=False``),
  never for an automatic change nor a revert; the stale pass reads it as "not updated since".
- One statement per table, never one per row on PostgreSQL; ``record=False`` (a rolled-back
  plan) writes no events but still the tombstones and the UPDATE.
- Announced after commit, once per transaction and workspace or per ``coalesced()`` block.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Case, F, Model, QuerySet, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.sql import UpdateQuery

from memory import rawsql
from memory.models import Entry, LifecycleEvent, Tombstone
from memory.models.choices import Status
from memory.signals import entries_changed

log = logging.getLogger(__name__)

# The columns ``change_status`` decides; a caller's ``columns`` may not name them.
STATUS_FIELDS = ("status", "status_changed_at", "archived_at", "updated_at")


@dataclass(frozen=True)
class Tombstoning:
    """The Tombstone of a move to tombstoned: why, and when it may be purged."""

    reason: str
    purge_after: datetime


# Batches that share their rows' pages on PostgreSQL (``batches``): a window of this many.
SPREAD_WINDOW = 20


def batches(ids: Sequence[int], size: int, *, spread: bool = True) -> list[Sequence[int]]:
    """``ids`` (sorted) in batches of at most ``size``, each sorted. On PostgreSQL the ids are
    taken a window of ``SPREAD_WINDOW`` batches at a time, and batch k of a window takes every
    n-th id of it from the k-th: a batch changes about one row per page, so every new row
    version finds room on its page and the update is HOT (no index touched) — the page is
    pruned of the versions earlier batches left before a later one comes back to it. Consecutive
    ids changed most rows of a page in one transaction, and only about half the updates found
    room (bench/reports/maintenance.md, "status changes spread over the table"). The window
    keeps the batches that come back to a page close together: spread over the whole table, a
    checkpoint between two of them made the page's second change write the whole page to the
    WAL again ("Fewer round trips and checks per batch"). Elsewhere, or with ``spread`` false,
    consecutive ids: SQLite has no HOT updates and writes fewer pages per transaction that way."""
    if size <= 0:
        raise ValueError(f"batch size must be positive, not {size}")
    if not ids:
        return []
    if not spread or connection.vendor != "postgresql":
        return [ids[start : start + size] for start in range(0, len(ids), size)]
    out: list[Sequence[int]] = []
    window = size * SPREAD_WINDOW
    for start in range(0, len(ids), window):
        part = ids[start : start + window]
        count = -(-len(part) // size)
        out += [part[k::count] for k in range(count)]
    return out


def change_status(
    workspace_id: int,
    ids: Sequence[int],
    to_status: str,
    *,
    reason: str,
    actor: str,
    now: datetime,
    automatic: bool = False,
    run_id: int | None = None,
    details: Mapping[str, Any] | None = None,
    details_of: Mapping[int, Mapping[str, Any]] | None = None,
    run_of: Mapping[int, int | None] | None = None,
    reverts_of: Mapping[int, int] | None = None,
    tombstone: Tombstoning | None = None,
    columns: Mapping[str, Any] | None = None,
    record: bool = True,
    tombstoned: Sequence[int] | None = None,
) -> None:
    """Move the entries ``ids`` of the workspace to ``to_status`` at ``now`` with their
    LifecycleEvents (reason, actor, run, automatic; ``details`` on each, or per entry
    ``details_of``; per entry ``run_of`` and ``reverts_of``, the event a revert undoes), their
    Tombstones (``tombstone``, required exactly when moving to tombstoned), and ``columns``
    set in the same UPDATE (values or expressions). Inside the caller's transaction, the rows
    locked by it; announced after commit (see the module's docstring). ``tombstoned``: the ids
    among ``ids`` that are tombstoned now, when the caller read their status under its lock
    (None: looked up here).

    It writes, in this order:

    1. one LifecycleEvent per entry, ``from_status`` read from the row before it changes (one
       ``INSERT … SELECT`` from ``memory_entry``; with per-entry details, runs or reverted
       events, on PostgreSQL the same joined with arrays of them, on SQLite one prepared
       INSERT per row);
    2. moving to tombstoned, one Tombstone per entry (reason, previous status read from the
       row, purge_after); leaving tombstoned, the entry's open Tombstone is closed
       (``restored_at``; the rows still tombstoned are looked up first);
    3. ONE ``UPDATE`` of the rows: ``status``, ``status_changed_at``, ``archived_at`` and
       ``updated_at`` by the module's rules, plus the caller's columns (graduation's scores
       and type, the hold a revert or a restore places).

    ``updated_at`` moves for a manual archive, tombstone or restore, hygiene's archive, a
    dispute's loser, an agent's read of a stale entry and a new version; not for a pass,
    graduation or approved proposals, nor for a revert (``reverts_of``: it puts back what
    automation changed). Set-based because a first maintenance run of a large workspace
    changes most of its rows, in batches."""
    ids = sorted(set(ids))
    if not ids:
        return
    if (to_status == Status.TOMBSTONED) != (tombstone is not None):
        raise ValueError("a Tombstoning is given exactly when entries move to tombstoned")
    extra = dict(columns or {})
    if set(extra) & set(STATUS_FIELDS):
        raise ValueError(f"columns: {sorted(set(extra) & set(STATUS_FIELDS))} are decided here")
    if record:
        event = {
            "reason": reason,
            "actor": actor,
            "automatic": automatic,
            "run_id": run_id,
            "details": dict(details or {}),
        }
        if details_of or run_of or reverts_of:
            _events_each(workspace_id, ids, to_status, now, event, details_of or {}, run_of, reverts_of or {})
        else:
            _events(workspace_id, ids, to_status, now, event)
    if tombstone is not None:
        _tombstones(workspace_id, ids, tombstone, actor=actor, run_id=run_id, now=now)
    else:
        _close_tombstones(workspace_id, ids, now, tombstoned)
    changes = _status_changes(to_status, now, manual=not automatic and not reverts_of, extra=extra)
    Entry.objects.filter(workspace_id=workspace_id, pk__any_of=ids).update(**changes)
    announce(workspace_id, [to_status], len(ids))


def _status_changes(
    to_status: str, now: datetime, *, manual: bool, extra: Mapping[str, Any]
) -> dict[str, Any]:
    """The UPDATE of a move to ``to_status`` by the module's rules (``archived_at``, and
    ``updated_at`` only for a ``manual`` change), plus the caller's columns."""
    changes: dict[str, Any] = {"status": to_status, "status_changed_at": now, **extra}
    if to_status == Status.ARCHIVED:
        changes["archived_at"] = Case(
            When(status=Status.TOMBSTONED, archived_at__isnull=False, then=F("archived_at")),
            default=Value(now),
        )
    elif to_status != Status.TOMBSTONED:
        changes["archived_at"] = None
    if manual:
        changes["updated_at"] = now
    return changes


# The columns of the rows ``change_selected`` locks, named as the entry's own columns, so that
# the records' expressions (``_from_entry``, ``_tombstone_values``) read them from either.
SELECTED = ("id", "workspace_id", "status", "lineage_id", "content_hash")


def change_selected(
    workspace_id: int,
    selected: QuerySet[Entry],
    to_status: str,
    *,
    reason: str,
    actor: str,
    now: datetime,
    run_id: int | None = None,
    tombstone: Tombstoning | None = None,
) -> list[int]:
    """PostgreSQL: an automatic ``change_status`` of the rows ``selected`` matches (a pass's
    whole predicate restricted to one batch's ids) in ONE statement, inside the caller's
    transaction, as data-modifying ``WITH`` queries: the rows locked in id order and read (a
    row changed meanwhile by another transaction is read, and checked against ``selected``
    again, as that transaction left it), their LifecycleEvents and Tombstones inserted from
    what was read under the lock — or, for rows leaving the tombstone, their open Tombstone
    closed — and the UPDATE, which finds the rows it locked. The ids changed, sorted (none
    when no row matches any more). ``change_status``'s statements looked the batch's rows up
    once each again and were planned each time (bench/reports/maintenance.md, "One statement
    a batch")."""
    if (to_status == Status.TOMBSTONED) != (tombstone is not None):
        raise ValueError("a Tombstoning is given exactly when entries move to tombstoned")
    query = (
        selected.filter(workspace_id=workspace_id)
        .select_for_update(of=("self",))
        .order_by("pk")
        .values(*SELECTED)
    )
    select_sql, select_params = query.query.get_compiler(query.db).as_sql()
    locked = ", ".join(rawsql.column(Entry, name) for name in SELECTED)
    events, event_params = _event_values(
        to_status,
        now,
        {"reason": reason, "actor": actor, "automatic": True, "run_id": run_id, "details": {}},
    )
    parts = [
        f"locked ({locked}) AS ({select_sql})",
        f"events AS ({_insert_sql(LifecycleEvent, events, 'locked')})",
    ]
    params = [*select_params, *event_params]
    if tombstone is not None:
        stones, stone_params = _tombstone_values(tombstone, actor=actor, run_id=run_id, now=now)
        parts.append(f"stones AS ({_insert_sql(Tombstone, stones, 'locked')})")
        params += stone_params
    else:  # as ``_close_tombstones``
        untombed = RawSQL(
            f"SELECT id FROM locked WHERE {rawsql.column(Entry, 'status')} = %s", (Status.TOMBSTONED,)
        )
        sql, more = _update_sql(_open_tombstones(entry_id__in=untombed), {"restored_at": now})
        parts.append(f"closed AS ({sql})")
        params += more
    target = Entry.objects.filter(workspace_id=workspace_id, pk__in=RawSQL("SELECT id FROM locked", ()))
    sql, more = _update_sql(target, _status_changes(to_status, now, manual=False, extra={}))
    parts.append(f"changed AS ({sql})")
    params += more
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(parts)} SELECT id FROM locked ORDER BY id", params)
        ids = [row[0] for row in cursor.fetchall()]
    if ids:
        announce(workspace_id, [to_status], len(ids))
    return ids


def _update_sql(rows: QuerySet[Any], values: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """The UPDATE ``rows.update(**values)`` would send, and its parameters."""
    update = rows.query.chain(UpdateQuery)
    assert isinstance(update, UpdateQuery)
    update.add_update_values(dict(values))
    sql, params = update.get_compiler(rows.db).as_sql()
    return sql, tuple(params)


def change_entry(entry: Entry, to_status: str, **options: Any) -> None:
    """``change_status`` of one loaded entry, whose status fields (and ``columns``) then show
    the change."""
    change_status(entry.workspace_id, [entry.pk], to_status, **options)
    entry.refresh_from_db(fields=[*STATUS_FIELDS, *(options.get("columns") or {})])


# --- the records ------------------------------------------------------------------------------


def _insert_from_entries(
    model: type[Model], values: Mapping[str, str], workspace_id: int, ids: list[int], params: list[Any]
) -> None:
    """One row of ``model`` per entry of ``ids``, in id order: ``INSERT INTO model (columns)
    SELECT expressions FROM memory_entry WHERE id IN ids ORDER BY id`` — ``values`` maps each
    field to an SQL expression over the entry's columns (``%s`` placeholders take ``params`` in
    order). A model instance per row through ``bulk_create`` cost several times as much a row,
    and a first run over a large workspace writes an event for most of its entries
    (bench/reports/maintenance.md, section "Capped counts, one-read compaction, set-based
    records", item 3)."""
    where, id_params = rawsql.in_values(ids)
    entry_id, workspace = rawsql.column(Entry, "id"), rawsql.column(Entry, "workspace")
    source = f"{rawsql.table(Entry)} WHERE {entry_id} {where} AND {workspace} = %s"
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(model, values, source), [*params, *id_params, workspace_id])


def _insert_sql(model: type[Model], values: Mapping[str, str], source: str) -> str:
    """``INSERT INTO model (columns) SELECT expressions FROM source ORDER BY id``: ``values``
    maps each field to an expression over the columns ``source`` has (the entry's)."""
    names = ", ".join(rawsql.column(model, name) for name in values)
    entry_id = rawsql.column(Entry, "id")
    return (
        f"INSERT INTO {rawsql.table(model)} ({names}) SELECT {', '.join(values.values())} "
        f"FROM {source} ORDER BY {entry_id}"
    )


def _from_entry() -> dict[str, str]:
    """The event columns read from the entry's row (its status before the change)."""
    col = functools.partial(rawsql.column, Entry)
    return {
        "workspace": col("workspace"),
        "entry": col("id"),
        "entry_ref": col("id"),
        "from_status": col("status"),
    }


def _event_values(to_status: str, now: datetime, event: dict[str, Any]) -> tuple[dict[str, str], list[Any]]:
    """The columns of the events of a change whose records differ only by entry, as
    expressions over the entry's columns, and their parameters."""
    ops = connection.ops
    values = {
        **_from_entry(),
        **dict.fromkeys(("to_status", "reason", "run", "actor", "automatic", "created_at", "details"), "%s"),
    }
    return values, [
        to_status,
        event["reason"],
        event["run_id"],
        event["actor"],
        event["automatic"],
        ops.adapt_datetimefield_value(now),
        ops.adapt_json_value(event["details"], None),
    ]


def _events(workspace_id: int, ids: list[int], to_status: str, now: datetime, event: dict[str, Any]) -> None:
    """The events of a change whose records differ only by entry: one INSERT … SELECT."""
    values, params = _event_values(to_status, now, event)
    _insert_from_entries(LifecycleEvent, values, workspace_id, ids, params)


def _events_each(
    workspace_id: int,
    ids: list[int],
    to_status: str,
    now: datetime,
    event: dict[str, Any],
    details_of: Mapping[int, Mapping[str, Any]],
    run_of: Mapping[int, int | None] | None,
    reverts_of: Mapping[int, int],
) -> None:
    """The events of a change with per-entry details, runs or reverted events. On PostgreSQL
    one INSERT … SELECT joining the entries with arrays of those: one prepared INSERT per row
    (``executemany``) was a large share of a whole-run revert, and a model instance per row
    through ``bulk_create`` slower still (bench/reports/maintenance.md, section "Cheaper reverts,
    verdicts made once and in the background", the revert). SQLite, in process, runs the
    prepared INSERT … SELECT per row."""
    runs = [run_of.get(i, event["run_id"]) if run_of is not None else event["run_id"] for i in ids]
    reverts = [reverts_of.get(i) for i in ids]
    details = [dict(details_of[i]) if i in details_of else event["details"] for i in ids]
    names = [
        *_from_entry(),
        "to_status",
        "reason",
        "run",
        "actor",
        "automatic",
        "reverts",
        "created_at",
        "details",
    ]
    columns = ", ".join(rawsql.column(LifecycleEvent, name) for name in names)
    read = ", ".join(f"e.{expression}" for expression in _from_entry().values())
    entry_id, workspace = rawsql.column(Entry, "id"), rawsql.column(Entry, "workspace")
    insert = f"INSERT INTO {rawsql.table(LifecycleEvent)} ({columns}) SELECT {read}"
    ops = connection.ops
    at = ops.adapt_datetimefield_value(now)
    reason, actor, automatic = event["reason"], event["actor"], event["automatic"]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"{insert}, %s, %s, u.r, %s, %s, u.v, %s, u.d::jsonb "
                "FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::text[]) AS u(i, r, v, d) "
                f"JOIN {rawsql.table(Entry)} e ON e.{entry_id} = u.i WHERE e.{workspace} = %s "
                f"ORDER BY e.{entry_id}",
                [
                    to_status,
                    reason,
                    actor,
                    automatic,
                    at,
                    ids,
                    runs,
                    reverts,
                    [json.dumps(d) for d in details],
                    workspace_id,
                ],
            )
            return
        cursor.executemany(
            f"{insert}, %s, %s, %s, %s, %s, %s, %s, %s FROM {rawsql.table(Entry)} e "
            f"WHERE e.{entry_id} = %s AND e.{workspace} = %s",
            [
                [
                    to_status,
                    reason,
                    run,
                    actor,
                    automatic,
                    undone,
                    at,
                    ops.adapt_json_value(d, None),
                    i,
                    workspace_id,
                ]
                for i, run, undone, d in zip(ids, runs, reverts, details, strict=True)
            ],
        )


def _tombstone_values(
    tombstone: Tombstoning, *, actor: str, run_id: int | None, now: datetime
) -> tuple[dict[str, str], list[Any]]:
    """The columns of the Tombstones of a move to tombstoned — lineage, hash and previous
    status read from the entry's row, before the status changes — and their parameters."""
    col = functools.partial(rawsql.column, Entry)
    adapt = connection.ops.adapt_datetimefield_value
    values = {
        "workspace": col("workspace"),
        "entry": col("id"),
        "entry_ref": col("id"),
        "lineage_ref": f"COALESCE({col('lineage_id')}, {col('id')})",
        "content_hash": col("content_hash"),
        "reason": "%s",
        "previous_status": col("status"),
        "run": "%s",
        "actor": "%s",
        "created_at": "%s",
        "purge_after": "%s",
    }
    return values, [tombstone.reason, run_id, actor, adapt(now), adapt(tombstone.purge_after)]


def _tombstones(
    workspace_id: int,
    ids: list[int],
    tombstone: Tombstoning,
    *,
    actor: str,
    run_id: int | None,
    now: datetime,
) -> None:
    """The Tombstone of each entry of ``ids``."""
    values, params = _tombstone_values(tombstone, actor=actor, run_id=run_id, now=now)
    _insert_from_entries(Tombstone, values, workspace_id, ids, params)


def _close_tombstones(
    workspace_id: int, ids: list[int], now: datetime, tombstoned: Sequence[int] | None
) -> None:
    """Entries of ``ids`` leaving the tombstone: their open Tombstone is closed (restored).
    Which of them are tombstoned is looked up unless the caller read it (``tombstoned``): a
    lookup per batch of a pass that moves active entries was 3.6 s of a first run over
    1,000,000 entries (bench/reports/maintenance.md, "The audit trail's own cost")."""
    if tombstoned is not None:
        untombed = list(tombstoned)
    else:
        untombed = list(
            Entry.objects.filter(
                workspace_id=workspace_id, pk__any_of=ids, status=Status.TOMBSTONED
            ).values_list("pk", flat=True)
        )
    if untombed:
        _open_tombstones(entry_id__any_of=untombed).update(restored_at=now)


def _open_tombstones(**entries: Any) -> QuerySet[Tombstone]:
    """The open (neither restored nor purged) Tombstones of the entries ``entries`` selects:
    the ones a move out of the tombstone closes."""
    return Tombstone.objects.filter(restored_at__isnull=True, purged_at__isnull=True, **entries)


# --- the announcement -------------------------------------------------------------------------


class _Changes:
    """What one transaction (or one ``coalesced`` block) changed in one workspace, until it is
    told."""

    def __init__(self, workspace_id: int) -> None:
        self.workspace_id = workspace_id
        self.statuses: set[str] = set()
        self.count = 0
        self.told = False

    def add(self, statuses: Iterable[str], count: int) -> None:
        self.statuses.update(str(status) for status in statuses)
        self.count += count


class _Tell:
    """The commit hook of one change: the first hook of a transaction's changes to run tells
    them all (every change registers its own hook, so that one registered inside a savepoint
    rolled back since, or one a test captures apart, loses nothing); the others find them
    told."""

    def __init__(self, changes: _Changes) -> None:
        self.changes = changes

    def __call__(self) -> None:
        changes = self.changes
        if changes.told:
            return
        changes.told = True
        waiting = _waiting.get()
        if waiting is not None:  # inside coalesced(): told at its end
            with _waiting_lock:  # a pass's batches may commit from several threads
                waiting.setdefault(changes.workspace_id, _Changes(changes.workspace_id)).add(
                    changes.statuses, changes.count
                )
            return
        try:
            entries_changed.send_robust(
                sender=Entry,
                workspace_id=changes.workspace_id,
                statuses=frozenset(changes.statuses),
                count=changes.count,
            )
        except Exception:  # an announcement never breaks the write that made it
            log.exception("change of workspace %s not announced", changes.workspace_id)


# Inside ``coalesced()``: the changes committed so far, per workspace.
_waiting: ContextVar[dict[int, _Changes] | None] = ContextVar("lifecycle_waiting", default=None)
_waiting_lock = threading.Lock()


def announce(workspace_id: int, statuses: Iterable[str] = (), count: int = 0) -> None:
    """Send ``entries_changed`` once the current transaction commits (at once outside one):
    ``change_status`` calls it, and so does a writer that changes entries wholesale without it
    (a purge, a restore from a backup). The changes of one transaction add up to one
    announcement per workspace — also those of a savepoint rolled back since, which may then be
    announced: receivers read committed state."""
    conn = transaction.get_connection()
    changes = None
    if conn.in_atomic_block:
        for hook in conn.run_on_commit:
            told = hook[1]
            if (
                isinstance(told, _Tell)
                and told.changes.workspace_id == workspace_id
                and not told.changes.told
            ):
                changes = told.changes
                break
    if changes is None:
        changes = _Changes(workspace_id)
    changes.add(statuses, count)
    transaction.on_commit(_Tell(changes))


@contextmanager
def coalesced() -> Iterator[None]:
    """Announce once, at the end, what a long operation commits in many transactions (a run's
    batches, a revert's, an approval's): the changes committed inside add up per workspace.
    On failure what the committed batches changed is still announced. Nested blocks announce
    at the outermost one's end."""
    if _waiting.get() is not None:
        yield
        return
    token = _waiting.set({})
    try:
        yield
    finally:
        waiting = _waiting.get() or {}
        _waiting.reset(token)
        for changes in waiting.values():
            transaction.on_commit(_Tell(changes))
