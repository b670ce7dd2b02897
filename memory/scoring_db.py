"""The database twin of ``memory.scoring``: the same formulas as ORM expressions, so a
sweep refreshes stored scores with one UPDATE per batch instead of one query per entry.

``tests/test_scoring_parity.py`` proves both sides agree to 1e-9 on SQLite and PostgreSQL.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import (
    Case,
    Count,
    F,
    FloatField,
    Func,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.expressions import Combinable, RawSQL
from django.db.models.functions import Cast, Coalesce, Exp, Greatest, Least, Ln

from memory import rawsql, scoring
from memory.models import CodeAnchor, Entry, EntryAccess, EntryScore, Relationship, Workspace
from memory.models.choices import CAUSAL_TYPES, LISTED_STATUSES, AnchorStatus, Status
from memory.policy_model import MaintenancePolicy
from memory.scoring import DecayParams

log = logging.getLogger(__name__)

SECONDS_PER_DAY = 86400.0
BATCH_SIZE = 1000


class EpochSeconds(Func):
    """POSIX seconds of a datetime column, exact to the microsecond on both databases.

    SQLite's julianday() keeps only milliseconds, which would break parity; Django stores
    datetimes there as 'YYYY-MM-DD HH:MM:SS[.ffffff]' in UTC, so whole seconds come from
    strftime('%s') of the text without its fraction (given the fraction, SQLite rounds to
    the millisecond first: '...:59.9996' became the next second) and the microseconds from
    the text itself.
    """

    output_field = FloatField()
    arity = 1

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        sql, params = compiler.compile(self.source_expressions[0])
        return (
            f"(CAST(strftime('%%s', substr({sql}, 1, 19)) AS REAL) + "
            f"COALESCE(CAST(NULLIF(substr({sql}, 21, 6), '') AS REAL), 0.0) / 1000000.0)",
            (*params, *params),
        )

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"CAST(EXTRACT(EPOCH FROM {sql}) AS double precision)", params


def _f(value: float) -> Value:
    return Value(float(value), output_field=FloatField())


def _float(expr: Combinable | Func | Subquery) -> Cast:
    return Cast(expr, FloatField())


def _count(qs: QuerySet[Any], group: str) -> Coalesce:
    subquery = qs.order_by().values(group).annotate(n=Count("pk")).values("n")[:1]
    return Coalesce(Subquery(subquery), 0)


# PostgreSQL raises "value out of range: underflow" for exp() of a large negative number where
# Python returns 0.0; e^-600 ≈ 3e-261 is 0 for every purpose here and keeps both sides in step.
EXP_FLOOR = -600.0


def _exp(expr: Any) -> Exp:
    return Exp(Greatest(expr, _f(EXP_FLOOR)))


def _age_days(column: str, now_epoch: float) -> Greatest:
    return Greatest(_f(0.0), (_f(now_epoch) - EpochSeconds(F(column))) / _f(SECONDS_PER_DAY))


def counted_end(prefix: str, live_since: datetime | None = None) -> Q:
    """The other end of a counted link: a latest version that is not tombstoned — or, for a
    maintenance run at ``live_since``, one tombstoned at or after that instant (it was live when
    the run's clock started, so a second run at the same ``now`` decides exactly as the first)."""
    end = Q(**{f"{prefix}__status__in": LISTED_STATUSES})
    if live_since is not None:
        end |= Q(**{f"{prefix}__status": Status.TOMBSTONED, f"{prefix}__status_changed_at__gte": live_since})
    return Q(**{f"{prefix}__is_latest": True}) & end


def relationship_count_expr(*, causal_only: bool = False, live_since: datetime | None = None) -> Any:
    """Active links in either direction whose other end is a live latest entry."""
    base = Relationship.objects.filter(pruned_at__isnull=True)
    if causal_only:
        base = base.filter(type__in=CAUSAL_TYPES)
    out = base.filter(counted_end("to_entry", live_since), from_entry=OuterRef("pk"))
    inc = base.filter(counted_end("from_entry", live_since), to_entry=OuterRef("pk"))
    return _count(out, "from_entry") + _count(inc, "to_entry")


def _per_anchor() -> Case:
    """One anchor's multiplier, by its status."""
    return Case(
        When(status=AnchorStatus.INVALIDATED, then=_f(scoring.ANCHOR_MULTIPLIER["invalidated"])),
        When(status=AnchorStatus.STALE, then=_f(scoring.ANCHOR_MULTIPLIER["stale"])),
        default=_f(1.0),
        output_field=FloatField(),
    )


def anchor_multiplier_expr() -> Coalesce:
    """The worst anchor wins: the smallest multiplier among the entry's anchors (none = 1)."""
    sub = (
        CodeAnchor.objects.filter(entry=OuterRef("pk"))
        .order_by()
        .values("entry")
        .annotate(m=Min(_per_anchor()))
        .values("m")[:1]
    )
    return Coalesce(Subquery(sub, output_field=FloatField()), _f(1.0))


def importance_expr(
    now_epoch: float, live_since: datetime | None = None, *, joined: bool = False
) -> Greatest:
    """SPEC's importance of each row. Its counted inputs — live links, causal links, the worst
    anchor — are subqueries per row, or with ``joined`` columns of the per-workspace aggregates
    ``_joined_inputs`` adds to the statement (a whole workspace at once)."""
    significance = Greatest(
        Coalesce(F("impact_score"), _f(0.0)),
        Case(
            When(
                Q(significance_type__isnull=False) & ~Q(significance_type=""),
                then=_f(scoring.SIGNIFICANCE_FLOOR),
            ),
            default=_f(0.0),
            output_field=FloatField(),
        ),
    ) * _f(scoring.W_SIGNIFICANCE)
    links = _joined("live", 0) if joined else relationship_count_expr(live_since=live_since)
    causal_links = (
        _joined("causal", 0) if joined else relationship_count_expr(causal_only=True, live_since=live_since)
    )
    relationships = Least(_float(links) / _f(scoring.RELATIONSHIPS_CAP), _f(1.0)) * _f(
        scoring.W_RELATIONSHIPS
    )
    causal = Least(_float(causal_links) / _f(scoring.CAUSAL_CAP), _f(1.0)) * _f(scoring.W_CAUSAL)
    recency = Greatest(_f(0.0), _f(1.0) - _age_days("created_at", now_epoch) / _f(scoring.RECENCY_DAYS)) * _f(
        scoring.W_RECENCY
    )
    trust = (
        _f(scoring.TRUST_BASE)
        + Coalesce(F("trust_score"), _f(scoring.TRUST_DEFAULT))
        + Case(
            When(validation_status="passed", then=_f(scoring.VALIDATION_BONUS["passed"])),
            When(validation_status="failed", then=_f(scoring.VALIDATION_BONUS["failed"])),
            default=_f(0.0),
            output_field=FloatField(),
        )
    )
    anchor = _joined("worst_anchor", 1.0) if joined else anchor_multiplier_expr()
    total = (significance + relationships + causal + recency) * anchor * trust
    return Greatest(_f(0.0), Least(_f(1.0), total))


def readers_expr() -> Coalesce:
    return _count(EntryAccess.objects.filter(lineage_id=OuterRef("lineage_id")), "lineage_id")


def retention_expr(now_epoch: float, params: DecayParams, *, joined: bool = False) -> Any:
    """SPEC's retention of each row; its readers counted per row, or with ``joined`` read from
    the per-workspace aggregate ``_joined_inputs`` adds to the statement."""
    salience = Coalesce(F("salience"), _f(params.salience_default))
    time_term = salience * _exp(_f(-params.lam) * _age_days("created_at", now_epoch))
    readers = _joined("readers", 0) if joined else readers_expr()
    breadth = _f(1.0) + _f(params.breadth_weight) * Ln(Greatest(_float(readers), _f(1.0)))
    access_term = (
        _f(params.sigma)
        * Ln(_f(1.0) + _float(F("access_count")))
        * _exp(_f(-params.mu) * _age_days("last_accessed_at", now_epoch))
        * breadth
    )
    return time_term + Case(
        When(Q(access_count__gt=0) & Q(last_accessed_at__isnull=False), then=access_term),
        default=_f(0.0),
        output_field=FloatField(),
    )


# --- a whole workspace's inputs, aggregated once --------------------------------------------

# The aggregates ``_joined_inputs`` joins, by alias, and the column each input is read from.
_JOINED = {
    "live": "score_links",
    "causal": "score_links",
    "worst_anchor": "score_anchors",
    "readers": "score_readers",
}


def _joined(column: str, missing: float) -> Any:
    """An input of the score formulas read from its joined aggregate (``_joined_inputs``);
    ``missing`` where the entry has no row there (no link, no anchor, no reader)."""
    return RawSQL(f"COALESCE({_JOINED[column]}.{column}, %s)", (missing,), output_field=FloatField())


def _joined_inputs(workspace_id: int, live_since: datetime | None) -> tuple[str, list[Any]]:
    """The LEFT JOINs that give every entry of the workspace its counted score inputs, each
    table read once and aggregated per entry (PostgreSQL hashes them): the same counts as
    ``relationship_count_expr``, ``anchor_multiplier_expr`` and ``readers_expr``, which look
    them up per row — about six index lookups for each entry, most of a whole-workspace score
    pass (bench/reports/maintenance.md, "A pass's batches over two connections; the scores'
    inputs aggregated once"). A link, an anchor and an access belong to the workspace of the
    entry they name (every writer sets it from that entry), so each table is read by its
    workspace."""
    links = [
        # Per entry, its active links on one side whose other end counts (``counted_end``).
        Relationship.objects.filter(
            counted_end(far, live_since), workspace_id=workspace_id, pruned_at__isnull=True
        )
        .order_by()
        .values(entry_id=F(near))
        .annotate(live=Count("pk"), causal=Count("pk", filter=Q(type__in=CAUSAL_TYPES)))
        .values_list("entry_id", "live", "causal")
        .query.sql_with_params()
        for near, far in (("from_entry", "to_entry"), ("to_entry", "from_entry"))
    ]
    anchors = (
        CodeAnchor.objects.filter(workspace_id=workspace_id)
        .order_by()
        .values(entry_ref=F("entry"))
        .annotate(worst_anchor=Min(_per_anchor()))
        .values_list("entry_ref", "worst_anchor")
        .query.sql_with_params()
    )
    readers = (
        EntryAccess.objects.filter(workspace_id=workspace_id)
        .order_by()
        .values("lineage_id")
        .annotate(readers=Count("pk"))
        .values_list("lineage_id", "readers")
        .query.sql_with_params()
    )
    entry = functools.partial(rawsql.column, Entry)
    outer = f"{rawsql.table(Entry)}.{entry('id')}"
    sql = (
        f" LEFT JOIN (SELECT x.entry_id, sum(x.live)::bigint AS live, sum(x.causal)::bigint AS causal"
        f" FROM ({links[0][0]} UNION ALL {links[1][0]}) x GROUP BY x.entry_id) score_links"
        f" ON score_links.entry_id = {outer}"
        f" LEFT JOIN ({anchors[0]}) score_anchors ON score_anchors.entry_ref = {outer}"
        f" LEFT JOIN ({readers[0]}) score_readers"
        f" ON score_readers.lineage_id = {rawsql.table(Entry)}.{entry('lineage_id')}"
    )
    return sql, [*links[0][1], *links[1][1], *anchors[1], *readers[1]]


PLAN_TABLE = "maintenance_planscore"  # maintenance.models.PlanScore, a temporary table
# While a plan runs: {"table": True} once its score pass has filled the temporary table.
_planning: ContextVar[dict[str, bool] | None] = ContextVar("planning_scores", default=None)


@contextmanager
def planning() -> Iterator[None]:
    """While a run's plan executes: every refresh of stored scores also forgets the plan's
    scores of the entries it refreshed, so the plan reads the stored value for them, exactly
    as the apply reads the value that refresh wrote over its own score pass's."""
    token = _planning.set({})
    try:
        yield
    finally:
        _planning.reset(token)


def _temp_name() -> str:
    return rawsql.temp_table(PLAN_TABLE)


def _scores_sql(
    workspace: Workspace | int,
    *,
    now: datetime,
    params: DecayParams,
    live_since: datetime | None,
    joined: bool | None = None,
) -> tuple[str, tuple[Any, ...]]:
    """SELECT id, importance, retention of every latest entry of the workspace (one statement,
    the expressions ``refresh_scores`` writes). On PostgreSQL the counted inputs come from
    per-workspace aggregates joined once (``_joined_inputs``); SQLite, which joins by nested
    loops only, looks them up per row (``joined`` chooses otherwise: a test compares both)."""
    now_epoch = now.timestamp()
    if joined is None:
        joined = connection.vendor == "postgresql"
    if joined and connection.vendor != "postgresql":
        raise ValueError("the joined score inputs are written for PostgreSQL")
    qs = (
        Entry.objects.filter(workspace=workspace, is_latest=True)
        .annotate(
            s_id=F("pk"),
            plan_importance=importance_expr(now_epoch, live_since, joined=joined),
            plan_retention=retention_expr(now_epoch, params, joined=joined),
            s_stored=F("importance"),
        )
        .order_by()
        .values_list("s_id", "plan_importance", "plan_retention", "s_stored")
    )
    sql, sql_params = qs.query.sql_with_params()
    if not joined:
        return sql, sql_params
    # The joins go between the table and the WHERE: the select list's parameters come first.
    anchor = f" FROM {rawsql.table(Entry)} WHERE "
    if sql.count(anchor) != 1:
        raise AssertionError(f"the score statement does not read {rawsql.table(Entry)} alone: {sql}")
    head, tail = sql.split(anchor)
    joins, join_params = _joined_inputs(workspace if isinstance(workspace, int) else workspace.pk, live_since)
    at = head.count("%s")
    return (
        f"{head} FROM {rawsql.table(Entry)}{joins} WHERE {tail}",
        (*sql_params[:at], *join_params, *sql_params[at:]),
    )


@dataclass(frozen=True)
class Settle:
    """When a whole-workspace refresh writes an entry's importance: when it moved by ``step``
    or more since it was stored, or crossed one of ``thresholds`` (it is then on the other side
    of a comparison ``importance < threshold`` than the stored value). Otherwise the stored value
    stays: the recency term moves every young entry's importance a little at every sweep, and
    rewriting those wide, indexed rows was half of a sweep's score pass, for changes no
    decision could see. The rule is applied where the scores are computed, so a plan reads
    exactly the values its apply stores.

    ``retention``: the thresholds a decision compares retention with (the cold threshold), when
    retention is settled by the same rule and step; its row (and ``scored_at``) is then written
    only where it moved that much or crossed one. Retention fades on every refresh, by about
    0.00014 in a sweep's 10 minutes for a fresh memory, and writing every entry's row at every
    sweep was the largest share of a run's writes after its status changes
    (bench/reports/maintenance.md, "The audit trail's own cost"). None: written exactly."""

    step: float
    thresholds: tuple[float, ...]
    retention: tuple[float, ...] | None = None

    def sql(
        self, exact: str, stored: str, thresholds: tuple[float, ...] | None = None
    ) -> tuple[str, list[float]]:
        """The value to store, as an SQL expression of the ``exact`` and ``stored`` ones (the
        importance's ``thresholds`` unless others are given)."""
        thresholds = self.thresholds if thresholds is None else thresholds
        crossed = "".join(f" OR ({exact} < %s) <> ({stored} < %s)" for _ in thresholds)
        params = [self.step, *(t for t in thresholds for _ in range(2))]
        return (
            f"CASE WHEN {stored} IS NULL OR abs({exact} - {stored}) >= %s{crossed}"
            f" THEN {exact} ELSE {stored} END",
            params,
        )


def _is_distinct() -> str:
    """The operator "differs, NULL counting as a value": SQLite before 3.39 has no IS
    DISTINCT FROM; its IS NOT is the same comparison."""
    return "IS DISTINCT FROM" if connection.vendor == "postgresql" else "IS NOT"


def _fill_scores(
    table: str,
    workspace: Workspace | int,
    *,
    now: datetime,
    params: DecayParams,
    live_since: datetime | None,
    seen: bool = False,
    settle: Settle | None = None,
) -> int:
    """(Re)create the temporary table ``table`` and fill it with every latest entry's id,
    importance (exact, or with ``settle`` the one to store) and retention (one statement;
    ``_scores_sql``), with ``seen``, the ``scored_at`` each entry had then too (``seen_at``)
    and whether the entry has anything to write (``due``: with a settled retention, its
    importance or retention differs from the stored one, or it has no score row; otherwise
    every row). Returns how many rows it holds."""
    sql, sql_params = _scores_sql(workspace, now=now, params=params, live_since=live_since)
    stamp = "timestamptz" if connection.vendor == "postgresql" else "timestamp"
    seen_column = f", seen_at {stamp} NULL, due boolean NOT NULL" if seen else ""
    entry_id, scored_at, stored_retention = (
        rawsql.column(EntryScore, name) for name in ("entry", "scored_at", "retention")
    )
    importance, settle_params = (
        settle.sql("q.plan_importance", "q.s_stored") if settle is not None else ("q.plan_importance", [])
    )
    retention, retention_params = (
        settle.sql("q.plan_retention", f"sc.{stored_retention}", settle.retention)
        if settle is not None and settle.retention is not None
        else ("q.plan_retention", [])
    )
    # The fence keeps the planner from inlining the scores where the CASE repeats them.
    fence = (" LIMIT -1 OFFSET 0" if connection.vendor == "sqlite" else " OFFSET 0") if settle else ""
    rows = f"SELECT q.s_id, {importance} AS w_importance, {retention} AS w_retention"
    if seen:
        rows += f", sc.{scored_at} AS w_seen, q.s_stored AS w_stored, sc.{stored_retention} AS w_kept"
    rows += f" FROM ({sql}{fence}) q"
    if seen or retention_params:
        rows += f" LEFT JOIN {rawsql.table(EntryScore)} sc ON sc.{entry_id} = q.s_id"
    sql_params = (*settle_params, *retention_params, *sql_params)  # the CASEs come first
    columns = "entry_id, importance, retention"
    if seen:
        # Due: what the apply writes differs from what is stored (the walk skips the rest).
        distinct = _is_distinct()
        due = (
            f"w_importance {distinct} w_stored OR w_retention {distinct} w_kept"
            if retention_params
            else "1 = 1"
        )
        rows = f"SELECT s_id, w_importance, w_retention, w_seen, {due} FROM ({rows}) w"
        columns += ", seen_at, due"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {rawsql.temp_table(table)}")
        cursor.execute(
            f"CREATE TEMP TABLE {table} (entry_id bigint PRIMARY KEY, importance double precision"
            f" NOT NULL, retention double precision NOT NULL{seen_column})"
        )
        cursor.execute(f"INSERT INTO {rawsql.temp_table(table)} ({columns}) {rows}", sql_params)
        return int(cursor.rowcount)


@dataclass(frozen=True)
class _Once:
    """Scores computed before a run's plan (``scores_once``): for which run, and how many."""

    key: tuple[Any, ...]
    scored: int


# The scores ``scores_once`` computed into PLAN_TABLE (with ``seen_at``), until they are written.
_once: ContextVar[dict[str, _Once] | None] = ContextVar("scores_once", default=None)


def _key(
    workspace: Workspace | int,
    now: datetime,
    params: DecayParams,
    live_since: datetime | None,
    settle: Settle | None,
) -> tuple[Any, ...]:
    return (
        workspace.pk if isinstance(workspace, Workspace) else int(workspace),
        now,
        params,
        live_since,
        settle,
    )


def _computed_once(key: tuple[Any, ...]) -> _Once | None:
    held = (_once.get() or {}).get("scores")
    return held if held is not None and held.key == key else None


@contextmanager
def scores_once(
    workspace: Workspace | int,
    *,
    now: datetime,
    params: DecayParams,
    live_since: datetime | None,
    settle: Settle | None = None,
) -> Iterator[None]:
    """Compute every latest entry's scores once for a whole run — its plan and its apply —
    instead of once in each: one statement fills the temporary table ``maintenance_planscore``
    (with the ``scored_at`` each entry had then) before the plan's transaction, so the rollback
    that ends the plan leaves it — and with it whatever the plan deleted from it or the DROP
    ending the plan — as it was. The plan's score pass reads it (``plan_scores``) and the
    apply's writes it (``refresh_scores`` of every entry), with the same guard: an entry scored
    again meanwhile keeps that newer score. Only where the plan runs in this connection (not on
    SQLite's copy of the database); the table is dropped when the block ends, used or not."""
    token = _once.set({})
    try:
        scored = _fill_scores(
            PLAN_TABLE, workspace, now=now, params=params, live_since=live_since, seen=True, settle=settle
        )
        state = _once.get()
        assert state is not None
        state["scores"] = _Once(_key(workspace, now, params, live_since, settle), scored)
        yield
    finally:
        _once.reset(token)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TABLE IF EXISTS {_temp_name()}")
        except DatabaseError as exc:  # a broken connection takes its temporary tables with it
            log.warning("could not drop the run's score table: %s", exc)


def plan_scores(
    workspace: Workspace,
    *,
    now: datetime,
    params: DecayParams,
    live_since: datetime | None = None,
    settle: Settle | None = None,
) -> int:
    """The plan's score pass: importance and retention of every latest entry of the workspace,
    computed by the same expressions as ``refresh_scores``, written by one statement into the
    temporary narrow table ``maintenance_planscore`` — the stored columns are not touched (the
    plan's writes are rolled back anyway; rewriting every wide row only to undo it was most of
    a plan's cost) — or already there (``scores_once``). Returns how many entries were scored
    (what ``refresh_scores`` would)."""
    once = _computed_once(_key(workspace, now, params, live_since, settle))
    if once is not None:
        scored = once.scored
    else:
        scored = _fill_scores(
            PLAN_TABLE, workspace, now=now, params=params, live_since=live_since, settle=settle
        )
    state = _planning.get()
    if state is not None:
        state["table"] = True
    return scored


WHOLE_TABLE = "memory_wholescore"  # a temporary table of ``_refresh_whole``


def _refresh_whole(
    workspace: Workspace | int,
    *,
    now: datetime,
    params: DecayParams,
    live_since: datetime | None,
    batch_size: int,
    on_batch: Callable[[], None] | None,
    settle: Settle | None,
) -> int:
    """``refresh_scores`` of every latest entry of the workspace: every score computed by one
    statement into a temporary table (with the ``scored_at`` each entry had then) — a read of
    the entries, no row of them locked — then written in batches of ``batch_size`` ids, each in
    a transaction of its own: the importance where it changed, the retention and ``scored_at``
    upserted. An entry scored again meanwhile (a write rescored it: its ``scored_at`` is no
    longer the one read) keeps that newer score. Computing per batch instead, a run's score
    pass took four times the statement's time (bench/reports/maintenance.md)."""
    once = _computed_once(_key(workspace, now, params, live_since, settle))
    if once is not None:  # computed before the plan (``scores_once``): written once
        (_once.get() or {}).pop("scores")
        scored, table = once.scored, PLAN_TABLE
    else:
        table = WHOLE_TABLE
        scored = _fill_scores(
            table, workspace, now=now, params=params, live_since=live_since, seen=True, settle=settle
        )
        if on_batch is not None:
            on_batch()  # the statement took a while: renew the lease before the writes
    temp, e, s = rawsql.temp_table(table), rawsql.table(Entry), rawsql.table(EntryScore)
    pk, latest, importance = (rawsql.column(Entry, n) for n in ("id", "is_latest", "importance"))
    entry_id, scored_at = rawsql.column(EntryScore, "entry"), rawsql.column(EntryScore, "scored_at")
    # Rows of the batch whose stored score is still the one read with the inputs.
    distinct = _is_distinct()

    def no_stored_row(where: str) -> str:
        return f"NOT EXISTS (SELECT 1 FROM {s} sc WHERE sc.{entry_id} = t.entry_id AND ({where}))"

    rescored = f"sc.{scored_at} {distinct} t.seen_at"
    unchanged = no_stored_row(rescored)
    # A settled retention equal to the stored one is not written again (``Settle.retention``).
    if settle is not None and settle.retention is not None:
        retention_due = no_stored_row(
            f"{rescored} OR sc.{rawsql.column(EntryScore, 'retention')} = t.retention"
        )
    else:
        retention_due = unchanged
    # Only the rows due (``_fill_scores``): a run after another writes few of them, and
    # walking every row in batches was most of its score pass.
    in_batch = "t.entry_id > %s AND t.entry_id <= %s AND t.due"
    write_importance = (
        f"UPDATE {e} SET {importance} = t.importance FROM {temp} t WHERE {e}.{pk} = t.entry_id"
        f" AND {in_batch} AND {e}.{latest} AND {e}.{importance} <> t.importance"
        f" AND {unchanged}"
    )
    # Only entries still there and latest: an operator may purge one meanwhile. (The WHERE
    # also keeps SQLite from reading "ON CONFLICT" as a join's ON.)
    write_retention = _upsert_scores(
        f"SELECT t.entry_id, t.retention, %s FROM {temp} t JOIN {e} ON {e}.{pk} = t.entry_id"
        f" WHERE {in_batch} AND {e}.{latest} AND {retention_due}"
    )
    stamp_value = connection.ops.adapt_datetimefield_value(now)
    try:
        last = 0
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT max(entry_id) FROM (SELECT entry_id FROM {temp} WHERE entry_id > %s"
                    " AND due ORDER BY entry_id LIMIT %s) b",
                    [last, batch_size],
                )
                high = cursor.fetchone()[0]
            if high is None:
                break
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(write_importance, [last, high])
                cursor.execute(write_retention, [stamp_value, last, high])
            last = high
            if on_batch is not None:
                on_batch()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {temp}")
    _forget_planned(None)  # every latest entry was refreshed in place
    return scored


def drop_plan_scores() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {_temp_name()}")
    state = _planning.get()
    if state is not None:
        state.pop("table", None)


def _forget_planned(ids: Iterable[int] | None) -> None:
    """During a plan: the entries among ``ids`` (all if None) were just rescored in place."""
    state = _planning.get()
    if not state or not state.get("table"):
        return
    with connection.cursor() as cursor:
        if ids is None:
            cursor.execute(f"DELETE FROM {_temp_name()}")
            return
        id_list = list(ids)
        for start in range(0, len(id_list), BATCH_SIZE):
            chunk = id_list[start : start + BATCH_SIZE]
            marks = ", ".join(["%s"] * len(chunk))
            cursor.execute(f"DELETE FROM {_temp_name()} WHERE entry_id IN ({marks})", chunk)


def refresh_scores(
    workspace: Workspace | int,
    *,
    now: datetime,
    params: DecayParams | None = None,
    ids: Iterable[int] | None = None,
    batch_size: int = BATCH_SIZE,
    on_batch: Callable[[], None] | None = None,
    live_since: datetime | None = None,
    settle: Settle | None = None,
) -> int:
    """Recompute stored importance and retention of the latest entries of one workspace
    (all of them, or those among ``ids``), one transaction per batch. All of them: computed
    at once, then written (``_refresh_whole``; with ``settle``, an importance is written only
    when it moved by its step or crossed a threshold); those among ``ids``: one UPDATE per
    batch of ids, exact. Returns how many rows were scored."""
    if params is None:
        ws = workspace if isinstance(workspace, Workspace) else Workspace.objects.get(pk=workspace)
        params = MaintenancePolicy.for_workspace(ws).decay_params
    if ids is None:
        return _refresh_whole(
            workspace,
            now=now,
            params=params,
            live_since=live_since,
            batch_size=batch_size,
            on_batch=on_batch,
            settle=settle,
        )
    if settle is not None:
        raise ValueError("settle is for a refresh of the whole workspace: given ids are scored exactly")
    id_list = sorted(set(ids))
    if not id_list:
        return 0
    base = Entry.objects.filter(workspace=workspace, is_latest=True)
    write = _BatchWrites(base, now_epoch=now.timestamp(), params=params, now=now, live_since=live_since)
    scored = 0
    for batch in (id_list[i : i + batch_size] for i in range(0, len(id_list), batch_size)):
        with transaction.atomic():
            scored += write(batch)
            _forget_planned(batch)
        if on_batch is not None:
            on_batch()
    return scored


_Compiled = tuple[str, list[Any], Callable[[list[Any], list[int]], list[Any]]]


@dataclass
class _BatchWrites:
    """A refresh's two statements per batch of ids: the importance where it changed (an
    unchanged entry row is not written: most entries past the age term's reach keep theirs from
    sweep to sweep) and the retention with its ``scored_at`` into the narrow ``EntryScore`` rows
    (made where missing). Compiled through the ORM once per number of ids — once in all on
    PostgreSQL, where the ids are one array — and run with each batch's ids. At 1,000,000 entries
    a refresh in batches of 1,000 took 46.8–47.5 s compiling both for every batch, 34–41 s
    compiling them once (bench/reports/maintenance.md)."""

    base: QuerySet[Entry]
    now_epoch: float
    params: DecayParams
    now: datetime
    live_since: datetime | None
    # Per id count (0 on PostgreSQL): each statement's SQL, parameters and where the ids go.
    compiled: dict[int, list[_Compiled]] = field(default_factory=dict)

    def __call__(self, batch: list[int]) -> int:
        key = 0 if connection.vendor == "postgresql" else len(batch)
        if key not in self.compiled:
            self.compiled[key] = self._compile(len(batch))
        rowcount = 0
        with connection.cursor() as cursor:
            for sql, params, bind in self.compiled[key]:
                cursor.execute(sql, bind(params, batch))
                rowcount = cursor.rowcount
        return rowcount  # the upsert's: every latest entry of the batch

    def _compile(self, n: int) -> list[_Compiled]:
        # Ids no entry has, to find where the batch's ids go among the parameters.
        marks = [-(10**15) - i for i in range(n)]
        rows = self.base.filter(pk__any_of=marks).annotate(s_id=F("pk"))
        importance = rows.annotate(value=importance_expr(self.now_epoch, self.live_since))
        retention = rows.annotate(value=retention_expr(self.now_epoch, self.params))
        e, pk, column = rawsql.table(Entry), rawsql.quote("id"), rawsql.column(Entry, "importance")
        out = []
        for qs, wrap, before in (
            (
                importance,
                lambda sql: (
                    f"UPDATE {e} SET {column} = s.value FROM ({sql}) s"
                    f" WHERE {e}.{pk} = s.s_id AND {e}.{column} <> s.value"
                ),
                [],
            ),
            # "WHERE true": SQLite would read "ON CONFLICT" as a join's ON without it.
            (
                retention,
                lambda sql: _upsert_scores(f"SELECT s.s_id, s.value, %s FROM ({sql}) s WHERE true"),
                [connection.ops.adapt_datetimefield_value(self.now)],
            ),
        ):
            sql, params = qs.order_by().values_list("s_id", "value").query.sql_with_params()
            out.append((wrap(sql), [*before, *params], _binder([*before, *params], marks)))
        return out


def _binder(params: list[Any], marks: list[int]) -> Callable[[list[Any], list[int]], list[Any]]:
    """Where ``marks`` stand in ``params`` — one array parameter (PostgreSQL) or one parameter
    each, in a row (SQLite) — and a function putting a batch's ids there instead."""
    for i, value in enumerate(params):
        if value == marks:
            return lambda compiled, ids: [*compiled[:i], list(ids), *compiled[i + 1 :]]
    n = len(marks)
    for i in range(len(params) - n + 1):
        if params[i : i + n] == marks:
            return lambda compiled, ids: [*compiled[:i], *ids, *compiled[i + n :]]
    raise AssertionError("the batch's ids are not among the statement's parameters")


SCORE_FIELDS = ("entry", "retention", "scored_at")


def _upsert_scores(rows: str) -> str:
    """INSERT ``rows`` (entry id, retention, scored_at) into ``EntryScore``, overwriting the
    scores of an entry that has its row already."""
    entry_id, retention, scored_at = (rawsql.column(EntryScore, n) for n in SCORE_FIELDS)
    return (
        f"INSERT INTO {rawsql.table(EntryScore)} ({entry_id}, {retention}, {scored_at}) {rows}"
        f" ON CONFLICT ({entry_id}) DO UPDATE"
        f" SET {retention} = excluded.{retention}, {scored_at} = excluded.{scored_at}"
    )


# A write touches few entries (itself and its link neighbours). Compiling the UPDATE above
# costs the same Python whatever the number of rows, a lot beside a few rows, so up to this
# many ids the scores are computed in Python from the same inputs (four small reads) and
# written in one UPDATE (bench/reports/api.md, section "Figures moved from the code").
FEW_IDS = 25


def rescore(workspace: Workspace, ids: Iterable[int], *, now: datetime, params: DecayParams) -> int:
    """``refresh_scores`` for the latest entries among ``ids`` (what a write changed). Returns
    how many rows were scored. The parity test proves both routes store the same values."""
    id_list = sorted(set(ids))
    if not id_list:
        return 0
    if len(id_list) > FEW_IDS:
        return refresh_scores(workspace, now=now, params=params, ids=id_list)
    # Inside a caller's transaction (every write's) no savepoint: two round trips less, and
    # an error rolls the caller back anyway.
    with transaction.atomic(savepoint=False):
        n = _rescore_in_python(workspace, id_list, now=now, params=params)
        _forget_planned(id_list)
        return n


_RESCORE_INPUTS = (
    "id",
    "lineage_id",
    "impact_score",
    "significance_type",
    "trust_score",
    "validation_status",
    "created_at",
    "access_count",
    "last_accessed_at",
    "salience",
)


@functools.cache
def _rescore_sql(vendor: str, count: int) -> tuple[str, str, str]:
    """The read (inputs of ``count`` latest entries, their counted links, anchor statuses and
    readers; rows locked in id order where the database can) and the two writes of
    ``_rescore_in_python``, written once: compiling them through the ORM on every write was
    CPU spent again on every rescored write (bench/reports/api.md, section "Figures moved from
    the code")."""
    e, rel, anchor, access = (rawsql.table(m) for m in (Entry, Relationship, CodeAnchor, EntryAccess))

    def c(model: Any, name: str, alias: str) -> str:
        return f"{alias}.{rawsql.column(model, name)}"

    pk = rawsql.quote("id")
    counted = ", ".join(f"'{status}'" for status in LISTED_STATUSES)
    causal = ", ".join(f"'{t}'" for t in CAUSAL_TYPES)

    def links(only_causal: bool) -> str:
        ends = []
        for own, other in (("from_entry", "to_entry"), ("to_entry", "from_entry")):
            ends.append(
                f"(SELECT COUNT(*) FROM {rel} r JOIN {e} o ON o.{pk} = {c(Relationship, other, 'r')}"
                f" WHERE {c(Relationship, own, 'r')} = e.{pk}"
                f" AND {c(Relationship, 'pruned_at', 'r')} IS NULL"
                f" AND {c(Entry, 'is_latest', 'o')} AND {c(Entry, 'status', 'o')} IN ({counted})"
                + (f" AND {c(Relationship, 'type', 'r')} IN ({causal})" if only_causal else "")
                + ")"
            )
        return " + ".join(ends)

    anchors = [
        f"(SELECT COUNT(*) FROM {anchor} a WHERE {c(CodeAnchor, 'entry', 'a')} = e.{pk}"
        f" AND {c(CodeAnchor, 'status', 'a')} = '{status}')"
        for status in AnchorStatus.values
    ]
    readers = (
        f"(SELECT COUNT(*) FROM {access} x"
        f" WHERE {c(EntryAccess, 'lineage_id', 'x')} = {c(Entry, 'lineage_id', 'e')})"
    )
    columns = ", ".join(c(Entry, name, "e") for name in _RESCORE_INPUTS)
    marks = ", ".join(["%s"] * count)
    read = (
        f"SELECT {columns}, {links(False)}, {links(True)}, {', '.join(anchors)}, {readers} FROM {e} e"
        f" WHERE {c(Entry, 'workspace', 'e')} = %s AND {c(Entry, 'is_latest', 'e')}"
        f" AND e.{pk} IN ({marks}) ORDER BY e.{pk}" + (" FOR UPDATE OF e" if vendor == "postgresql" else "")
    )
    importance = rawsql.column(Entry, "importance")
    # The importance where it changed (as _BatchWrites), the narrow row always.
    write_importance = f"UPDATE {e} SET {importance} = %s WHERE {pk} = %s AND {importance} <> %s"
    return read, write_importance, _upsert_scores("VALUES (%s, %s, %s)")


def _rescore_in_python(
    workspace: Workspace, id_list: list[int], *, now: datetime, params: DecayParams
) -> int:
    # The rows are locked (in id order) before their inputs are read: a concurrent write that
    # rescores one of them waits, then reads what this transaction committed, as it would
    # behind the SQL refresh's UPDATE. (SQLite serialises writes anyway.)
    read, write_importance, write_score = _rescore_sql(connection.vendor, len(id_list))
    with connection.cursor() as cursor:
        cursor.execute(read, [workspace.pk, *id_list])
        rows = cursor.fetchall()
    if not rows:
        return 0
    now_epoch = now.timestamp()
    stored = connection.ops.adapt_datetimefield_value(now)
    updates: list[tuple[float, int, float]] = []
    scores: list[tuple[int, float, Any]] = []
    n = len(_RESCORE_INPUTS)
    for row in rows:
        e = dict(zip(_RESCORE_INPUTS, rawsql.from_db_row(Entry, _RESCORE_INPUTS, row[:n]), strict=True))
        relationship_count, causal_count, *anchor_counts, readers = row[n:]
        age = max(0.0, scoring.days_between(now_epoch, e["created_at"].timestamp()))
        since = (
            None
            if e["last_accessed_at"] is None
            else scoring.days_between(now_epoch, e["last_accessed_at"].timestamp())
        )
        importance = scoring.importance(
            impact_score=e["impact_score"],
            significance_type=e["significance_type"],
            relationship_count=relationship_count,
            causal_count=causal_count,
            age_days=age,
            trust_score=e["trust_score"],
            validation_status=e["validation_status"],
            anchor_status=scoring.worst_anchor(
                status for status, found in zip(AnchorStatus.values, anchor_counts, strict=True) if found
            ),
        )
        retention = scoring.retention(
            age_days=age,
            access_count=e["access_count"],
            days_since_access=since,
            salience=e["salience"],
            readers=readers,
            params=params,
        )
        updates.append((importance, e["id"], importance))
        scores.append((e["id"], retention, stored))
    with connection.cursor() as cursor:
        for write, values in ((write_importance, updates), (write_score, scores)):
            if len(values) == 1:  # psycopg's executemany sets up a pipeline: dearer for one row
                cursor.execute(write, values[0])
            else:
                cursor.executemany(write, values)
    return len(updates)
