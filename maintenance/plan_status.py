"""The statuses a run's plan has decided, kept beside the entries instead of written into them.

While the overlay is open, the generic transition records ``(entry, new status, when)`` in a
temporary table instead of locking ``memory_entry`` rows until the plan's rollback, and passes
read statuses through ``status_in``. Invariants: a transition sets ``status_changed_at`` (and
for ``archived`` ``archived_at``) to the run's ``now``, the overlay's ``changed_at``; nothing
else of the row changes (passes that write other columns still write them in the plan). When
tombstones may be purged in the same run (grace 0) the plan writes every change (``needed``):
the purge reads tombstone rows. Why: docs/maintenance.md ("Plan").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Exists, OuterRef, Q

from maintenance.models import PlanStatus
from memory import rawsql
from memory.models import Entry
from memory.models.choices import Status

TABLE = "maintenance_planstatus"
CHUNK = 2000
ARRAY_CHUNK = 50_000  # ids per statement on PostgreSQL, sent as one array
# The table's statistics are renewed once the rows recorded since the last renewal reach
# ANALYZE_FROM and a tenth of the rows recorded before it (after autovacuum's rule, which never
# visits a temporary table): each ANALYZE samples the whole table, and the low-quality pass's
# batches of 500 renewed it seven times over about 550,000 rows (0.4 s of a first run's plan at
# 1,000,000 entries) for estimates that had barely moved.
ANALYZE_FROM = 1000
ANALYZE_SHARE = 0.1


class _State:
    """What the open overlay holds so far: the statuses moved into (none: no row yet) and the
    earliest change (every change is at the run's ``now``)."""

    def __init__(self) -> None:
        self.unanalysed = 0  # rows recorded since the table's statistics were last renewed
        self.analysed = 0  # rows recorded before that renewal (an entry recorded twice counts twice)
        self.into: set[str] = set()
        self.earliest: datetime | None = None


_open: ContextVar[_State | None] = ContextVar("plan_status", default=None)


def needed(purge_grace_days: int) -> bool:
    """Whether a plan can keep its status changes in the overlay (see the module's docstring)."""
    return purge_grace_days > 0


def _name() -> str:
    return rawsql.temp_table(TABLE)


@contextmanager
def overlay() -> Iterator[None]:
    """Open the overlay for the plan that runs inside: a temporary table created in the
    plan's transaction, gone with its rollback (one left by an earlier plan is dropped first)."""
    stamp = "timestamptz" if connection.vendor == "postgresql" else "timestamp"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {_name()}")
        cursor.execute(
            f"CREATE TEMP TABLE {TABLE} (entry_id bigint PRIMARY KEY, status varchar(16) NOT NULL, "
            f"changed_at {stamp} NOT NULL)"
        )
    token = _open.set(_State())
    try:
        yield
    finally:
        _open.reset(token)


def active() -> bool:
    """A plan with the overlay is running: transitions record instead of writing."""
    return _open.get() is not None


def record(ids: Sequence[int], status: str, now: datetime) -> None:
    """The plan moves the entries ``ids`` to ``status`` at ``now``."""
    state = _open.get()
    assert state is not None, "record() outside a plan's overlay"
    # Distinct here, not in the INSERT: a DISTINCT over each array was about half of what
    # recording a first run's 520,000 stale marks cost at 1,000,000 entries.
    ids = sorted(set(ids))
    stamp = connection.ops.adapt_datetimefield_value(now)
    entry_id = rawsql.column(Entry, "id")
    upsert = "ON CONFLICT (entry_id) DO UPDATE SET status = excluded.status, changed_at = excluded.changed_at"
    step = ARRAY_CHUNK if connection.vendor == "postgresql" else CHUNK
    for start in range(0, len(ids), step):
        chunk = list(ids[start : start + step])
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":  # the ids as one array: no row of the entries read
                cursor.execute(
                    f"INSERT INTO {_name()} (entry_id, status, changed_at) "
                    f"SELECT x, %s, %s FROM unnest(%s::bigint[]) AS x {upsert}",
                    [status, stamp, chunk],
                )
                continue
            where, params = rawsql.in_values(chunk)
            cursor.execute(
                f"INSERT INTO {_name()} (entry_id, status, changed_at) "
                f"SELECT {entry_id}, %s, %s FROM {rawsql.table(Entry)} WHERE {entry_id} {where} {upsert}",
                [status, stamp, *params],
            )
    state.unanalysed += len(ids)
    if (
        connection.vendor == "postgresql"
        and state.unanalysed >= ANALYZE_FROM
        and state.unanalysed >= ANALYZE_SHARE * state.analysed
    ):
        # A temporary table is never analysed on its own: PostgreSQL took it for a few
        # thousand rows and hashed all of it for every EXISTS (0.28 s a query at 520,000).
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {_name()}")
        state.analysed += state.unanalysed
        state.unanalysed = 0
    if ids:
        state.into.add(str(status))
        state.earliest = now if state.earliest is None else min(state.earliest, now)


class _Lookup(Exists):
    """An EXISTS that PostgreSQL keeps as a subplan run per row (a primary-key lookup): the
    ``OFFSET 0`` stops it from pulling the subquery up into a join. As an anti-join, with
    few rows estimated outside it, it scanned the whole table for each of them: the reclaim
    pass's plan took 39 s at 1,000,000 entries once no index named the status."""

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, Any]:
        if connection.vendor == "postgresql":
            extra["template"] = "EXISTS(%(subquery)s OFFSET 0)"
        return super().as_sql(compiler, connection, **extra)


def _planned(outer: str, statuses: Sequence[str] | None = None, before: datetime | None = None) -> Exists:
    """Whether the plan moved the entry ``outer`` names (into one of ``statuses``, at or before
    ``before``): a correlated EXISTS, one primary-key lookup per row (``_Lookup``). (``id IN
    (SELECT …)`` was hashed only while the table fitted in work_mem; beyond that PostgreSQL
    scanned it once per row: 8 s for every 1,000 entries at a million.)"""
    rows = PlanStatus.objects.filter(entry_id=OuterRef(outer))
    if statuses is not None:
        rows = rows.filter(status__in=list(statuses))
    if before is not None:
        rows = rows.filter(changed_at__lte=before)
    return _Lookup(rows)


def status_in(
    statuses: Sequence[str],
    *,
    prefix: str = "",
    changed_before: datetime | None = None,
    archived_before: datetime | None = None,
) -> Q:
    """Entries (``prefix``: through a relation, e.g. ``"from_entry__"``) whose status is one
    of ``statuses`` — changed at or before ``changed_before``, archived at or before
    ``archived_before`` when given — as the run sees them: inside a plan with the overlay, the
    status the plan decided where it decided one (changed and archived at the run's ``now``)."""
    statuses = list(statuses)
    stored = Q(**{f"{prefix}status__in": statuses})
    if changed_before is not None:
        stored &= Q(**{f"{prefix}status_changed_at__lte": changed_before})
    if archived_before is not None:
        # A planned change stamps archived_at only when it archives.
        assert statuses == [Status.ARCHIVED], "archived_before is the reclaim pass's: archived entries only"
        stored &= Q(**{f"{prefix}archived_at__lte": archived_before})
    state = _open.get()
    if state is None or not state.into:
        return stored
    before = min((t for t in (changed_before, archived_before) if t is not None), default=None)
    outer = f"{prefix.removesuffix('__')}_id" if prefix else "pk"
    kept = stored & ~Q(_planned(outer))
    assert state.earliest is not None
    if not state.into.intersection(statuses) or (before is not None and before < state.earliest):
        # No planned change can land in the set: without the OR, PostgreSQL makes the NOT
        # EXISTS an anti-join (a hash of the planned ids) instead of a lookup per row.
        return kept
    return kept | Q(_planned(outer, statuses, before))
