"""The hygiene queue kept ranked (``HygieneRank``): its first page and its count read a narrow
index instead of scoring every active entry on every call.

Scoring the whole queue in one statement costs a pass over every active entry, a lookup of its
stored verdict and one of an older copy: 5–8 s at 1,000,000 entries (236,000 candidates), the
bulk of it reading the wide entry table three times (bench/reports/maintenance.md). So the
score is kept, per entry, beside what the queue filters on:

- **Marked by the database.** Triggers on ``memory_entry`` and ``maintenance_hygieneassessment``
  (``maintenance.rank_triggers``) write a mark (``HygieneRankDirty``) for every entry whose
  ranked columns change, whatever door changed it — a write, a run's batch, a revert, a
  restore, raw SQL. A mark that may change the duplicate points of its copies names its
  content hash.
- **Folded before it is read.** ``fold`` claims a workspace's marks (a batch at a time, each a
  short transaction) and recomputes the rows of the marked entries and of every latest entry
  sharing a marked content hash, with the queue's own expression (``hygiene.scored_entries``). More
  marks than ``REBUILD_OVER`` (a run's apply, a restore), a rank never built, or a different
  key (residue patterns, detector version, points: ``rank_key``) rebuild the workspace's rows
  in one statement instead, and so does a mark standing for every entry of the workspace
  (``rank_triggers.EVERY_ENTRY``: what a large run's batch writes instead of its own,
  ``rank_triggers.unmarked``). The worker's hygiene schedule folds after making verdicts, so a
  reader usually finds nothing to fold.
- **Read with what changes by itself.** A hold ends with time and the excluded tags are the
  policy's: both are applied when the queue is read (``held_at`` is kept in the row).

Claiming a mark deletes it before the entries are read, so a change committed meanwhile leaves
a mark of its own and is folded next time: the rank never misses a change, it may only fold
one twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Window

from maintenance.hygiene_text import CANDIDATE_SCORE, FEEDBACK_FLAGS, POINTS, Pattern, patterns_key
from maintenance.models import HygieneRank, HygieneRankDirty, HygieneRankState
from maintenance.rank_triggers import EVERY_ENTRY
from memory.capped import capped_count, capped_counts
from memory.models import Entry, Workspace
from memory.models.choices import LIVE_STATUSES, MANAGED_SOURCES, Status
from memory.models.entries import held, protected
from memory.policy import PolicyValues

FOLD_BATCH = 2000  # marks claimed per transaction
REBUILD_OVER = 20_000  # more marks than this: the workspace's rows are rebuilt at once


def rank_key(patterns: Sequence[Pattern]) -> str:
    """What the rows were computed with: the patterns and detectors (``patterns_key``), the
    points of every reason, the listing threshold, and the rules read off the columns (the
    flagging feedback, the managed sources, the live statuses an older copy needs)."""
    rules = [POINTS, CANDIDATE_SCORE, FEEDBACK_FLAGS, MANAGED_SOURCES, LIVE_STATUSES]
    raw = json.dumps([patterns_key(patterns), *rules], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()


def rankable(workspace: Workspace) -> QuerySet[Entry]:
    """The entries the rank may hold, by their own columns: latest, active, not protected by
    source, tier or pin, not kept. Holds and excluded tags are read with the rank."""
    from maintenance.hygiene import not_kept

    qs = Entry.objects.filter(workspace=workspace, is_latest=True, status=Status.ACTIVE)
    static = protected(now=datetime.min, hold_days=0, holds=False)
    return not_kept(qs.exclude(static))


def _insert(workspace: Workspace, qs: QuerySet[Entry], patterns: Sequence[Pattern]) -> int:
    """Insert the rank rows of the entries of ``qs`` that are listed or still to assess (one
    statement); returns how many."""
    from maintenance.hygiene import scored_entries

    scored = scored_entries(workspace, qs, patterns).annotate(
        r_id=F("pk"), r_created=F("created_at"), r_held=F("held_at")
    )
    sql, params = (
        scored.order_by().values("r_id", "r_created", "r_held", "hygiene_points").query.sql_with_params()
    )
    table = HygieneRank._meta.db_table
    statement = (
        f"INSERT INTO {table} (entry_id, workspace_id, points, created_at, held_at)"
        f" SELECT q.r_id, %s, q.hygiene_points, q.r_created, q.r_held FROM ({sql}) q"
        f" WHERE q.hygiene_points >= {CANDIDATE_SCORE} OR q.hygiene_points IS NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, [workspace.pk, *params])
        return cursor.rowcount


def _state(workspace: Workspace) -> HygieneRankState | None:
    """The workspace's state row (made with an empty key when missing), locked: one fold of a
    workspace at a time. None only if the workspace was deleted meanwhile."""
    HygieneRankState.objects.get_or_create(workspace=workspace, defaults={"rank_key": ""})
    return HygieneRankState.objects.select_for_update().filter(workspace=workspace).first()


def rebuild(
    workspace: Workspace, patterns: Sequence[Pattern], *, unless_within: int | None = None
) -> int | None:
    """Recompute every rank row of the workspace (one transaction: the marks claimed, the
    rows replaced in one statement); returns the rows written. With ``unless_within``, None
    instead when, once the lock is held, the rank has the current key and at most that many
    marks: another fold rebuilt it meanwhile."""
    key = rank_key(patterns)
    with transaction.atomic():
        state = _state(workspace)
        marks = HygieneRankDirty.objects.filter(workspace_id=workspace.pk)
        if (
            unless_within is not None
            and state is not None
            and state.rank_key == key
            and capped_count(marks, cap=unless_within) <= unless_within
            and not marks.filter(entry_id=EVERY_ENTRY).exists()
        ):
            return None
        marks.delete()
        HygieneRank.objects.filter(workspace=workspace).delete()
        written = _insert(workspace, rankable(workspace), patterns)
        if state is not None:
            state.rank_key = key
            state.save(update_fields=["rank_key"])
    return written


class _Rebuild(Exception):
    """A batch would recompute more entries than a rebuild is worth, or claimed a mark that
    stands for every entry."""


def _fold_batch(workspace: Workspace, patterns: Sequence[Pattern], batch: int, most: int) -> int | None:
    """Claim up to ``batch`` marks and recompute their entries' rows and their copies' (one
    transaction). Returns the marks claimed; None when the rank must be rebuilt instead (a
    different key), and raises ``_Rebuild``, claiming nothing, when that would be more than
    ``most`` entries or a claimed mark stands for every entry (``EVERY_ENTRY``)."""
    with transaction.atomic():
        state = _state(workspace)
        if state is None or state.rank_key != rank_key(patterns):
            return None
        table = HygieneRankDirty._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table} WHERE id IN"
                f" (SELECT id FROM {table} WHERE workspace_id = %s ORDER BY id LIMIT %s)"
                " RETURNING entry_id, content_hash",
                [workspace.pk, batch],
            )
            claimed = cursor.fetchall()
        if not claimed:
            return 0
        ids = {pk for pk, _ in claimed}
        if EVERY_ENTRY in ids:  # a large run's batch marked the whole workspace: the claim rolls back
            raise _Rebuild
        hashes = {h for _, h in claimed if h is not None}
        if hashes:
            ids |= set(
                Entry.objects.filter(
                    workspace=workspace, is_latest=True, content_hash__in=hashes
                ).values_list("pk", flat=True)
            )
        if len(ids) > most:  # a content copied thousands of times: the claim rolls back
            raise _Rebuild
        HygieneRank.objects.filter(entry_id__in=ids).delete()
        _insert(workspace, rankable(workspace).filter(pk__in=ids), patterns)
        return len(claimed)


def fold(
    workspace: Workspace,
    patterns: Sequence[Pattern],
    *,
    batch: int = FOLD_BATCH,
    rebuild_over: int = REBUILD_OVER,
) -> dict[str, int]:
    """Bring the workspace's rank up to date: fold its marks, or rebuild it (never built, a
    different key, more than ``rebuild_over`` marks). Nothing to do costs one query.
    Returns what was done: ``folded`` marks, ``rebuilt`` rows."""
    key = rank_key(patterns)
    marks = HygieneRankDirty.objects.filter(workspace_id=workspace.pk)
    folded = 0
    for attempt in range(3):
        state = (
            HygieneRankState.objects.filter(workspace=workspace)
            .annotate(marked=Exists(marks))
            .values_list("rank_key", "marked")
            .first()
        )
        if state is not None and state[0] == key:
            if not state[1]:
                return {"folded": folded, "rebuilt": 0}
            if capped_count(marks, cap=rebuild_over) <= rebuild_over:
                try:
                    while (n := _fold_batch(workspace, patterns, batch, rebuild_over)) is not None:
                        folded += n
                        if n < batch:
                            return {"folded": folded, "rebuilt": 0}
                except _Rebuild:
                    return {"folded": folded, "rebuilt": rebuild(workspace, patterns) or 0}
        # Decided without the lock: a fold that held it may have rebuilt the rank meanwhile
        # (readers waiting while the worker rebuilds after new patterns). Then fold instead.
        rebuilt = rebuild(workspace, patterns, unless_within=None if attempt == 2 else rebuild_over)
        if rebuilt is not None:
            return {"folded": folded, "rebuilt": rebuilt}
    return {"folded": folded, "rebuilt": 0}  # not reached: the last attempt always rebuilds


def queue(workspace: Workspace, policy: PolicyValues, now: datetime) -> QuerySet[HygieneRank]:
    """The rank rows the queue lists now: not under a hold, without an excluded tag."""
    rows = HygieneRank.objects.filter(workspace=workspace).exclude(
        held(now=now, hold_days=policy.operator_hold_days)
    )
    if policy.exclude_tags:
        tagged = Entry.tags.through.objects.filter(
            entry_id=OuterRef("entry_id"), tag__name__in=list(policy.exclude_tags)
        )
        rows = rows.exclude(Exists(tagged))
    return rows


def ranked_page(
    workspace: Workspace,
    policy: PolicyValues,
    now: datetime,
    *,
    start: int,
    end: int,
    where: Q | None = None,
) -> tuple[list[tuple[int, int | None]], int, int]:
    """The page ``start``..``end`` of the queue's rows (those matching ``where`` when given),
    best first (entries still to assess first), with the rows matching and how many of them
    are assessed (one statement)."""
    rows = queue(workspace, policy, now)
    if where is not None:
        rows = rows.filter(where)
    found = list(
        rows.annotate(matching=Window(Count("*")), listed=Window(Count("points")))
        .order_by(F("points").desc(nulls_first=True), "created_at", "entry_id")
        .values_list("entry_id", "points", "matching", "listed")[start:end]
    )
    if not found:
        return [], 0, 0
    return [(r[0], r[1]) for r in found], int(found[0][2]), int(found[0][3])


def to_assess(workspace: Workspace, policy: PolicyValues, now: datetime) -> QuerySet[HygieneRank]:
    """The queue's rows whose entry has no valid stored verdict yet (points NULL)."""
    return queue(workspace, policy, now).filter(points__isnull=True)


def counted(
    workspace: Workspace, policy: PolicyValues, now: datetime, *, cap: int | None = None
) -> tuple[int, int]:
    """How many assessed candidates the queue lists, and how many of its entries are still to
    assess (one statement; with ``cap``, each at most ``cap + 1``)."""
    rows = queue(workspace, policy, now)
    if cap is not None:
        got = capped_counts(
            {"assessed": rows.filter(points__isnull=False), "missing": rows.filter(points__isnull=True)},
            cap=cap,
        )
        return got["assessed"], got["missing"]
    got = rows.aggregate(rows=Count("pk"), assessed=Count("points"))
    return got["assessed"], got["rows"] - got["assessed"]
