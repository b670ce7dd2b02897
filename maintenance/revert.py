"""Reverting automatic changes: one entry's transition, a selection, or a whole run.

Only automatic transitions (made by maintenance) are reverted, and only while the entry is
still where that transition left it and has not been purged. Each revert is itself recorded
as a LifecycleEvent (reason ``revert``, ``reverts`` pointing at the undone event), and the
undone events get ``reverted_at``. Work is set-based: the events are read in one query and
entries are updated per (current, target) status group.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from maintenance import batch_workers, hygiene_rank, rank_triggers
from maintenance.models import MaintenanceRun
from memory import holds, lifecycle
from memory.errors import NotFound
from memory.models import Entry, LifecycleEvent, Relationship, Workspace
from memory.models.choices import HoldReason, Status
from memory.relationships import link_partners
from memory.scoring_db import refresh_scores

log = logging.getLogger(__name__)

REVERTIBLE_TO = (Status.ARCHIVED, Status.TOMBSTONED, Status.STALE)
RUN_REVERT_TO = (Status.ARCHIVED, Status.TOMBSTONED)


def _revertible(workspace: Workspace) -> QuerySet[LifecycleEvent]:
    return LifecycleEvent.objects.filter(
        workspace=workspace,
        automatic=True,
        reverted_at__isnull=True,
        entry__isnull=False,
        to_status__in=REVERTIBLE_TO,
    )


# Ids per lookup query: a statement takes at most 65,535 parameters on PostgreSQL (SQLite's
# limit depends on its build, 32,766 by default), and a run over 1,000,000 entries changes
# hundreds of thousands (bench/maintenance.py: its whole-run revert failed so).
LOOKUP_BATCH = 5000


def _chunked(ids: Iterable[int]) -> Iterable[list[int]]:
    ordered = sorted(set(ids))
    return (ordered[i : i + LOOKUP_BATCH] for i in range(0, len(ordered), LOOKUP_BATCH))


def _latest_ids(workspace: Workspace, entry_ids: Iterable[int]) -> dict[int, int]:
    """Each entry id → the id of its lineage's latest version. An event belongs to the version
    it changed; after a content update the change lives on in the newer version. A latest
    version is its own (most of a run's entries): only the lineages of the others are looked
    up."""
    latest: dict[int, int] = {}
    lineage_of: dict[int, int] = {}
    for chunk in _chunked(entry_ids):
        rows = Entry.objects.filter(workspace=workspace, pk__any_of=chunk)
        for pk, lineage, is_latest in rows.values_list("pk", "lineage_id", "is_latest"):
            if is_latest:
                latest[pk] = pk
            else:
                lineage_of[pk] = lineage or pk
    newest: dict[int, int] = {}
    for chunk in _chunked(lineage_of.values()):
        found = Entry.objects.filter(workspace=workspace, lineage_id__any_of=chunk, is_latest=True)
        newest.update((lineage, pk) for lineage, pk in found.values_list("lineage_id", "pk") if lineage)
    latest.update((pk, newest[lineage]) for pk, lineage in lineage_of.items() if lineage in newest)
    return latest


# Entries reverted per transaction: a revert of a run that tombstoned 250,000 entries holds
# its row locks for one batch at a time, never for the whole revert.
REVERT_BATCH = 2000
# The columns of a LifecycleEvent a revert reads (not the details JSON, not the run row).
EVENT_FIELDS = ("pk", "entry_id", "created_at", "from_status", "to_status", "run_id")


class EventRow(NamedTuple):
    """What a revert reads of an event: a whole-run revert reads hundreds of thousands, and
    a model instance each took 337 MB for 293,232 (a tuple: a tenth of that)."""

    pk: int
    entry_id: int | None
    created_at: datetime
    from_status: str
    to_status: str
    run_id: int | None


Event = LifecycleEvent | EventRow


def revert_events(
    workspace: Workspace, events: Iterable[Event], *, actor: str, now: datetime | None = None
) -> dict[str, Any]:
    """Undo the given automatic events. Per entry, the newest of its events among them must
    match the entry's current status; the entry goes back to the status before the oldest one.
    Returns {"reverted": [entry ids], "skipped": [entry ids]}. Entries are reverted in batches
    of ``REVERT_BATCH``, one transaction each: a revert stopped half-way leaves whole batches
    reverted (their events marked), and reverting again finishes the rest.

    On PostgreSQL, outside a caller's transaction, the batches go over two connections at once
    (``maintenance.batch_workers``): they lock disjoint entries, events and tombstones. The
    scores of the entries linked to one that left the tombstone are refreshed once all batches
    are done (``_rescore_link_ends``), not inside each: two batches refreshing the same
    neighbour could deadlock; after a failed batch, those of the batches committed before it
    are refreshed before the error goes on (a revert stopped by a signal leaves them to the
    next sweep). More entries than a rank fold takes one by one: each batch leaves one
    hygiene-rank mark for the workspace (``rank_triggers.unmarked``), as a run's batches do."""
    now = now or timezone.now()
    events = [e for e in events if e.entry_id is not None]
    latest_of = _latest_ids(workspace, [e.entry_id for e in events if e.entry_id is not None])
    by_entry: dict[int, list[Event]] = defaultdict(list)
    for event in events:
        if event.entry_id in latest_of:
            by_entry[latest_of[event.entry_id]].append(event)
    entry_ids = sorted(by_entry)
    many = len(entry_ids) > hygiene_rank.REBUILD_OVER

    def one_batch(batch: Sequence[int]) -> _Reverted:
        with rank_triggers.unmarked(workspace.pk) if many else transaction.atomic():
            return _revert_batch(workspace, {i: by_entry[i] for i in batch}, actor=actor, now=now)

    batches = [entry_ids[start : start + REVERT_BATCH] for start in range(0, len(entry_ids), REVERT_BATCH)]
    reverted: list[int] = []
    skipped: list[int] = []
    untombed: list[int] = []
    with lifecycle.coalesced():  # open pages hear of the revert once, not once per batch
        try:
            for done in batch_workers.each_batch(batches, one_batch, _nothing):
                reverted += done.reverted
                skipped += done.skipped
                untombed += done.untombed
        except Exception:
            # The batches committed before the failure stay reverted, and reverting again
            # will not see them: their neighbours are rescored now, or never.
            try:
                _rescore_link_ends(workspace, untombed, now=now)
            except Exception:
                log.exception("the link ends of %s reverted entries were not rescored", len(untombed))
            raise
        _rescore_link_ends(workspace, untombed, now=now)
    return {"reverted": sorted(reverted), "skipped": sorted(skipped)}


def _nothing() -> None:
    """A revert holds no lease to renew between its batches."""


class _Reverted(NamedTuple):
    """What one batch reverted and skipped, and which of the reverted left the tombstone."""

    reverted: list[int]
    skipped: list[int]
    untombed: list[int]


def _revert_batch(
    workspace: Workspace, by_entry: dict[int, list[Event]], *, actor: str, now: datetime
) -> _Reverted:
    """One batch, inside the caller's transaction."""
    current = dict(
        Entry.objects.select_for_update()
        .filter(workspace=workspace, pk__any_of=list(by_entry), is_latest=True)
        .order_by("pk")
        .values_list("pk", "status")
    )
    # The newest event of each entry must be the one that put it where it is now: a later
    # manual change (or a later run) wins over an old automatic one.
    newest_any = _newest_event_ids(list(current))
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    undone: list[Event] = []
    reverted, skipped = [], []
    for entry_id, evs in by_entry.items():
        evs.sort(key=lambda e: (e.created_at, e.pk))
        newest, oldest = evs[-1], evs[0]
        if current.get(entry_id) != newest.to_status or newest_any.get(entry_id) != newest.pk:
            skipped.append(entry_id)
            continue
        groups[(newest.to_status, oldest.from_status)].append(entry_id)
        undone.extend(evs)
        reverted.append(entry_id)
    # The operator's decision sticks: the next run must not redo what was just undone. The
    # hold is placed in the same UPDATE as the status (one rewrite of each wide row, not two).
    # Each entry's event names the run and the event it undoes.
    hold = holds.columns(HoldReason.REVERT, actor, now)
    for (was, to_status), ids in groups.items():
        lifecycle.change_status(
            workspace.pk,
            ids,
            to_status,
            reason="revert",
            actor=actor,
            now=now,
            details={"hold": HoldReason.REVERT},
            run_of={entry_id: by_entry[entry_id][-1].run_id for entry_id in ids},  # lists are sorted
            reverts_of={entry_id: by_entry[entry_id][-1].pk for entry_id in ids},
            columns=hold,
            tombstoned=ids if was == Status.TOMBSTONED else [],  # read under the lock above
        )
    if undone:
        LifecycleEvent.objects.filter(pk__any_of=[e.pk for e in undone]).update(reverted_at=now)
    # Out of the tombstone: the links to it count again (their ends rescored by the caller).
    untombed = [i for (was, _), ids in groups.items() if was == Status.TOMBSTONED for i in ids]
    return _Reverted(reverted, skipped, untombed)


def _rescore_link_ends(workspace: Workspace, entry_ids: list[int], *, now: datetime) -> None:
    """Refresh the scores a change of ``entry_ids`` between a counted and an uncounted link end
    (into or out of the tombstone) alters: those of every entry linked to one of them, these
    entries included where they are linked to each other. An entry's own status is no input of
    its own scores, so a revert between counted statuses (archived, stale, active) alters none:
    rewriting each reverted wide row a second time for its scores was a sixth of a whole-run
    revert (bench/reports/maintenance.md)."""
    ends: set[int] = set()
    for chunk in _chunked(entry_ids):
        ends |= link_partners(chunk)
    if ends:
        refresh_scores(workspace, now=now, ids=ends)


def _newest_event_ids(entry_ids: list[int]) -> dict[int, int]:
    """For each latest entry id, the newest event of any version of its lineage."""
    lineage_to_latest = dict(Entry.objects.filter(pk__any_of=entry_ids).values_list("lineage_id", "pk"))
    newest: dict[int, int] = {}
    if not lineage_to_latest:
        return newest
    rows = (
        LifecycleEvent.objects.filter(entry__lineage_id__any_of=list(lineage_to_latest))
        .exclude(reason__in=holds.EVENT_REASONS)  # a hold or release changes no status
        .order_by("created_at", "pk")
        .values_list("entry__lineage_id", "pk")
    )
    for lineage, pk in rows:
        newest[lineage_to_latest[lineage]] = pk  # ascending order: the last one seen is the newest
    return newest


def revert_entry(
    workspace: Workspace, entry_id: int, *, actor: str, now: datetime | None = None
) -> dict[str, Any]:
    """Undo the newest automatic transition of one entry."""
    lineage = (
        Entry.objects.filter(workspace=workspace, pk=entry_id).values_list("lineage_id", flat=True).first()
    )
    event = (
        _revertible(workspace).filter(entry__lineage_id=lineage).order_by("-created_at", "-pk").first()
        if lineage
        else None
    )
    if event is None:
        if not Entry.objects.filter(workspace=workspace, pk=entry_id).exists():
            raise NotFound(f"entry {entry_id} not found")
        return {"reverted": [], "skipped": [entry_id]}
    return revert_events(workspace, [event], actor=actor, now=now)


def revert_selection(
    workspace: Workspace, entry_ids: Iterable[int], *, actor: str, now: datetime | None = None
) -> dict[str, Any]:
    """Undo the newest automatic transition of each selected entry (ids of other workspaces
    are simply not found)."""
    lineages = Entry.objects.filter(workspace=workspace, pk__in=list(entry_ids)).values("lineage_id")
    newest: dict[int, LifecycleEvent] = {}
    for event in (
        _revertible(workspace)
        .filter(entry__lineage_id__in=lineages)
        .select_related("entry")
        .order_by("created_at", "pk")
    ):
        assert event.entry is not None
        newest[event.entry.lineage_id or event.entry.pk] = event
    return revert_events(workspace, newest.values(), actor=actor, now=now)


def revert_run(
    workspace: Workspace, run_id: int, *, actor: str, now: datetime | None = None
) -> dict[str, Any]:
    """Undo everything a run archived or tombstoned that is not purged since, and reactivate
    the links it pruned."""
    run = MaintenanceRun.objects.filter(workspace=workspace, pk=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    now = now or timezone.now()
    with lifecycle.coalesced():  # the reverted entries and the archived digests: one announcement
        return _revert_run(workspace, run, actor=actor, now=now)


def _revert_run(workspace: Workspace, run: MaintenanceRun, *, actor: str, now: datetime) -> dict[str, Any]:
    events = [
        EventRow._make(row)
        for row in _revertible(workspace)
        .filter(run=run, to_status__in=RUN_REVERT_TO)
        .order_by("created_at", "pk")
        .values_list(*EVENT_FIELDS)
        .iterator(chunk_size=LOOKUP_BATCH)
    ]
    result = revert_events(workspace, events, actor=actor, now=now)
    result["summaries_archived"] = _retire_created(workspace, run, actor=actor, now=now)
    pruned = Relationship.objects.filter(workspace=workspace, pruned_by_run=run, pruned_at__isnull=False)
    with transaction.atomic():
        ends = {i for pair in pruned.values_list("from_entry_id", "to_entry_id") for i in pair}
        result["links_restored"] = pruned.update(pruned_at=None, pruned_by_run=None)
        if ends:  # a restored link counts again for both of its ends
            refresh_scores(workspace, now=now, ids=ends)
    result["run_id"] = run.pk
    return result


def _retire_created(workspace: Workspace, run: MaintenanceRun, *, actor: str, now: datetime) -> list[int]:
    """Entries the run wrote (compaction digests) are archived again — never deleted — when
    the run is reverted, as long as nobody has changed them since (still the latest version,
    still live)."""
    created = {
        e.entry_id: e
        for e in LifecycleEvent.objects.filter(
            workspace=workspace, run=run, from_status="", automatic=True, reverted_at__isnull=True
        )
    }
    if not created:
        return []
    with transaction.atomic():
        rows = list(
            Entry.objects.select_for_update()
            .filter(
                workspace=workspace,
                pk__in=list(created),
                is_latest=True,
                status__in=[Status.ACTIVE, Status.STALE],
            )
            .values_list("pk", flat=True)
        )
        ids = sorted(rows)
        lifecycle.change_status(
            workspace.pk,
            ids,
            Status.ARCHIVED,
            reason="revert",
            actor=actor,
            now=now,
            run_id=run.pk,
            reverts_of={pk: created[pk].pk for pk in ids},
        )
        LifecycleEvent.objects.filter(pk__in=[created[pk].pk for pk in ids]).update(reverted_at=now)
        # Active or stale to archived: every link end stays counted, no score changes.
    return sorted(ids)
