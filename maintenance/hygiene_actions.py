"""Acting on hygiene: an operator's apply and keep, and the low-quality pass (6) of a run.

Apply archives only ids a fresh queue still lists; keep holds while the content is the one
kept. Both and the pass go through ``memory.lifecycle``, each event carrying score and reasons.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import (
    F,
    QuerySet,
)
from django.utils import timezone

from maintenance.hygiene import (
    Oldest,
    candidates,
    eligible_entries,
    may_archive,
    not_kept,
    read_policy,
    scan,
)
from maintenance.hygiene_text import Candidate
from maintenance.pass_tools import PassResult, RunContext, latest, transition, unprotected
from maintenance.plan_status import status_in
from memory import holds, lifecycle
from memory.bulk_insert import chunks
from memory.models import Entry, Workspace
from memory.models.choices import HoldReason, Status
from memory.models.entries import protected
from memory.relationships import neighbour_ids
from memory.scoring_db import refresh_scores


def _requested(ids: Iterable[Any]) -> tuple[list[int], list[Any]]:
    """The requested ids as integers, deduplicated in order, and the values that are not ids."""
    good: dict[int, None] = {}
    bad: list[Any] = []
    for value in ids:
        if isinstance(value, int) and not isinstance(value, bool):
            good.setdefault(value, None)
        elif isinstance(value, str) and value.strip().isdigit():
            good.setdefault(int(value), None)
        else:
            bad.append(value)
    return list(good), bad


def _details(c: Candidate) -> dict[str, Any]:
    return {"score": c.score, "reasons": [r.as_dict() for r in c.reasons]}


def apply(
    workspace: Workspace, ids: Iterable[Any], *, actor: str, now: datetime | None = None
) -> dict[str, list[Any]]:
    """Archive the requested entries that are in a fresh preview (still eligible, score ≥ 2).
    Anything else — unknown ids, other workspaces' ids, no longer eligible — is skipped. One
    transaction: the one status change (``memory.lifecycle``) with each entry's event (reason
    ``hygiene``) carrying its score and reasons."""
    now = now or timezone.now()
    requested, invalid = _requested(ids)
    fresh = {c.id: c for c in candidates(workspace)}
    wanted = [n for n in requested if n in fresh]
    archived: list[int] = []
    if wanted:
        policy, _ = read_policy(workspace)
        with transaction.atomic():
            rows = list(
                eligible_entries(workspace, policy)
                .filter(pk__in=wanted)
                .select_for_update(of=("self",))
                .values_list("pk", flat=True)
            )
            archived = sorted(rows)
            lifecycle.change_status(
                workspace.pk,
                archived,
                Status.ARCHIVED,
                reason="hygiene",
                actor=actor,
                now=now,
                details_of={pk: _details(fresh[pk]) for pk in archived},
            )
        if archived:
            refresh_scores(workspace, now=now, ids=[*archived, *neighbour_ids(archived)])
    done = set(archived)
    return {"archived": archived, "skipped": [i for i in requested if i not in done] + invalid}


def keep(
    workspace: Workspace, ids: Iterable[Any], *, actor: str, now: datetime | None = None
) -> dict[str, list[Any]]:
    """An operator's "keep": the entries leave the queue until their content changes (a new
    version has a new hash), and get an operator hold: no pass archives them."""
    now = now or timezone.now()
    requested, invalid = _requested(ids)
    qs = Entry.objects.filter(workspace=workspace, is_latest=True, pk__in=requested)
    with transaction.atomic():
        kept = sorted(qs.select_for_update().values_list("pk", flat=True))
        Entry.objects.filter(pk__in=kept).update(review_kept_hash=F("content_hash"))
        holds.hold(workspace, kept, reason=HoldReason.KEEP, actor=actor, now=now)
    done = set(kept)
    return {"kept": kept, "skipped": [i for i in requested if i not in done] + invalid}


def _low_quality_picks(ctx: RunContext, qs: QuerySet[Entry], oldest: Oldest) -> dict[int, Candidate]:
    """The entries of ``qs`` hygiene recommends archiving. The ids of those the database scores
    high enough (or has no verdict for: ``hygiene.may_archive``) are read first (one
    statement), then scanned by id: inside a plan the status rule excludes the entries the
    plan moved (``maintenance.plan_status``), an anti-join PostgreSQL would otherwise hash
    again for every batch (0.25 s a batch at 1,000,000 entries). The duplicates' oldest copies are
    read once per content hash for all the chunks (the pass changes no status before it has
    picked): copies of the same few texts came back with every chunk, about 20 rows read per
    candidate (1.2 s of a first run's plan at 1,000,000 entries, and 0.9 s of its apply):
    ``oldest``, shared by the caller's calls."""
    _, patterns = read_policy(ctx.workspace)
    ids = list(may_archive(ctx.workspace, qs, patterns).order_by("pk").values_list("pk", flat=True))
    step = ctx.batch_size * 2
    picks: dict[int, Candidate] = {}
    for start in range(0, len(ids), step):
        chunk = Entry.objects.filter(pk__any_of=ids[start : start + step])
        for c in scan(
            ctx.workspace,
            chunk,
            patterns,
            batch_size=step,
            on_batch=ctx.heartbeat,
            store=not ctx.planning,
            oldest=oldest,
        ):
            if c.recommendation == "archive":
                picks[c.id] = c
    return picks


def low_quality_base(ctx: RunContext) -> QuerySet[Entry]:
    cutoff = ctx.now - timedelta(days=ctx.policy.low_quality_min_age_days)
    return not_kept(latest(ctx).filter(status_in([Status.ACTIVE]), access_count=0, created_at__lt=cutoff))


ONLY_CHUNK = 5000  # ids of ``only`` re-checked per statement


def archive_low_quality(ctx: RunContext, *, only: Iterable[int] | None = None) -> PassResult:
    """Pass 6: entries hygiene recommends archiving (score ≥ 4, never accessed), not kept,
    unprotected, created more than low_quality_min_age_days before the run's ``now``, are
    archived (reason ``low_quality``; each event's details carry the score and reasons).
    ``only``: approving proposals, or a real run's apply walking its plan's ids — the same
    rule, re-checked for those ids alone (some thousands at a time)."""
    # Held entries are scanned too, so that only those hygiene really wanted count as skipped.
    base = low_quality_base(ctx).exclude(_protected_but_holds(ctx))
    oldest: Oldest = {}  # the pass changes no status before every candidate is picked
    if only is None:
        picked = _low_quality_picks(ctx, base, oldest)
    else:
        picked = {}
        for chunk in chunks(sorted(set(only)), ONLY_CHUNK):
            picked.update(_low_quality_picks(ctx, base.filter(pk__any_of=chunk), oldest))
    result = PassResult()
    ids = sorted(picked)
    # One batch to a transition, in the run's thread: the same rule over some thousands of ids
    # with each batch re-checked by the workers (``maintenance.batch_workers``) took ~1 s a
    # batch at 1,000,000 entries (10 s against 3 s for the pass; bench/reports/maintenance.md,
    # "A pass's batches over two connections").
    for chunk in chunks(ids, ctx.batch_size):
        done = transition(
            ctx,
            unprotected(latest(ctx).filter(status_in([Status.ACTIVE]), pk__in=chunk), ctx),
            to_status=Status.ARCHIVED,
            reason="low_quality",
            details_of={i: _details(picked[i]) for i in chunk},
        )
        result.ids += done.ids
    result.values = {i: _details(picked[i]) for i in result.ids}
    result.count = len(result.ids)
    return result


def _protected_but_holds(ctx: RunContext) -> Any:
    return protected(
        now=ctx.now,
        hold_days=ctx.policy.operator_hold_days,
        exclude_tags=ctx.policy.exclude_tags,
        holds=False,
    )
