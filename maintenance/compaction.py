"""Compaction (pass 7): many small notes of one work session become one digest.

A group of more than ``consolidation_min_group`` latest live development notes and test
entries of one (project, session_key), older than ``consolidation_min_age_days`` and that
automation may archive, becomes one deterministic ``retrospective`` digest (source
``platform``) linked ``evolves_from`` to every fragment; the fragments are archived. Nothing
is deleted and the run's revert undoes it all; notes without a session key are never
grouped; the groups are written in parts of whole groups, each part a constant number of
queries. Details: docs/quality.md
("Compaction").
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connection, transaction
from django.db.models import Count

from maintenance.pass_tools import (
    PassResult,
    RunContext,
    held_only,
    importance_of,
    latest,
    transition,
    unprotected,
)
from maintenance.plan_status import status_in
from memory.bulk_insert import NewEntry, insert_entries
from memory.models import Entry, Relationship
from memory.models.choices import CONTENT_MAX, TITLE_MAX, EntryType, RelationshipType, Source, Status
from memory.scoring_db import refresh_scores
from memory.write_input import content_hash

FRAGMENT_TYPES = (EntryType.TEST_ENTRY, EntryType.DEVELOPMENT_NOTE)
LINE_MAX = 240  # characters of a fragment's first line kept in the digest
REASON = "compact"
# Groups to compact: ((project, session_key), their fragments' rows), in order.
Groups = list[tuple[tuple[str, str], list[dict[str, Any]]]]
_ROW = ("pk", "title", "created_at", "run_importance", "entry_type")


def _candidates(ctx: RunContext, only: list[int] | None) -> Any:
    cutoff = ctx.now - timedelta(days=ctx.policy.consolidation_min_age_days)
    # One array of ids on PostgreSQL, whatever their number (``pk__in`` sends one parameter each).
    qs = latest(ctx) if only is None else latest(ctx).filter(pk__any_of=only)
    return qs.filter(
        status_in([Status.ACTIVE, Status.STALE]),
        entry_type__in=FRAGMENT_TYPES,
        created_at__lt=cutoff,
    ).exclude(session_key="")


def fragments(ctx: RunContext, only: list[int] | None = None) -> Any:
    # Held fragments count as skipped only in a group that is compacted (see compact).
    return unprotected(_candidates(ctx, only), ctx, note_held=False)


def compact(ctx: RunContext, *, only: list[int] | None = None) -> PassResult:
    """Pass 7. ``count``/``ids`` are the archived fragments; ``extra`` carries
    ``summaries_created``. ``only``: approving proposals — the same rule over those fragments
    alone (a group that has shrunk to the minimum or below is left as it is)."""
    counted = fragments(ctx, only).values("project", "session_key").annotate(n=Count("pk"))
    if connection.vendor == "postgresql":
        # Each group's fragment ids with its count: the rows are then read by id, where reading
        # them by project and session scanned the workspace's fragments again (no index leads
        # with either; 0.8 s of a first run's plan at 1,000,000 entries).
        counted = counted.annotate(ids=ArrayAgg("pk"))
    groups = list(counted.filter(n__gt=ctx.policy.consolidation_min_group).order_by("project", "session_key"))
    result = PassResult(also={"summaries_created": 0})
    summaries: list[int] = []
    keys = {(g["project"], g["session_key"]) for g in groups}
    # The groups' fragments by id (PostgreSQL); a held one is not among them (``fragments``
    # leaves it out), so the held are still looked for among ``only``.
    among = sorted(pk for g in groups for pk in g["ids"]) if groups and "ids" in groups[0] else only
    members = _group_rows(ctx, among, keys)
    held = _held_by_group(ctx, only, keys)
    chosen: Groups = []
    for group in groups:
        key = (group["project"], group["session_key"])
        rows = members.get(key, [])
        if len(rows) <= ctx.policy.consolidation_min_group:
            continue  # changed since the count: leave it for the next run
        ctx.held.update(held.get(key, ()))
        chosen.append((key, rows))
    for part in _parts(chosen, ctx.batch_size):
        fragment_rows = [r for _, rows in part for r in rows]
        _add_content(fragment_rows)
        with transaction.atomic():
            written = _write_summaries(ctx, part)
            archived = transition(
                ctx,
                # The part's fragments are among ``only`` already: a second id list beside it
                # made PostgreSQL count an index probe per pair of ids and scan the table.
                fragments(ctx).filter(pk__in=[r["pk"] for r in fragment_rows]),
                to_status=Status.ARCHIVED,
                reason=REASON,
                # One transaction for the part: its row locks in id order.
                spread=False,
            )
        summaries += written
        result.ids += archived.ids
        ctx.heartbeat()
    result.ids.sort()  # in id order, as every pass reports them
    if summaries:
        refresh_scores(ctx.workspace, now=ctx.now, params=ctx.policy.decay_params, ids=summaries)
    result.count = len(result.ids)
    result.also["summaries_created"] = len(summaries)
    return result


def _parts(chosen: Groups, size: int) -> list[Groups]:
    """The groups to compact, in order, as parts of whole groups of about ``size`` fragments
    (a larger group is a part of its own): each part is written in one transaction, with a
    constant number of statements. One transaction per group took 11 statements per group,
    about 3 s of a plan at 1,000,000 entries for 96 groups (bench/reports/maintenance.md,
    "Compaction writes whole groups in parts")."""
    parts: list[Groups] = []
    fill = 0
    for group in chosen:
        if not parts or fill + len(group[1]) > size:
            parts.append([])
            fill = 0
        parts[-1].append(group)
        fill += len(group[1])
    return parts


def _around(qs: Any, keys: set[tuple[str, str]]) -> Any:
    """``qs`` narrowed to the projects and session keys of ``keys`` (a superset of the groups:
    the caller keeps the rows whose pair is one of them)."""
    return qs.filter(
        project__in=sorted({project for project, _ in keys}),
        session_key__in=sorted({session for _, session in keys}),
    )


def _group_rows(
    ctx: RunContext, only: list[int] | None, keys: set[tuple[str, str]]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The fragments of every group to compact, in digest order (most important first, ties
    oldest first), by (project, session_key), without their content (``_add_content`` reads
    it one part of groups at a time): one statement. (One per group scanned the workspace each time:
    no index leads with the session key, so the cost grew with the groups times the workspace;
    bench/reports/maintenance.md, section "Capped counts, one-read compaction, set-based
    records", item 2.)"""
    members: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in keys}
    if not keys:
        return members
    rows = (
        _around(fragments(ctx, only), keys)
        .annotate(run_importance=importance_of(ctx))
        .order_by("project", "session_key", "-run_importance", "created_at", "pk")
        .values(*_ROW, "project", "session_key")
    )
    for r in rows.iterator(chunk_size=2000):
        key = (r.pop("project"), r.pop("session_key"))
        if key in members:
            members[key].append({**r, "importance": r.pop("run_importance")})
    return members


def _add_content(rows: list[dict[str, Any]]) -> None:
    """The content of the fragments ``rows`` names, by id (one statement)."""
    content = dict(Entry.objects.filter(pk__in=[r["pk"] for r in rows]).values_list("pk", "content"))
    for r in rows:
        r["content"] = content.get(r["pk"], "")


def _held_by_group(
    ctx: RunContext, only: list[int] | None, keys: set[tuple[str, str]]
) -> dict[tuple[str, str], list[int]]:
    """The fragments of each group that only an operator hold keeps out: one statement."""
    held: dict[tuple[str, str], list[int]] = {}
    if not keys:
        return held
    rows = _around(held_only(_candidates(ctx, only), ctx), keys).values_list("pk", "project", "session_key")
    for pk, project, session in rows:
        if (project, session) in keys:
            held.setdefault((project, session), []).append(pk)
    return held


def _write_summaries(ctx: RunContext, part: Groups) -> list[int]:
    """The retrospective of each group of ``part``, linked ``evolves_from`` to its fragments;
    returns their ids in the part's order."""
    new: list[NewEntry] = []
    for (project, session_key), rows in part:
        title, content = digest(project, session_key, rows)
        row = {
            "title": title,
            "content": content,
            "content_hash": content_hash(content),
            "project": project,
            "session_key": session_key,
            "entry_type": EntryType.RETROSPECTIVE,
            "source": Source.PLATFORM,
            "status": Status.ACTIVE,
            "status_changed_at": ctx.now,
            "created_at": ctx.now,
            "updated_at": ctx.now,
            "metadata": {"compacted_by_run": ctx.run_id, "fragments": len(rows)},
        }
        event = {
            "reason": REASON,
            "run_id": ctx.run_id,
            "actor": ctx.actor,
            "automatic": True,
            "details": {"fragments": [r["pk"] for r in rows]},
        }
        new.append(NewEntry(row=row, event=event))
    summaries = insert_entries(ctx.workspace, new, now=ctx.now)
    Relationship.objects.bulk_create(
        Relationship(
            workspace=ctx.workspace,
            from_entry_id=summary,
            to_entry_id=r["pk"],
            type=RelationshipType.EVOLVES_FROM,
            created_at=ctx.now,
        )
        for summary, (_, rows) in zip(summaries, part, strict=True)
        for r in rows
    )
    return summaries


def digest(project: str, session_key: str, rows: list[dict[str, Any]]) -> tuple[str, str]:
    """Title and content of the retrospective of ``rows`` (already in digest order: most
    important first). Deterministic: the same fragments give the same text."""
    first = min(r["created_at"] for r in rows)
    last = max(r["created_at"] for r in rows)
    where = f"session {session_key}" + (f" of project {project}" if project else "")
    title = f"Retrospective: {where}"[:TITLE_MAX]
    kinds = sorted({r["entry_type"].replace("_", " ") for r in rows})
    head = [
        f"Retrospective of {where}.",
        f"{len(rows)} {' and '.join(kinds)} fragments from {_day(first)} to {_day(last)}, "
        "most important first; each one is linked (evolves_from) and kept archived.",
        "",
    ]
    lines = [f"- {_day(r['created_at'])} [{r['importance']:.2f}] #{r['pk']}: {_first_line(r)}" for r in rows]
    content = "\n".join(head + lines)
    if len(content) > CONTENT_MAX:
        kept: list[str] = []
        budget = CONTENT_MAX - sum(len(h) + 1 for h in head) - 100
        for line in lines:
            if budget - (len(line) + 1) < 0:
                break
            kept.append(line)
            budget -= len(line) + 1
        more = len(lines) - len(kept)
        content = "\n".join([*head, *kept, f"… and {more} more fragments (see the evolves_from links)."])
    return title, content


def _first_line(row: dict[str, Any]) -> str:
    text = (row["title"] or "").strip() or next(
        (line.strip() for line in row["content"].splitlines() if line.strip()), ""
    )
    text = " ".join(text.split())
    return text if len(text) <= LINE_MAX else text[: LINE_MAX - 1] + "…"


def _day(moment: datetime) -> str:
    return moment.date().isoformat()
