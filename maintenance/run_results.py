"""What a run reports: its counts, its outcome and affected ids, the breaker's rule, the policy
it runs with, and the result shapes of the prune and decay endpoints.

The result goes to the caller whole; the run's row keeps at most ``AFFECTED_KEPT`` ids per list
(the true lengths in ``affected_total``): a real run's complete lists are its LifecycleEvents
(``maintenance.selectors.AffectedIds``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from maintenance.models import RunStatus
from maintenance.pass_tools import PassResult
from memory.models import Entry, Workspace
from memory.models.choices import LISTED_STATUSES
from memory.policy import PolicyValues, clamp_value, clean_tags
from memory.policy_model import MaintenancePolicy

COUNT_KEYS = (
    "scored",
    "staged_graduated",
    "staged_expired",
    "stale_marked",
    "archived",
    "low_quality_archived",
    "summaries_created",
    "consolidated",
    "pruned",
    "evicted",
    "expired",
    "reclaimed",
    "reclaimed_rows",
    "links_pruned",
    "hard_deleted",
    "disputes_flagged",
    "orphans",
    "held_skipped",
)
# The one count that is a mapping: bookkeeping rows the reclaim pass removed, by kind
# (``maintenance.bookkeeping``; kinds with nothing removed are left out).
ROWS_KEY = "reclaimed_rows"
# Counts that are measurements, not changes: shown apart from what a run changed.
METRICS = ("scored", "orphans", "held_skipped")
TOMBSTONING = ("pruned", "evicted", "expired", "reclaimed")
DESTRUCTIVE = (*TOMBSTONING, "links_pruned", "hard_deleted")
BREAKER_MIN_ENTRIES = 20  # the breaker never trips for 20 tombstones or fewer
PRUNE_PARAMS = (
    "archive_older_than_days",
    "prune_older_than_days",
    "hard_delete_older_than_days",
    "importance_threshold",
    "exclude_tags",
)


ARCHIVING = ("staged_expired", "archived", "low_quality_archived", "consolidated")
# The passes that, in propose mode, record proposals instead of changing entries.
PROPOSING = (*ARCHIVING, *TOMBSTONING)


def rows_done(counts: dict[str, Any]) -> int:
    """The rows a run's recorded counts (its row's JSON) add up to; ``reclaimed_rows`` is a
    count per kind of row."""
    return sum(sum(v.values()) if isinstance(v, dict) else v for v in counts.values())


def empty_counts() -> dict[str, Any]:
    return Outcome().recorded_counts()


@dataclass
class Outcome:
    """Counts, affected ids and details of one execution of the passes."""

    # Every count but the bookkeeping rows, which are counted by kind apart.
    counts: dict[str, int] = field(default_factory=lambda: {key: 0 for key in COUNT_KEYS if key != ROWS_KEY})
    reclaimed_rows: dict[str, int] = field(default_factory=dict)
    ids: dict[str, list[int]] = field(default_factory=dict)  # per count key, the ids it changed
    values: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    # Per count key, the per-row details its pass reported (``evicted``, ``expired``).
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    evaluated: int = 0  # candidates a decay sweep read
    held: set[int] = field(default_factory=set)
    # A propose-mode outcome: the proposing passes' counts are proposals, nothing they name
    # was changed.
    proposed: bool = False

    def add(self, key: str, result: PassResult) -> None:
        for kind, n in result.reclaimed_rows.items():
            self.reclaimed_rows[kind] = self.reclaimed_rows.get(kind, 0) + n
        if key == ROWS_KEY:
            return
        self.counts[key] += result.count
        for other, n in result.also.items():
            self.counts[other] += n
        self.ids.setdefault(key, []).extend(result.ids)
        self.values.setdefault(key, {}).update(result.values)
        if result.rows:
            self.rows.setdefault(key, []).extend(result.rows)
        self.evaluated += result.evaluated

    def rows_done(self) -> int:
        """The rows the passes so far changed or counted."""
        return sum(self.counts.values()) + sum(self.reclaimed_rows.values())

    def recorded_counts(self) -> dict[str, Any]:
        """The counts as a run records and answers them, in ``COUNT_KEYS`` order:
        ``reclaimed_rows`` a mapping of kind to rows, every other count a number."""
        return {key: dict(self.reclaimed_rows) if key == ROWS_KEY else self.counts[key] for key in COUNT_KEYS}

    @property
    def affected(self) -> dict[str, Any]:
        """The entries changed; a propose-mode outcome changed none by archive or tombstone
        (only purges past grace) and names what it proposed instead."""
        archived = sorted(i for k in ARCHIVING for i in self.ids.get(k, []))
        tombstoned = sorted(i for k in TOMBSTONING for i in self.ids.get(k, []))
        purged = sorted(self.ids.get("hard_deleted", []))
        if self.proposed:
            return {
                "archived": [],
                "tombstoned": [],
                "purged": purged,
                "proposed": {"archive": archived, "tombstone": tombstoned},
            }
        return {"archived": archived, "tombstoned": tombstoned, "purged": purged}

    @property
    def proposals(self) -> dict[str, int]:
        return {
            "archive": sum(self.counts[k] for k in ARCHIVING),
            "tombstone": sum(self.counts[k] for k in TOMBSTONING),
        }

    @property
    def tombstones(self) -> int:
        return sum(self.counts[k] for k in TOMBSTONING)

    @property
    def destructive(self) -> int:
        return sum(self.counts[k] for k in DESTRUCTIVE)


def effective_policy(workspace: Workspace, params: dict[str, Any] | None) -> PolicyValues:
    """The policy read fresh from the database, with the caller's overrides (clamped too)."""
    policy = MaintenancePolicy.for_workspace(workspace)
    overrides: dict[str, Any] = {}
    for name, value in (params or {}).items():
        if value is None:
            continue
        if name == "exclude_tags":
            # The caller's tags add to the policy's: a request can protect more, never less.
            overrides[name] = tuple(dict.fromkeys([*policy.exclude_tags, *clean_tags(value)]))
        elif hasattr(policy, name):
            overrides[name] = clamp_value(name, value)
    return replace(policy, **overrides)


def live_count(workspace: Workspace) -> int:
    return Entry.objects.filter(
        workspace=workspace,
        is_latest=True,
        status__in=LISTED_STATUSES,
    ).count()


def breaker_trips(outcome: Outcome, live: int, policy: PolicyValues) -> bool:
    """Passes 8–11 would tombstone more than max_tombstone_fraction of the live entries (and
    more than 20 entries)."""
    return tombstones_trip(outcome.tombstones, live, policy)


def tombstones_trip(n: int, live: int, policy: PolicyValues) -> bool:
    """The circuit breaker's rule for ``n`` tombstones among ``live`` entries (runs and approvals)."""
    return n > BREAKER_MIN_ENTRIES and live > 0 and n / live > policy.max_tombstone_fraction


# A run keeps on its row at most this many entry ids per action (``affected``, and the ids of
# a decay sweep's ``sweep`` lists in ``result``): the row that every run list reads stays small
# however much the run changed. The complete lists of a real run are its LifecycleEvents
# (``maintenance.selectors.run_affected``); a dry run changed nothing and records only these.
AFFECTED_KEPT = 200
AFFECTED_LISTS = ("archived", "tombstoned", "purged", "proposed_archive", "proposed_tombstone")


def affected_lists(affected: dict[str, Any]) -> dict[str, list[int]]:
    """The five id lists of an ``affected`` object, flat: archived, tombstoned, purged,
    proposed_archive, proposed_tombstone (missing ones empty)."""
    found_proposed = affected.get("proposed")
    proposed: dict[str, Any] = found_proposed if isinstance(found_proposed, dict) else {}
    found = {
        "archived": affected.get("archived"),
        "tombstoned": affected.get("tombstoned"),
        "purged": affected.get("purged"),
        "proposed_archive": proposed.get("archive"),
        "proposed_tombstone": proposed.get("tombstone"),
    }
    return {k: [i for i in v if isinstance(i, int)] if isinstance(v, list) else [] for k, v in found.items()}


def bounded_affected(affected: dict[str, Any]) -> dict[str, Any]:
    """``affected`` with every id list cut to its first AFFECTED_KEPT ids (rows recorded before
    runs kept a bounded sample can hold every id)."""
    return {
        key: {k: ids[:AFFECTED_KEPT] if isinstance(ids, list) else ids for k, ids in value.items()}
        if isinstance(value, dict)
        else value[:AFFECTED_KEPT]
        if isinstance(value, list)
        else value
        for key, value in affected.items()
    }


def stored_result(result: dict[str, Any]) -> dict[str, Any]:
    """The result object as kept on the row: its id lists cut to AFFECTED_KEPT (the true
    lengths are the row's ``affected_total``; a sweep's counts are its result's
    ``hard_deleted`` and the run's counts)."""
    stored = {**result, "affected": bounded_affected(result["affected"])}
    sweep = result.get("sweep")
    if isinstance(sweep, dict):
        stored["sweep"] = {
            **sweep,
            "evicted": sweep["evicted"][:AFFECTED_KEPT],
            "expired": sweep["expired"][:AFFECTED_KEPT],
        }
    return stored


def decay_result(result: dict[str, Any]) -> dict[str, Any]:
    """A decay sweep's result as POST /maintenance/sweep-decay and ``sweep_decay --json`` return it."""
    sweep = result.get("sweep") or {"candidates_evaluated": 0, "evicted": [], "expired": []}
    return {
        "dry_run": result["dry_run"],
        "candidates_evaluated": sweep["candidates_evaluated"],
        "evicted": sweep["evicted"],
        "expired": sweep["expired"],
        "hard_deleted": result["counts"]["hard_deleted"],
        "run_id": result["run_id"],
        "status": result["status"],
    }


def prune_result(result: dict[str, Any]) -> dict[str, Any]:
    """A prune run's result as POST /maintenance/prune and ``prune --json`` return it."""
    counts = result["counts"]
    return {
        "success": result["status"] in (RunStatus.SUCCEEDED, RunStatus.PROPOSED),
        "archived_count": counts["archived"],
        "pruned_count": counts["pruned"],
        "hard_deleted_count": counts["hard_deleted"],
        "backup_file": result["backup_file"],
        "dry_run": result["dry_run"],
        "run_id": result["run_id"],
        "status": result["status"],
    }
