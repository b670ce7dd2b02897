"""What every pass is built from: the run's context and a pass's result, the one protection
rule (``unprotected``, ``not_high_value``), and the generic transition.

A transition reads its candidates' ids once and changes each batch in one transaction with its
LifecycleEvents (and Tombstones), re-checking the whole predicate under lock: a run killed at
any point leaves no half-applied batch. Inside a plan it records the new statuses instead
(``maintenance.plan_status``) and writes no entry row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from maintenance import batch_workers, hygiene_rank, plan_status, rank_triggers
from maintenance.models import PlanScore
from memory import lifecycle
from memory.models import Entry, Relationship, Workspace
from memory.models.choices import RelationshipType, Status, TombstoneReason
from memory.models.entries import held, protected, stored_retention
from memory.policy import PolicyValues
from memory.scoring_db import counted_end

BATCH_SIZE = 500
HIGH_VALUE_IMPACT = 0.5


class LeaseLost(Exception):
    """Our maintenance lease expired and was taken over; stop before the next batch."""


@dataclass
class RunContext:
    workspace: Workspace
    now: datetime
    policy: PolicyValues
    run: Any  # MaintenanceRun
    actor: str = "system"
    batch_size: int = BATCH_SIZE
    renew: Callable[[], bool] = lambda: True
    # Called once, before the first batch of a destructive pass that changes a row.
    before_destructive: Callable[[], None] = lambda: None
    # The caller of a prune passed hard_delete_older_than_days explicitly: that grace applies
    # at once. Otherwise a tombstone is also kept until its own purge_after, so lowering the
    # grace in the policy never purges earlier than the countdown an operator was shown.
    explicit_grace: bool = False
    # Held entries the passes skipped (ids), for the run's held_skipped count.
    held: set[int] = field(default_factory=set)
    # Whether the workspace has an entry with a hold, asked once per phase (``held_only``).
    any_held: bool | None = None
    # The plan: the score pass fills the temporary maintenance_planscore table instead of the
    # stored columns, and the passes read importance and retention from it (``importance_of``).
    planning: bool = False
    # Per-row details of evictions and expiries (``evicted_rows``, ``expired_rows``) and the
    # candidates evaluated: only a decay sweep reports them; a full run of a million entries
    # would keep ~250,000 dicts.
    details: bool = True
    # A real run's apply in apply mode: the ids its plan decided, per count key, for the passes
    # that change one candidate set (``planned``).
    planned_ids: Mapping[str, Sequence[int]] | None = None
    # A plan that repeats an earlier plan's decision of a pass, by count key: the ids that plan
    # decided, recorded in the overlay without reading the candidates again (``planned``).
    replayed: Mapping[str, Sequence[int]] = field(default_factory=dict)

    @property
    def run_id(self) -> int | None:
        """The id of the run the records name (none for an operator's approval outside a run)."""
        return self.run.pk if self.run is not None else None

    def heartbeat(self) -> None:
        if not self.renew():
            raise LeaseLost(f"lease of workspace {self.workspace.slug} was lost")


@dataclass
class PassResult:
    """What one pass did: the count it feeds (its key in ``run_results.COUNT_KEYS``) and the
    ids it changed, and what some passes report beside them."""

    count: int = 0
    ids: list[int] = field(default_factory=list)
    # Per changed id, values that decided it beyond the entry's own columns (a proposal shows them).
    values: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Per-row details of what changed (``detail_fields`` of a transition: a decay sweep's
    # evictions and expiries).
    rows: list[dict[str, Any]] = field(default_factory=list)
    # Other counts the pass feeds, by key (compaction: ``summaries_created``).
    also: dict[str, int] = field(default_factory=dict)
    # Entries the pass considered (a decay sweep's ``candidates_evaluated``).
    evaluated: int = 0
    # Bookkeeping rows removed, by kind of row (the reclaim of bookkeeping).
    reclaimed_rows: dict[str, int] = field(default_factory=dict)


# --- predicates ---------------------------------------------------------------------------


def latest(ctx: RunContext) -> QuerySet[Entry]:
    return Entry.objects.filter(workspace=ctx.workspace, is_latest=True)


def _score_of(ctx: RunContext, column: str) -> Any:
    # In the plan, an entry its score pass did not score (written during the plan, or rescored
    # in place since) has its stored value, as it has in the apply: a retention looked up only
    # for those (a join of every entry's stored retention cost the decay pass's plan a hash of
    # 1,000,000).
    stored = F(column) if column == "importance" else stored_retention(lookup=ctx.planning)
    if not ctx.planning:
        return stored
    planned = PlanScore.objects.filter(entry_id=OuterRef("pk")).values(column)[:1]
    return Coalesce(Subquery(planned), stored)


def importance_of(ctx: RunContext) -> Any:
    """The importance a pass decides on: the stored column, or in the plan the plan's score."""
    return _score_of(ctx, "importance")


def retention_of(ctx: RunContext) -> Any:
    """The retention a pass decides on: the stored column, or in the plan the plan's score."""
    return _score_of(ctx, "retention")


def _rule(ctx: RunContext, *, honour_pin: bool, holds: bool) -> Q:
    return protected(
        now=ctx.now,
        hold_days=ctx.policy.operator_hold_days,
        exclude_tags=ctx.policy.exclude_tags,
        honour_pin=honour_pin,
        holds=holds,
    )


def held_only(qs: QuerySet[Entry], ctx: RunContext, *, honour_pin: bool = True) -> QuerySet[Entry]:
    """The entries of ``qs`` that only an operator hold keeps from automation. A workspace
    without a single hold answers none without reading ``qs``: the question is asked once per
    phase (``RunContext.any_held``), instead of one more read of the pass's candidates per
    pass (there is no index on ``held_at``: a revert sets it on every entry it puts back, and
    an indexed column changed makes that update non-HOT). A hold placed later in the phase
    (an operator's, concurrently; a dispute's, by pass 14, after every pass that asks) keeps
    its entry out of every candidate set all the same: only the ``held_skipped`` count would
    miss it."""
    if ctx.any_held is None:
        ctx.any_held = latest(ctx).filter(held_at__isnull=False).exists()
    if not ctx.any_held:
        return qs.none()
    return qs.exclude(_rule(ctx, honour_pin=honour_pin, holds=False)).filter(
        held(now=ctx.now, hold_days=ctx.policy.operator_hold_days)
    )


def unprotected(
    qs: QuerySet[Entry], ctx: RunContext, *, honour_pin: bool = True, note_held: bool = True
) -> QuerySet[Entry]:
    """``qs`` without the entries the one protection rule (``memory.models.entries.protected``) keeps
    from automation. The held entries the pass would otherwise have changed are noted on the
    context (``held_skipped``): an operator sees that automation wanted them. ``note_held=False``
    for a pass that decides more after this filter and notes them itself."""
    if note_held:
        ctx.held.update(held_only(qs, ctx, honour_pin=honour_pin).values_list("pk", flat=True))
    return qs.exclude(_rule(ctx, honour_pin=honour_pin, holds=True))


def live_link_exists(now: datetime) -> Exists | Any:
    """An active (not pruned) link, in either direction, to a latest entry that is not
    tombstoned (or was tombstoned at or after the run's ``now``: see ``counted_end``) — except
    an incoming ``evolves_from``: a newer entry that evolved from this one (a consolidation, a
    compaction's retrospective) carries what it needed of it, so that link marks this entry as
    absorbed, not as needed. Without the exception every consolidated turn and every compacted
    fragment would be high value for ever (measured in bench/reports/locomo.md: no turn of a
    consolidated conversation was ever reclaimed)."""
    out = Relationship.objects.filter(
        counted_end("to_entry", now), from_entry=OuterRef("pk"), pruned_at__isnull=True
    )
    inc = Relationship.objects.filter(
        counted_end("from_entry", now), to_entry=OuterRef("pk"), pruned_at__isnull=True
    ).exclude(type=RelationshipType.EVOLVES_FROM)
    return Exists(out) | Exists(inc)


def not_high_value(qs: QuerySet[Entry], now: datetime) -> QuerySet[Entry]:
    """High-value entries (significance set, impact ≥ 0.5, or a live link) may be archived but
    are never tombstoned automatically."""
    return (
        qs.filter(Q(significance_type__isnull=True) | Q(significance_type=""))
        .filter(Q(impact_score__isnull=True) | Q(impact_score__lt=HIGH_VALUE_IMPACT))
        .exclude(live_link_exists(now))
    )


# --- the generic transition ---------------------------------------------------------------


def transition(
    ctx: RunContext,
    candidates: QuerySet[Entry],
    *,
    to_status: str,
    reason: str,
    tombstone_reason: str | None = None,
    destructive: bool = False,
    detail_fields: tuple[str, ...] = (),
    details_of: Mapping[int, Mapping[str, Any]] | None = None,
    ids: Sequence[int] | None = None,
    spread: bool = True,
) -> PassResult:
    """Move every candidate (among ``ids`` when given: ``planned``) to ``to_status`` in
    batches: one transaction per batch holding the status UPDATE, the LifecycleEvents and (for
    tombstones) the Tombstone rows, written by ``memory.lifecycle.change_status``
    (``details_of``: the details of each entry's event) — on PostgreSQL, without details to
    report, by ``memory.lifecycle.change_selected``, the batch's lock and writes in one
    statement.

    The candidates' ids are read once (one statement); each batch then locks its ids and reads
    them again through the whole predicate, so a row that stopped qualifying meanwhile (an
    operator pinned or held it) is left alone. Restricted to a batch's ids, the predicate's
    link checks are index lookups per row; a keyset walk (``pk > last``, LIMIT) made
    PostgreSQL build them as hash tables over every link and entry for each batch, most of the
    decay pass's time (bench/reports/maintenance.md, section "On a quiet machine, and the batch
    change")."""
    if plan_status.active():
        return _planned_transition(ctx, candidates, to_status=to_status, detail_fields=detail_fields, ids=ids)
    result = PassResult()
    # Status changes only are spread over the table (``lifecycle.batches``), and not by a
    # caller that holds every batch in one transaction of its own (``spread=False``: its
    # locks must stay in id order, and no page is pruned before it commits); a tombstoning
    # pass keeps consecutive ids: a revert reads its Tombstones and events back by runs of
    # consecutive entries, and spread they cost it 10–15 s more at 1,000,000 entries, for
    # no gain in the pass itself (bench/reports/maintenance.md, "status changes spread over
    # the table").
    spread = spread and tombstone_reason is None
    fields = (*detail_fields, "status")
    tombstoning = (
        lifecycle.Tombstoning(tombstone_reason, ctx.now + timedelta(days=ctx.policy.purge_grace_days))
        if tombstone_reason
        else None
    )

    def write(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if destructive and not result.ids:  # only in the caller's thread: see below
            ctx.before_destructive()
        batch = [r["pk"] for r in rows]
        lifecycle.change_status(
            ctx.workspace.pk,
            batch,
            to_status,
            **automatic_event(ctx, reason),
            tombstone=tombstoning,
            details_of={i: details_of[i] for i in batch if i in details_of} if details_of else None,
            tombstoned=[r["pk"] for r in rows if r["status"] == Status.TOMBSTONED],
        )
        return rows

    def done(rows: list[dict[str, Any]]) -> None:
        if detail_fields:
            result.rows.extend(_detail_rows(rows, detail_fields))
        result.ids.extend(r["pk"] for r in rows)

    walked = _ids_of(candidates, ids)
    # So many changes that the hygiene rank will be rebuilt after them: a batch writes one
    # mark for the workspace instead of one per entry (``rank_triggers.unmarked``).
    opened = partial(batch_transaction, ctx.workspace.pk, unmarked=len(walked) > hygiene_rank.REBUILD_OVER)

    def one_statement(batch: Sequence[int]) -> list[dict[str, Any]] | None:
        with opened():
            changed = lifecycle.change_selected(
                ctx.workspace.pk,
                candidates.filter(pk__any_of=batch),
                to_status,
                reason=reason,
                actor=ctx.actor,
                now=ctx.now,
                run_id=ctx.run_id,
                tombstone=tombstoning,
            )
        return [{"pk": i} for i in changed] or None

    # Without details to report, a batch is one statement on PostgreSQL
    # (``lifecycle.change_selected``); otherwise its rows are read, then written (``write``).
    fast = connection.vendor == "postgresql" and not detail_fields and not details_of and not ctx.planning
    batches = lifecycle.batches(walked, ctx.batch_size, spread=spread)

    def read_then_write(batch: Sequence[int]) -> list[dict[str, Any]] | None:
        return _locked_batch(candidates, fields, batch, write, opened)

    # The pre-prune backup before the first batch that changes a row (``write``), so one
    # batch at a time in the caller's thread until one has: it must not race a batch.
    for rows in batch_workers.each_batch(
        batches,
        one_statement if fast else read_then_write,
        ctx.heartbeat,
        alone_until=read_then_write if destructive else None,
    ):
        done(rows)
    # In id order whatever the batches' (``lifecycle.batches``): as the plan reports them.
    result.ids.sort()
    result.rows.sort(key=lambda r: r["id"])
    result.count = len(result.ids)
    return result


@contextmanager
def batch_transaction(workspace_id: int, *, unmarked: bool = False) -> Iterator[None]:
    """The transaction of one batch of a transition (a savepoint inside a caller's): with
    ``unmarked``, one that leaves a single hygiene-rank mark for the workspace
    (``rank_triggers.unmarked``).

    On PostgreSQL, when it is a transaction of its own (not inside a caller's), its commit
    does not wait for the WAL to reach the disk (``synchronous_commit`` off, for this
    transaction only). A crash of the database server may then lose the last batches
    committed — whole, never part of one, a pre-prune backup's record with the batch it
    was written in — and the run, whose row is written with an ordinary commit at its end,
    is marked failed by the next, as any interrupted run; the WAL is written in order, so
    every batch committed before an ordinary commit (a lease renewal, the run's end) is on
    disk with it. A killed process loses nothing more than before. Two or three
    milliseconds of every batch were the wait (bench/reports/maintenance.md, "Where a
    batch's time goes")."""
    outermost = not connection.in_atomic_block
    with rank_triggers.unmarked(workspace_id) if unmarked else transaction.atomic():
        if connection.vendor == "postgresql" and outermost:
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit = off")
        yield


def planned(ctx: RunContext, key: str) -> Sequence[int] | None:
    """In a real run's apply, the ids its plan decided for the pass of count key ``key``: the
    apply walks them instead of reading its candidates again (the plan read them at the same
    ``now``, on the state the earlier passes leave), and re-checks each batch through the whole
    predicate as always. An entry that became a candidate only after the plan read it waits for
    the next run. In a plan, the ids an earlier plan decided for a pass it repeats
    (``RunContext.replayed``). None elsewhere: read the candidates."""
    if ctx.planning:
        return ctx.replayed.get(key)
    if ctx.planned_ids is None:
        return None
    return ctx.planned_ids.get(key)


def locked_batches(
    ctx: RunContext,
    candidates: QuerySet[Entry],
    fields: tuple[str, ...] = (),
    *,
    ids: Sequence[int] | None = None,
    spread: bool = True,
) -> Iterator[list[dict[str, Any]]]:
    """The candidates' ids read once (one statement; or ``ids``, the plan's), then per batch of
    ``ctx.batch_size`` one transaction: the batch's ids locked and read again through the whole
    predicate, the rows still candidates (``pk`` and ``fields``) yielded — the caller writes
    them inside that transaction — and the lease renewed after it. A batch none of whose rows
    qualify any more is not yielded. On PostgreSQL the batches are spread over the table
    (``memory.lifecycle.batches``) unless ``spread`` is false."""
    for batch in lifecycle.batches(_ids_of(candidates, ids), ctx.batch_size, spread=spread):
        with transaction.atomic():
            rows = _locked_rows(candidates, fields, batch)
            if rows:
                yield rows
        ctx.heartbeat()


def _ids_of(candidates: QuerySet[Entry], ids: Sequence[int] | None) -> list[int]:
    """The ids a transition walks, sorted: ``ids`` (the plan's), or the candidates' (one read)."""
    return sorted(ids) if ids is not None else list(candidates.order_by("pk").values_list("pk", flat=True))


def _locked_rows(
    candidates: QuerySet[Entry], fields: tuple[str, ...], batch: Sequence[int]
) -> list[dict[str, Any]]:
    """The rows of ``batch`` still candidates, locked (inside the caller's transaction)."""
    return list(
        candidates.filter(pk__any_of=batch)
        .select_for_update(of=("self",))
        .order_by("pk")
        .values("pk", *fields)
    )


def _locked_batch(
    candidates: QuerySet[Entry],
    fields: tuple[str, ...],
    batch: Sequence[int],
    write: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
    opened: Callable[[], AbstractContextManager[Any]],
) -> list[dict[str, Any]] | None:
    """One batch of a transition in one transaction (``opened``): its rows still candidates
    locked, read again and written (``write``); None when none qualifies any more."""
    with opened():
        rows = _locked_rows(candidates, fields, batch)
        return write(rows) if rows else None


def _planned_transition(
    ctx: RunContext,
    candidates: QuerySet[Entry],
    *,
    to_status: str,
    detail_fields: tuple[str, ...],
    ids: Sequence[int] | None = None,
) -> PassResult:
    """``transition`` inside a plan with the status overlay: the candidates read once (or
    ``ids``, an earlier plan's decision this plan repeats: ``planned``) and their new status
    recorded beside them (``maintenance.plan_status``); no entry row is written or locked, no
    record made (the plan's records would be rolled back anyway)."""
    ordered = candidates.order_by("pk")
    result = PassResult()
    if ids is not None and not detail_fields:
        result.ids = sorted(ids)
    elif detail_fields:
        rows = list(ordered.values("pk", *detail_fields))
        result.ids = [r["pk"] for r in rows]
        result.rows = _detail_rows(rows, detail_fields)
    else:  # ids only: half a million dicts were ~100 MB at 1,000,000 entries
        result.ids = list(ordered.values_list("pk", flat=True))
    plan_status.record(result.ids, to_status, ctx.now)
    result.count = len(result.ids)
    ctx.heartbeat()
    return result


def _detail_rows(rows: Iterable[Mapping[str, Any]], fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """The per-row details a transition reports (``PassResult.rows``): the id and ``fields``."""
    return [{"id": r["pk"], **{f: r[f] for f in fields}} for r in rows]


def tombstone(ctx: RunContext, candidates: QuerySet[Entry], reason: str, **options: Any) -> PassResult:
    """The destructive transition shared by passes 8–11: tombstone with a Tombstone row whose
    reason is the pass's, after the pre-prune backup."""
    return transition(
        ctx,
        candidates,
        to_status=Status.TOMBSTONED,
        reason=reason,
        tombstone_reason=TombstoneReason(reason),
        destructive=True,
        **options,
    )


def automatic_event(ctx: RunContext, reason: str) -> dict[str, Any]:
    """The event of a pass's change: automatic, of the run, by its actor — none in the plan,
    which is rolled back and whose passes never read the events of their own run."""
    return {
        "reason": reason,
        "actor": ctx.actor,
        "now": ctx.now,
        "automatic": True,
        "run_id": ctx.run_id,
        "record": not ctx.planning,
    }
