"""The passes of a maintenance run, one short set-based function each.

Every pass reads its candidates in batches of ids and changes them through
``pass_tools.transition`` (or a batched transaction of its own), so no pass issues a query per
entry; each returns a ``PassResult`` with its count and the ids it changed. Every pass that
archives or tombstones goes through the protection rule (``unprotected``, ``not_high_value``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Case, Exists, F, OuterRef, Q, QuerySet, Value, When
from django.db.models.functions import Coalesce, Least

from maintenance import compaction, contradictions, hygiene_actions, plan_status
from maintenance.pass_tools import (
    PassResult,
    RunContext,
    automatic_event,
    importance_of,
    latest,
    locked_batches,
    not_high_value,
    planned,
    retention_of,
    tombstone,
    transition,
    unprotected,
)
from maintenance.plan_status import status_in
from memory import lifecycle, rawsql
from memory.bulk_insert import chunks
from memory.models import Entry, EntryAccess, LifecycleEvent, Relationship, Tag, Tombstone, Workspace
from memory.models.choices import LISTED_STATUSES, EntryType, StagedClass, Status, Tier, TombstoneReason
from memory.policy import PolicyValues
from memory.scoring_db import PLAN_TABLE, Settle, plan_scores, refresh_scores

GRADUATING_CLASSES = (StagedClass.PROCEDURAL, StagedClass.CONCEPTUAL, StagedClass.REFERENCE)
GRADUATION_TAGS = ("consolidated", "graduated")
ORPHAN_IMPORTANCE = 0.2
# A run's score pass writes an importance that moved at least this much since it was stored,
# or crossed a threshold some decision compares it with (``settle``); a sweep every 10 minutes
# moves a young entry's recency term by ~2e-5.
IMPORTANCE_STEP = 0.001


def _days_ago(ctx: RunContext, days: float) -> datetime:
    return ctx.now - timedelta(days=days)


# --- the passes -----------------------------------------------------------------------------


def settle(policy: PolicyValues) -> Settle:
    """When a run stores a new importance (``scoring_db.Settle``): moved by IMPORTANCE_STEP, or
    across a threshold a decision compares importance with — the policy's (archive, prune),
    the orphan count's, the contradiction check's at write time — so every decision reads the
    side of each threshold the exact value is on. Retention likewise, across the policy's
    cold threshold (the decay pass's)."""
    thresholds = {policy.importance_threshold, ORPHAN_IMPORTANCE, contradictions.WRITE_CHECK_IMPORTANCE}
    return Settle(IMPORTANCE_STEP, tuple(sorted(thresholds)), retention=(policy.cold_threshold,))


def score(ctx: RunContext) -> PassResult:
    """1. Refresh importance and retention of every latest entry (in the plan: into the
    temporary table the plan's passes read, one statement, see ``plan_scores``); an importance
    is stored where it moved enough to matter (``settle``)."""
    if ctx.planning:
        return PassResult(
            count=plan_scores(
                ctx.workspace,
                now=ctx.now,
                params=ctx.policy.decay_params,
                live_since=ctx.now,
                settle=settle(ctx.policy),
            )
        )
    n = refresh_scores(
        ctx.workspace,
        now=ctx.now,
        params=ctx.policy.decay_params,
        batch_size=ctx.batch_size * 2,
        on_batch=ctx.heartbeat,
        live_since=ctx.now,
        settle=settle(ctx.policy),
    )
    return PassResult(count=n)


# What graduation changes besides the status, in the same UPDATE.
GRADUATION = {
    "trust_score": Least(Coalesce(F("trust_score"), Value(0.5)) + Value(0.25), Value(0.9)),
    "impact_score": Least(Coalesce(F("impact_score"), Value(0.0)) + Value(0.15), Value(0.9)),
    "entry_type": Case(
        When(staged_class__in=[StagedClass.PROCEDURAL, StagedClass.CONCEPTUAL], then=Value(EntryType.LESSON)),
        default=F("entry_type"),
    ),
}


def graduate_staged(ctx: RunContext) -> PassResult:
    """2. Staged procedural/conceptual/reference traces that proved useful (reinforced, or
    dispatched into an agent's context at least twice) become active lessons."""
    candidates = (
        latest(ctx)
        .filter(status_in([Status.STAGED]), staged_class__in=GRADUATING_CLASSES)
        .filter(Q(reinforced_at__isnull=False) | Q(retrieval_count__gte=2))
    )
    result = PassResult()
    tags = _tags(ctx.workspace, GRADUATION_TAGS)
    for rows in locked_batches(ctx, candidates, ids=planned(ctx, "staged_graduated")):
        ids = [r["pk"] for r in rows]
        lifecycle.change_status(
            ctx.workspace.pk, ids, Status.ACTIVE, **automatic_event(ctx, "graduate"), columns=GRADUATION
        )
        Entry.tags.through.objects.bulk_create(
            [Entry.tags.through(entry_id=i, tag_id=t.pk) for i in ids for t in tags],
            ignore_conflicts=True,
        )
        result.ids += ids
    result.ids.sort()
    result.count = len(result.ids)
    return result


def expire_staged_candidates(ctx: RunContext) -> QuerySet[Entry]:
    return unprotected(
        latest(ctx).filter(
            status_in([Status.STAGED]), reinforced_at__isnull=True, ttl_expires_at__lte=ctx.now
        ),
        ctx,
    )


def expire_staged(ctx: RunContext) -> PassResult:
    """3. Staged traces never reinforced whose TTL has passed are archived."""
    return transition(
        ctx,
        expire_staged_candidates(ctx),
        to_status=Status.ARCHIVED,
        reason="staged_expiry",
        ids=planned(ctx, "staged_expired"),
    )


def mark_stale(ctx: RunContext) -> PassResult:
    """4. Active managed unprotected entries with no access and no update for
    stale_after_days become stale."""
    cutoff = _days_ago(ctx, ctx.policy.stale_after_days)
    candidates = unprotected(
        latest(ctx)
        .filter(status_in([Status.ACTIVE]), created_at__lt=cutoff, updated_at__lt=cutoff)
        .filter(Q(last_accessed_at__isnull=True) | Q(last_accessed_at__lt=cutoff)),
        ctx,
    )
    return transition(
        ctx, candidates, to_status=Status.STALE, reason="stale", ids=planned(ctx, "stale_marked")
    )


def archive_candidates(ctx: RunContext, *, stale_part: bool = True) -> QuerySet[Entry]:
    rule = Q(pk__in=[])
    if stale_part:
        rule |= status_in([Status.STALE], changed_before=_days_ago(ctx, ctx.policy.archive_after_days))
    if ctx.policy.archive_older_than_days > 0:
        rule |= status_in([Status.ACTIVE, Status.STALE]) & Q(
            created_at__lt=_days_ago(ctx, ctx.policy.archive_older_than_days),
            run_importance__lt=ctx.policy.importance_threshold,
        )
    return unprotected(latest(ctx).alias(run_importance=importance_of(ctx)).filter(rule), ctx)


def archive(ctx: RunContext, *, stale_part: bool = True) -> PassResult:
    """5. Stale for archive_after_days → archived; and, when archive_older_than_days > 0,
    older than that with importance below the threshold → archived."""
    return transition(
        ctx,
        archive_candidates(ctx, stale_part=stale_part),
        to_status=Status.ARCHIVED,
        reason="archive",
        ids=planned(ctx, "archived"),
    )


def archive_aged(ctx: RunContext) -> PassResult:
    """A prune's archive: by age and score only, without the stale part of a full run's."""
    return archive(ctx, stale_part=False)


def archive_low_quality(ctx: RunContext) -> PassResult:
    """6. Entries hygiene recommends archiving, never accessed, older than
    low_quality_min_age_days → archived (maintenance/hygiene_actions.py). A real run's apply
    re-checks only its plan's ids (``planned``): scanning the workspace again was 6 s of a
    first run at 1,000,000 entries."""
    return hygiene_actions.archive_low_quality(ctx, only=planned(ctx, "low_quality_archived"))


# A real run's apply compacts its plan's fragments (``planned``) when they are at most this
# many: each of ``compaction.compact``'s few statements names them all (SQLite takes at most
# 32,766 parameters a statement by default); more are read again.
PLANNED_FRAGMENTS_MAX = 5000


def compact(ctx: RunContext) -> PassResult:
    """7. Fragments of one work session → one retrospective (maintenance/compaction.py).
    ``extra`` carries summaries_created. A real run's apply compacts the groups of its plan's
    fragments alone (``planned``), re-checked by the same rule: counting every session's
    fragments again was about 1 s of a first run at 1,000,000 entries."""
    only = planned(ctx, "consolidated")
    if only is not None and len(only) > PLANNED_FRAGMENTS_MAX:
        only = None
    return compaction.compact(ctx, only=None if only is None else list(only))


def prune_candidates(ctx: RunContext) -> QuerySet[Entry]:
    if ctx.policy.prune_older_than_days <= 0:
        return latest(ctx).none()
    return unprotected(
        not_high_value(
            latest(ctx)
            .alias(run_importance=importance_of(ctx))
            .filter(
                status_in([Status.ACTIVE, Status.STALE, Status.ARCHIVED]),
                created_at__lt=_days_ago(ctx, ctx.policy.prune_older_than_days),
                run_importance__lt=ctx.policy.importance_threshold,
            ),
            ctx.now,
        ),
        ctx,
    )


def prune(ctx: RunContext) -> PassResult:
    """8. When prune_older_than_days > 0: entries older than that whose importance is strictly
    below the threshold are tombstoned."""
    if ctx.policy.prune_older_than_days <= 0:
        return PassResult()
    return tombstone(ctx, prune_candidates(ctx), TombstoneReason.PRUNE, ids=planned(ctx, "pruned"))


def decay_candidates(ctx: RunContext) -> QuerySet[Entry]:
    """Entries the decay pass evaluates: latest episodic active/stale entries."""
    return latest(ctx).filter(status_in([Status.ACTIVE, Status.STALE]), tier=Tier.EPISODIC)


def cold_candidates(ctx: RunContext) -> QuerySet[Entry]:
    cold = decay_candidates(ctx).annotate(run_retention=retention_of(ctx))
    return unprotected(not_high_value(cold.filter(run_retention__lt=ctx.policy.cold_threshold), ctx.now), ctx)


# run_retention: the retention the pass decided on (cold_candidates), reported as "retention".
DECAY_DETAILS = ("run_retention", "created_at", "access_count")
TTL_DETAILS = ("expires_at",)


def decay(ctx: RunContext) -> PassResult:
    """9. Episodic, managed, unprotected, not high-value entries whose retention is strictly
    below the cold threshold are tombstoned."""
    # Only a decay sweep reports how many it evaluated: a count over every episodic entry
    # (1.5 s at 1,000,000 entries) a full run would make for nothing, in its plan and its apply.
    evaluated = decay_candidates(ctx).count() if ctx.details else 0
    details = DECAY_DETAILS if ctx.details else ()
    result = tombstone(
        ctx, cold_candidates(ctx), TombstoneReason.DECAY, detail_fields=details, ids=planned(ctx, "evicted")
    )
    for r in result.rows:
        r["retention"] = r.pop("run_retention")
    result.evaluated = evaluated
    return result


def ttl_candidates(ctx: RunContext) -> QuerySet[Entry]:
    """The writer asked for it, so a TTL is honoured even for pinned and high-value entries;
    every other protection — an operator hold included — still applies."""
    return unprotected(
        latest(ctx).filter(status_in(LISTED_STATUSES), expires_at__lte=ctx.now),
        ctx,
        honour_pin=False,
    )


def expire_ttl(ctx: RunContext) -> PassResult:
    """10. expires_at ≤ now → tombstoned."""
    details = TTL_DETAILS if ctx.details else ()
    return tombstone(
        ctx, ttl_candidates(ctx), TombstoneReason.TTL, detail_fields=details, ids=planned(ctx, "expired")
    )


def reclaim_candidates(ctx: RunContext) -> QuerySet[Entry]:
    return unprotected(
        not_high_value(
            latest(ctx).filter(
                status_in(
                    [Status.ARCHIVED], archived_before=_days_ago(ctx, ctx.policy.reclaim_archived_after_days)
                )
            ),
            ctx.now,
        ),
        ctx,
    )


def reclaim(ctx: RunContext) -> PassResult:
    """11. Archived for reclaim_archived_after_days → tombstoned."""
    return tombstone(ctx, reclaim_candidates(ctx), TombstoneReason.RECLAIM, ids=planned(ctx, "reclaimed"))


@dataclass(frozen=True)
class Change:
    """How one proposing pass changes an entry, for approving its proposals later:
    the pass's own candidate rule, re-checked at approval, and its transition."""

    action: str  # archive | tombstone
    candidates: Callable[[RunContext], QuerySet[Entry]]
    event_reason: str


# The simple proposing passes, by count key. Passes 6 (low quality) and 7 (compaction) judge
# in Python and write digests: their modules approve their own proposals.
CHANGES: dict[str, Change] = {
    "staged_expired": Change("archive", expire_staged_candidates, "staged_expiry"),
    "archived": Change("archive", archive_candidates, "archive"),
    "pruned": Change("tombstone", prune_candidates, TombstoneReason.PRUNE),
    "evicted": Change("tombstone", cold_candidates, TombstoneReason.DECAY),
    "expired": Change("tombstone", ttl_candidates, TombstoneReason.TTL),
    "reclaimed": Change("tombstone", reclaim_candidates, TombstoneReason.RECLAIM),
}


def apply_change(ctx: RunContext, key: str, ids: list[int]) -> PassResult:
    """Apply the proposals of pass ``key`` for ``ids``: those still candidates of the pass now."""
    change = CHANGES[key]
    candidates = change.candidates(ctx).filter(pk__in=ids)
    if change.action == "tombstone":
        return tombstone(ctx, candidates, change.event_reason)
    return transition(ctx, candidates, to_status=Status.ARCHIVED, reason=change.event_reason)


def prunable_links(workspace: Workspace) -> QuerySet[Relationship]:
    """The active links of ``workspace`` whose both ends are archived or tombstoned (in a plan,
    as its status overlay says)."""
    gone = [Status.ARCHIVED, Status.TOMBSTONED]
    return Relationship.objects.filter(
        status_in(gone, prefix="from_entry__"),
        status_in(gone, prefix="to_entry__"),
        workspace=workspace,
        pruned_at__isnull=True,
    )


def prune_links(ctx: RunContext) -> PassResult:
    """12. Links whose both ends are archived or tombstoned are deactivated (pruned_at set,
    restorable)."""
    candidates = prunable_links(ctx.workspace)
    result = PassResult()

    def prune_batch(ids: list[int]) -> None:
        if ids:
            if not result.ids:
                ctx.before_destructive()
            Relationship.objects.filter(pk__any_of=ids).update(pruned_at=ctx.now, pruned_by_run=ctx.run)
            result.ids.extend(ids)

    if ctx.planning:
        # A keyset walk (``pk > last``, LIMIT): in a plan, whose statuses are read through its
        # overlay, one read of every candidate took twice as long (1.9 against 1.0 s at
        # 1,000,000 entries). A plan is rolled back: there is nothing to re-check.
        while ids := list(
            candidates.filter(pk__gt=result.ids[-1] if result.ids else 0)
            .order_by("pk")
            .values_list("pk", flat=True)[: ctx.batch_size]
        ):
            prune_batch(ids)
            ctx.heartbeat()
    else:
        # The candidates' ids (the plan's, ``planned``, or read once), then each batch
        # re-checked by its ids: the keyset walk joined both ends' entries again for every
        # batch, 0.7 s each once the earlier passes had changed most of them (4.8 s against
        # 2.9 s at 1,000,000 entries).
        walked = planned(ctx, "links_pruned")
        if walked is None:
            walked = list(candidates.order_by("pk").values_list("pk", flat=True))
        for batch in chunks(sorted(walked), ctx.batch_size):
            with transaction.atomic():
                prune_batch(
                    list(candidates.filter(pk__any_of=batch).order_by("pk").values_list("pk", flat=True))
                )
            ctx.heartbeat()
    result.count = len(result.ids)
    return result


def purge(ctx: RunContext) -> PassResult:
    """13. Tombstones older than the grace (hard_delete_older_than_days if > 0, else
    tombstone_grace_days) are purged: the whole lineage with its links, anchors, tags, access
    rows and disputes, in one transaction per batch. The Tombstone stays as a content-free
    record; a 'purged' LifecycleEvent (entry gone, entry_ref kept) is written per lineage."""
    cutoff = _days_ago(ctx, ctx.policy.purge_grace_days)
    due = Tombstone.objects.filter(
        workspace=ctx.workspace,
        restored_at__isnull=True,
        purged_at__isnull=True,
        created_at__lte=cutoff,
        entry__isnull=False,
    )
    if not ctx.explicit_grace:
        due = due.filter(purge_after__lte=ctx.now)
    result = PassResult()
    while True:
        with transaction.atomic():
            rows = list(
                due.select_for_update(of=("self",))
                .order_by("pk")
                .values("pk", "entry_ref", "lineage_ref")[: ctx.batch_size]
            )
            if not rows:
                break
            if not result.ids:
                ctx.before_destructive()
            result.ids += purge_lineages(ctx.workspace, rows, ctx.now, run=ctx.run, actor=ctx.actor)
        ctx.heartbeat()
    result.count = len(result.ids)
    return result


def purge_lineages(
    workspace: Workspace,
    tombstone_rows: Iterable[Mapping[str, Any]],
    now: datetime,
    run: Any = None,
    actor: str = "system",
    *,
    automatic: bool = True,
) -> list[int]:
    """Hard-delete the lineages of ``tombstone_rows`` (dicts with ``pk``, ``entry_ref`` and
    ``lineage_ref`` of open Tombstones, which the caller has locked in its transaction): every
    version with its links, anchors, tags, access rows and disputes. The Tombstones stay as
    content-free records (purged_at set, entry cleared) and a 'purged' LifecycleEvent is written
    per lineage. Returns the purged entry ids (``entry_ref``). Writes no backup: that is the
    caller's duty, before it calls this. Announced after commit (``memory.lifecycle.announce``)."""
    rows = list(tombstone_rows)
    if not rows:
        return []
    lineages = [r["lineage_ref"] for r in rows]
    # Scoped to the workspace: a lineage id can never reach another workspace's rows.
    doomed = Entry.objects.filter(workspace=workspace, lineage_id__in=lineages)
    # Locked before their events are unlinked: a writer holding one of them commits its event
    # first, and the unlinking sees it (the events' entry reference has no database check).
    doomed_ids = list(doomed.select_for_update().order_by("pk").values_list("pk", flat=True))
    EntryAccess.objects.filter(workspace=workspace, lineage_id__in=lineages).delete()
    Tombstone.objects.filter(pk__in=[r["pk"] for r in rows]).update(purged_at=now, entry=None)
    Entry.objects.filter(pk__in=doomed_ids).delete()  # cascades links, anchors, tags, disputes
    LifecycleEvent.objects.bulk_create(
        LifecycleEvent(
            workspace=workspace,
            entry=None,
            entry_ref=r["entry_ref"],
            from_status=Status.TOMBSTONED,
            to_status="purged",
            reason="purge",
            run=run,
            actor=actor,
            automatic=automatic,
            created_at=now,
            details={"lineage": r["lineage_ref"]},
        )
        for r in rows
    )
    lifecycle.announce(workspace.pk, ["purged"], len(rows))
    return [r["entry_ref"] for r in rows]


def flag_contradictions(ctx: RunContext) -> PassResult:
    """14. The contradiction sweep (maintenance/contradictions.py)."""
    return contradictions.flag_contradictions(ctx)


ORPHAN_STATUSES = (Status.STAGED, Status.ACTIVE, Status.STALE)


def count_orphans(ctx: RunContext) -> PassResult:
    """15. Metric only: live entries with no active link and importance below 0.2."""
    if ctx.planning:
        return PassResult(count=_planned_orphans(ctx))
    # A link of either side, as two NOT EXISTS: PostgreSQL joins each by hash, where one
    # EXISTS over both sides (an OR) looked both up per entry (1.07 against 0.56 s at
    # 1,000,000 entries).
    live = Relationship.objects.filter(pruned_at__isnull=True)
    n = (
        latest(ctx)
        .alias(run_importance=importance_of(ctx))
        .filter(status_in(ORPHAN_STATUSES), run_importance__lt=ORPHAN_IMPORTANCE)
        .exclude(Exists(live.filter(from_entry=OuterRef("pk"))))
        .exclude(Exists(live.filter(to_entry=OuterRef("pk"))))
        .count()
    )
    return PassResult(count=n)


def _planned_orphans(ctx: RunContext) -> int:
    """``count_orphans`` in a plan: the same count, every entry's planned status and score
    joined in one statement (the plan's status overlay, if open, and its score table, which
    the score pass, first in every run, fills). Through ``status_in`` and ``importance_of``
    each was a lookup per entry: 6 s of the plan at 1,000,000 entries, against ~1 s for this
    count in the apply (bench/reports/maintenance.md, "Fewer round trips and checks per
    batch")."""
    entry = functools.partial(rawsql.column, Entry)
    link = functools.partial(rawsql.column, Relationship)
    # On PostgreSQL the score table and the links are joined by hash, each read once: the
    # planner cannot estimate the COALESCE filters on temporary tables (no statistics) and
    # took a few thousand rows for 650,000, then looked each up by index — ``+ 0`` keeps an
    # index from matching (3.2 -> 2.2 s at 1,000,000 entries). SQLite joins by nested loops
    # only and needs the indexes. The links of an entry are its workspace's.
    hashed = " + 0" if connection.vendor == "postgresql" else ""
    status = f"e.{entry('status')}"
    joins = f" LEFT JOIN {rawsql.temp_table(PLAN_TABLE)} s ON s.entry_id{hashed} = e.{entry('id')}"
    if plan_status.active():
        joins += f" LEFT JOIN {rawsql.temp_table(plan_status.TABLE)} p ON p.entry_id = e.{entry('id')}"
        status = f"COALESCE(p.status, {status})"
    no_link = " AND ".join(
        f"NOT EXISTS (SELECT 1 FROM {rawsql.table(Relationship)} r"
        f" WHERE r.{link(side)}{hashed} = e.{entry('id')} AND r.{link('workspace')} = %s"
        f" AND r.{link('pruned_at')} IS NULL)"
        for side in ("from_entry", "to_entry")
    )
    marks = ", ".join(["%s"] * len(ORPHAN_STATUSES))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {rawsql.table(Entry)} e{joins} WHERE e.{entry('workspace')} = %s"
            f" AND e.{entry('is_latest')} AND {status} IN ({marks})"
            f" AND COALESCE(s.importance, e.{entry('importance')}) < %s AND {no_link}",
            [ctx.workspace.pk, *ORPHAN_STATUSES, ORPHAN_IMPORTANCE, ctx.workspace.pk, ctx.workspace.pk],
        )
        return int(cursor.fetchone()[0])


# --- helpers --------------------------------------------------------------------------------


def _tags(workspace: Workspace, names: Iterable[str]) -> list[Tag]:
    names = list(names)
    Tag.objects.bulk_create([Tag(workspace=workspace, name=n) for n in names], ignore_conflicts=True)
    return list(Tag.objects.filter(workspace=workspace, name__in=names))
