"""In and Out schemas of the maintenance API's runs, run history, tombstones and backups, and
the base every maintenance schema builds on (``StrictIn``, ``PageIn``, ``ERRORS``).

In schemas forbid unknown keys and are strict (a JSON ``"true"`` is not a boolean and ``"5"`` is
not a number): a maintenance request that does something other than what was typed can remove
data. Run parameters carry the policy ranges as limits and are rejected outside them; a policy
update is clamped into them instead, as every stored policy value is.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any, Literal

from django.utils import timezone
from ninja import Field, Schema
from pydantic import AfterValidator, ConfigDict, StrictBool

from api.schemas import ErrorOut, no_nul  # one error shape, one schema name in the OpenAPI document
from maintenance.models import RunKind, RunStatus, RunTrigger
from maintenance.run_results import bounded_affected
from maintenance.selectors import affected_totals
from memory.models.choices import ID_MAX, OFFSET_MAX, TombstoneReason
from memory.policy import LIMITS

TAG_NAME_MAX = 100
EXCLUDE_TAGS_MAX = 200
TagName = Annotated[str, Field(max_length=TAG_NAME_MAX), AfterValidator(no_nul)]  # PostgreSQL stores no NUL


# Every refusal the API maps into one shape (config/api.py); declared so that clients and the
# schema fuzzer know them.
ERRORS: dict[frozenset[int], type[Schema]] = {frozenset({400, 401, 403, 404, 409, 413, 422, 429}): ErrorOut}


class StrictIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)


# --- paths and lists ----------------------------------------------------------------------------


class IdPath(Schema):
    id: int = Field(ge=1, le=ID_MAX)


class PageIn(Schema):
    limit: int = Field(50, ge=1, le=500)
    offset: int = Field(0, ge=0, le=OFFSET_MAX)


class RunListIn(PageIn):
    kind: RunKind | None = None
    status: RunStatus | None = None


AffectedAction = Literal["archived", "tombstoned", "purged", "proposed_archive", "proposed_tombstone"]


class RunAffectedIn(PageIn):
    action: AffectedAction = Field(
        description="archived, tombstoned or purged (what the run changed), or proposed_archive / "
        "proposed_tombstone (what a propose-mode run proposed)"
    )


class TombstoneListIn(PageIn):
    include_restored: bool = False
    include_purged: bool = False
    reason: TombstoneReason | None = None
    run_id: int | None = Field(None, ge=1, le=ID_MAX)


# --- starting runs -------------------------------------------------------------------------------

QUALITY_KINDS = (RunKind.HYGIENE, RunKind.CONTRADICTIONS, RunKind.CONSOLIDATE)


class RunIn(StrictIn):
    dry_run: StrictBool | None = Field(
        None,
        description="Plan only, change nothing. Defaults to true for agent keys (which may only "
        "dry-run) and false for operators and admins.",
    )
    force: StrictBool = Field(False, description="Apply even when the circuit breaker trips")


class FullRunIn(RunIn):
    kind: Literal["full", "hygiene", "contradictions", "consolidate"] = Field(
        "full", description="full: every maintenance pass in order; or one quality pass alone (after scoring)"
    )


def _limited(name: str) -> Any:
    limit = LIMITS[name]
    return Field(
        None,
        ge=int(limit.low) if limit.integer else limit.low,
        le=int(limit.high) if limit.integer else limit.high,
        allow_inf_nan=False,
        description=f"omitted: the workspace policy ({limit.low:g}..{limit.high:g})",
    )


class PruneIn(RunIn):
    archive_older_than_days: int | None = _limited("archive_older_than_days")
    prune_older_than_days: int | None = _limited("prune_older_than_days")
    hard_delete_older_than_days: int | None = _limited("hard_delete_older_than_days")
    importance_threshold: float | None = _limited("importance_threshold")
    exclude_tags: list[TagName] | None = Field(
        None, max_length=EXCLUDE_TAGS_MAX, description="omitted: the workspace policy's exclude_tags"
    )


# --- run results ---------------------------------------------------------------


class CountsOut(Schema):
    scored: int
    staged_graduated: int
    staged_expired: int
    stale_marked: int
    archived: int
    low_quality_archived: int
    summaries_created: int
    consolidated: int
    pruned: int
    evicted: int
    expired: int
    reclaimed: int
    reclaimed_rows: dict[str, int] = Field(
        default_factory=dict,
        description="Bookkeeping rows the reclaim pass removed, by kind: folded_runs (runs that changed "
        "nothing, folded into per-day counts once a week old), tombstones and lifecycle_events (of "
        "lineages purged longer than audit_retention_days ago), proposals and runs (past the "
        "retention, with nothing left to revert), run_days (per-day counts past the retention); "
        "kinds with nothing removed are left out",
    )
    links_pruned: int
    hard_deleted: int
    disputes_flagged: int
    orphans: int = Field(description="metric: live entries with no active link and importance < 0.2")
    held_skipped: int = Field(
        0, description="metric: entries a pass would have changed but for an operator hold"
    )


class ProposedIdsOut(Schema):
    archive: list[int]
    tombstone: list[int]


def _absent(value: Any) -> bool:
    # Keys a result has only in propose mode are left out otherwise, so the API returns exactly
    # the result object stored on the run.
    return value is None


class AffectedOut(Schema):
    archived: list[int]
    tombstoned: list[int]
    purged: list[int]
    proposed: ProposedIdsOut | None = Field(
        None,
        exclude_if=_absent,
        description="propose mode only: the entries this run proposes to archive or tombstone (it "
        "archived and tombstoned none of them; see GET /proposals)",
    )


class ProposedCountsOut(Schema):
    archive: int
    tombstone: int


class BreakerOut(Schema):
    would_trip: bool = Field(
        description="Approving every tombstone proposal at once would trip the circuit breaker "
        "(approve then needs force)"
    )
    tombstones: int = Field(description="Tombstones proposed by passes 8-11")
    live: int = Field(description="Live entries of the workspace when the run planned")


class RunResultOut(Schema):
    run_id: int
    workspace: str
    kind: str
    dry_run: bool
    status: RunStatus = Field(
        description="succeeded; proposed (propose review mode: the archives and tombstones wait for "
        "an operator's approval, see /proposals); blocked (circuit breaker, nothing changed); skipped "
        "(another run holds the workspace's lease, nothing done); failed (see the run's error)"
    )
    backup_file: str | None
    counts: CountsOut = Field(
        description="What the run changed, or in propose mode would have changed (the proposing "
        "passes' counts are proposals); scored, orphans and held_skipped are metrics, not changes"
    )
    affected: AffectedOut
    proposed: ProposedCountsOut | None = Field(
        None, exclude_if=_absent, description="propose mode only: the proposals this run made, by action"
    )
    breaker: BreakerOut | None = Field(
        None,
        exclude_if=_absent,
        description="propose mode only: the circuit breaker as an approval of everything would meet it",
    )


class RunQueuedOut(Schema):
    """A run handed to the worker (django-q2): follow it at ``url``."""

    run_id: int
    kind: RunKind
    dry_run: bool
    status: RunStatus = Field(description="queued: recorded, waiting for a worker to start it")
    url: str = Field(
        description="GET /maintenance/runs/{id}: its progress while it works, its result once it ended"
    )


class PruneOut(Schema):
    success: bool
    archived_count: int
    pruned_count: int
    hard_deleted_count: int
    backup_file: str | None
    dry_run: bool
    run_id: int
    status: RunStatus


class EvictedOut(Schema):
    id: int
    retention: float
    age_days: float
    access_count: int


class ExpiredOut(Schema):
    id: int
    expired_at: datetime


class DecayOut(Schema):
    dry_run: bool
    candidates_evaluated: int
    evicted: list[EvictedOut]
    expired: list[ExpiredOut]
    hard_deleted: int
    run_id: int
    status: RunStatus


# --- run history ---------------------------------------------------------------------------------


class RunOut(Schema):
    id: int
    kind: RunKind
    trigger: RunTrigger
    dry_run: bool
    forced: bool
    status: RunStatus
    actor: str
    started_at: datetime
    finished_at: datetime | None
    counts: dict[str, int | dict[str, int]] = Field(
        description="The run's counts: one key per pass, plus summaries_created and held_skipped "
        "(reclaimed_rows maps kinds of bookkeeping rows to how many were removed); of a proposed run, "
        "what it would have changed"
    )
    backup_file: str | None
    error: str
    progress: dict[str, Any] = Field(
        description="While it works, where it is: phase (plan, apply; done once it ended), pass "
        "(the count key of the current pass), step and steps (its place among the run's passes), "
        "rows_done (counts of the phase's finished passes, added up), elapsed_s; empty while queued"
    )

    @staticmethod
    def resolve_backup_file(obj: Any) -> str | None:
        return obj.backup_file or None

    @staticmethod
    def resolve_progress(obj: Any) -> dict[str, Any]:
        return obj.progress if isinstance(obj.progress, dict) else {}


class RunDetailOut(RunOut):
    params: dict[str, Any] = Field(description="The effective parameters the run worked with")
    affected: dict[str, Any] = Field(
        description="The first (up to 200) entry ids of each action: archived, tombstoned, purged; a "
        "propose-mode run also has proposed {archive, tombstone} (ids it proposed, not changed). "
        "All of them, paged: GET /maintenance/runs/{id}/affected"
    )
    affected_total: dict[str, int] = Field(
        description="How many entries each action has: archived, tombstoned, purged, "
        "proposed_archive, proposed_tombstone"
    )

    @staticmethod
    def resolve_affected(obj: Any) -> dict[str, Any]:
        return bounded_affected(obj.affected if isinstance(obj.affected, dict) else {})

    @staticmethod
    def resolve_affected_total(obj: Any) -> dict[str, int]:
        return affected_totals(obj)

    result: dict[str, Any] = Field(
        description="The result object as returned when the run ended (RunResultOut for a full or "
        "quality run: counts with held_skipped, and in propose mode proposed {archive, tombstone} "
        "and breaker {would_trip, tombstones, live}); empty while it runs"
    )


class RunAffectedPageOut(Schema):
    count: int = Field(description="How many entries the action has in this run")
    limit: int
    offset: int
    action: AffectedAction
    complete: bool = Field(
        description="False for a dry run's or a proposal's list past the first 200: its record keeps "
        "only those (a dry run changed nothing; a real run's list is always complete)"
    )
    items: list[int] = Field(description="Entry ids, ascending")


class RunPageOut(Schema):
    count: int
    limit: int
    offset: int
    items: list[RunOut]
    folded_runs: int = Field(
        0,
        description="Older runs matching the filters that changed nothing (or were skipped, or were "
        "dry runs), folded into per-day counts a week after they ran: not in items; their counts "
        "per day are at GET /maintenance/runs/folded",
    )


class RunDayOut(Schema):
    day: date = Field(description="The UTC day the runs started")
    kind: RunKind
    status: RunStatus
    dry_run: bool
    runs: int = Field(description="How many such runs started that day")


class RunDayPageOut(Schema):
    count: int
    limit: int
    offset: int
    items: list[RunDayOut]


class RevertOut(Schema):
    run_id: int
    reverted: list[int] = Field(description="Entries put back where the run found them")
    skipped: list[int] = Field(description="Entries changed since (or purged): left alone")
    links_restored: int
    summaries_archived: list[int] = Field(
        default_factory=list, description="Digests the run's compaction wrote, archived again"
    )


# --- tombstones and backups ----------------------------------------------------------------------


class TombstoneOut(Schema):
    id: int
    entry_id: int = Field(description="Kept after the entry is purged")
    lineage_id: int
    content_hash: str
    reason: TombstoneReason
    previous_status: str
    created_at: datetime
    purge_after: datetime
    seconds_until_purge: int | None = Field(
        description="0 when due; null once restored or purged",
    )
    restored_at: datetime | None
    purged_at: datetime | None
    run_id: int | None
    actor: str

    @staticmethod
    def resolve_entry_id(obj: Any) -> int:
        return int(obj.entry_ref)

    @staticmethod
    def resolve_lineage_id(obj: Any) -> int:
        return int(obj.lineage_ref)

    @staticmethod
    def resolve_seconds_until_purge(obj: Any) -> int | None:
        if obj.restored_at is not None or obj.purged_at is not None:
            return None
        return max(0, int((obj.purge_after - timezone.now()).total_seconds()))


class TombstonePageOut(Schema):
    count: int
    limit: int
    offset: int
    items: list[TombstoneOut]


class BackupOut(Schema):
    id: int
    file_name: str
    reason: str
    size_bytes: int
    entry_count: int
    sha256: str
    run_id: int | None
    created_at: datetime


class BackupPageOut(Schema):
    count: int
    limit: int
    offset: int
    items: list[BackupOut]
