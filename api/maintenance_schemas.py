"""In and Out schemas of the maintenance API, one per direction.

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
from pydantic import AfterValidator, ConfigDict, StrictBool, model_validator

from api.schemas import ErrorOut, no_nul  # one error shape, one schema name in the OpenAPI document
from maintenance.models import ProposalAction, RunKind, RunStatus, RunTrigger
from maintenance.proposals import ACTIONS
from maintenance.run_results import bounded_affected
from memory.models import ID_MAX, TombstoneReason
from memory.policy import LIMITS, PROPOSE, REVIEW_MODES

OFFSET_MAX = 1_000_000_000
TAG_NAME_MAX = 100
EXCLUDE_TAGS_MAX = 200
TagName = Annotated[str, Field(max_length=TAG_NAME_MAX), AfterValidator(no_nul)]  # PostgreSQL stores no NUL
RESIDUE_PATTERNS_MAX = 50
RESIDUE_PATTERN_MAX = 200


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
        from maintenance.selectors import affected_totals

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


# --- policy --------------------------------------------------------------------------------------


def _range(name: str) -> str:
    limit = LIMITS[name]
    return f"default {limit.default:g}, range {limit.low:g}..{limit.high:g}"


def _setting_in(name: str) -> Any:
    return Field(None, allow_inf_nan=False, description=_range(name) + "; clamped into the range")


def _setting_out(name: str) -> Any:
    return Field(description=_range(name))


ReviewMode = Literal["propose", "apply"]
assert set(REVIEW_MODES) == set(ReviewMode.__args__)  # type: ignore[attr-defined]
REVIEW_MODE_HELP = (
    f"default {PROPOSE}; propose: archives and tombstones wait for an operator's approval (GET "
    "/proposals); apply: automation applies them at once"
)


class PolicyIn(StrictIn):
    """Every policy setting, each optional: omitted or null leaves it as it is.
    Out-of-range values are clamped into the setting's range."""

    importance_threshold: float | None = _setting_in("importance_threshold")
    archive_older_than_days: int | None = _setting_in("archive_older_than_days")
    prune_older_than_days: int | None = _setting_in("prune_older_than_days")
    hard_delete_older_than_days: int | None = _setting_in("hard_delete_older_than_days")
    decay_lambda: float | None = _setting_in("decay_lambda")
    decay_sigma: float | None = _setting_in("decay_sigma")
    decay_mu: float | None = _setting_in("decay_mu")
    salience_default: float | None = _setting_in("salience_default")
    cold_threshold: float | None = _setting_in("cold_threshold")
    breadth_weight: float | None = _setting_in("breadth_weight")
    tombstone_grace_days: int | None = _setting_in("tombstone_grace_days")
    decay_interval_seconds: int | None = _setting_in("decay_interval_seconds")
    maintenance_interval_hours: int | None = _setting_in("maintenance_interval_hours")
    stale_after_days: int | None = _setting_in("stale_after_days")
    archive_after_days: int | None = _setting_in("archive_after_days")
    reclaim_archived_after_days: int | None = _setting_in("reclaim_archived_after_days")
    low_quality_min_age_days: int | None = _setting_in("low_quality_min_age_days")
    contradiction_batch: int | None = _setting_in("contradiction_batch")
    contradiction_max_flags: int | None = _setting_in("contradiction_max_flags")
    consolidation_min_group: int | None = _setting_in("consolidation_min_group")
    consolidation_min_age_days: int | None = _setting_in("consolidation_min_age_days")
    max_tombstone_fraction: float | None = _setting_in("max_tombstone_fraction")
    backups_keep: int | None = _setting_in("backups_keep")
    operator_hold_days: int | None = _setting_in("operator_hold_days")
    audit_retention_days: int | None = _setting_in("audit_retention_days")
    review_mode: ReviewMode | None = Field(None, description=REVIEW_MODE_HELP)
    exclude_tags: list[TagName] | None = Field(
        None, max_length=EXCLUDE_TAGS_MAX, description="Tags no pass may touch"
    )
    residue_patterns: list[Annotated[str, Field(max_length=RESIDUE_PATTERN_MAX)]] | None = Field(
        None,
        max_length=RESIDUE_PATTERNS_MAX,
        description="Hygiene implementation_residue patterns: case-insensitive regular expressions, "
        "or `<source-path>` for the built-in bare source path detector; [] restores the defaults",
    )


class PolicyOut(Schema):
    """The effective (clamped) policy of the workspace; the next run reads it."""

    importance_threshold: float = _setting_out("importance_threshold")
    archive_older_than_days: int = _setting_out("archive_older_than_days")
    prune_older_than_days: int = _setting_out("prune_older_than_days")
    hard_delete_older_than_days: int = _setting_out("hard_delete_older_than_days")
    decay_lambda: float = _setting_out("decay_lambda")
    decay_sigma: float = _setting_out("decay_sigma")
    decay_mu: float = _setting_out("decay_mu")
    salience_default: float = _setting_out("salience_default")
    cold_threshold: float = _setting_out("cold_threshold")
    breadth_weight: float = _setting_out("breadth_weight")
    tombstone_grace_days: int = _setting_out("tombstone_grace_days")
    decay_interval_seconds: int = _setting_out("decay_interval_seconds")
    maintenance_interval_hours: int = _setting_out("maintenance_interval_hours")
    stale_after_days: int = _setting_out("stale_after_days")
    archive_after_days: int = _setting_out("archive_after_days")
    reclaim_archived_after_days: int = _setting_out("reclaim_archived_after_days")
    low_quality_min_age_days: int = _setting_out("low_quality_min_age_days")
    contradiction_batch: int = _setting_out("contradiction_batch")
    contradiction_max_flags: int = _setting_out("contradiction_max_flags")
    consolidation_min_group: int = _setting_out("consolidation_min_group")
    consolidation_min_age_days: int = _setting_out("consolidation_min_age_days")
    max_tombstone_fraction: float = _setting_out("max_tombstone_fraction")
    backups_keep: int = _setting_out("backups_keep")
    operator_hold_days: int = _setting_out("operator_hold_days")
    audit_retention_days: int = _setting_out("audit_retention_days")
    review_mode: ReviewMode = Field(description=REVIEW_MODE_HELP)
    exclude_tags: list[str]
    residue_patterns: list[str] = Field(description="Stored hygiene residue patterns; [] = the built-in ones")
    updated_at: datetime | None


# --- stats ---------------------------------------------------------------------------------------


class EntryCountsOut(Schema):
    staged: int
    active: int
    stale: int
    archived: int
    tombstoned: int
    total: int


class LinkCountsOut(Schema):
    active: int
    pruned: int


class AnchorCountsOut(Schema):
    valid: int
    stale: int
    invalidated: int


class LastRunOut(Schema):
    id: int
    status: RunStatus
    dry_run: bool
    trigger: RunTrigger
    started_at: datetime
    finished_at: datetime | None


class LastRunsOut(Schema):
    full: LastRunOut | None
    prune: LastRunOut | None
    decay: LastRunOut | None
    hygiene: LastRunOut | None
    contradictions: LastRunOut | None
    consolidate: LastRunOut | None


class StatsOut(Schema):
    workspace: str
    entries: EntryCountsOut = Field(description="Latest versions by status")
    tags: int
    links: LinkCountsOut
    anchors: AnchorCountsOut
    open_tombstones: int
    open_disputes: int
    last_runs: LastRunsOut = Field(description="The last started run of each kind")
    policy: PolicyOut


# --- hygiene and disputes ----------------------------------------------------

IDS_MAX = 500


class HygieneReasonOut(Schema):
    code: str
    points: int
    detail: str


class HygieneCandidateOut(Schema):
    id: int
    title: str
    content_excerpt: str
    entry_type: str
    source: str
    created_at: datetime
    access_count: int
    score: int
    reasons: list[HygieneReasonOut]
    recommendation: Literal["archive", "review"]


class HygienePageOut(Schema):
    count: int
    limit: int
    offset: int
    candidates: list[HygieneCandidateOut]


class IdsIn(StrictIn):
    ids: list[Annotated[int, Field(ge=1, le=ID_MAX)]] = Field(min_length=1, max_length=IDS_MAX)


class HygieneApplyOut(Schema):
    archived: list[int] = Field(description="Archived: they were candidates of a fresh preview")
    skipped: list[int] = Field(description="Not candidates (any more), or not found: left alone")


class HygieneKeepOut(Schema):
    kept: list[int] = Field(description="Hidden from the queue until their content changes")
    skipped: list[int]


class DisputeListIn(PageIn):
    status: Literal["open", "resolved"] | None = None


class DisputeEntryOut(Schema):
    id: int
    title: str
    content: str
    status: str
    entry_type: str
    tier: str
    importance: float
    created_at: datetime


class DisputeOut(Schema):
    id: int
    kind: str
    similarity: float
    detected_by: str
    status: str
    resolution: str | None = Field(description="keep_both, keep_first, keep_second or supersede")
    resolved_by: str | None
    resolved_at: datetime | None
    run_id: int | None
    created_at: datetime
    entry_a: DisputeEntryOut = Field(description="The first of the pair (the lower id)")
    entry_b: DisputeEntryOut
    details: dict[str, Any]

    @staticmethod
    def resolve_resolution(obj: Any) -> str | None:
        return obj.resolution or None

    @staticmethod
    def resolve_resolved_by(obj: Any) -> str | None:
        return obj.resolved_by or None


class DisputePageOut(Schema):
    count: int
    limit: int
    offset: int
    items: list[DisputeOut]


class ResolveIn(StrictIn):
    resolution: Literal["keep_both", "keep_first", "keep_second", "supersede"] = Field(
        description="keep_both: nothing changes; keep_first / keep_second: the other entry is "
        "archived (restorable); supersede: the winner links `supersedes` to the loser, which "
        "is archived"
    )
    winner_id: int | None = Field(
        None, ge=1, le=ID_MAX, description="supersede only: one of the pair (default: the newer)"
    )


class ResolveOut(Schema):
    dispute: DisputeOut
    archived: list[int] = Field(description="Entries the resolution archived")


# --- proposals ---------------------------------------------------------------------

ProposalReason = Literal[
    "staged_expired",
    "archived",
    "low_quality_archived",
    "consolidated",
    "pruned",
    "evicted",
    "expired",
    "reclaimed",
]
assert set(ProposalReason.__args__) == set(ACTIONS)  # type: ignore[attr-defined]
REASON_HELP = "The count key of the pass that proposed it: " + ", ".join(ACTIONS)


class ProposalListIn(PageIn):
    reason: ProposalReason | None = Field(None, description=REASON_HELP)
    action: ProposalAction | None = None


class ProposalOut(Schema):
    entry_id: int
    action: ProposalAction
    reason: str = Field(description=REASON_HELP)
    reason_label: str
    values: dict[str, Any] = Field(description="The values that decided it (e.g. retention, cold_threshold)")
    why: str = Field(description="The deciding values in words")
    run_id: int = Field(description="The run that proposed it (the latest that still proposes it)")
    created_at: datetime
    title: str
    content_excerpt: str
    entry_status: str | None = Field(description="The entry's status now; null once purged")


class ProposalPageOut(Schema):
    count: int
    limit: int
    offset: int
    items: list[ProposalOut]


class ProposalDecisionIn(StrictIn):
    """``{"ids": [entry ids]}``, or ``{"all": true}`` with an optional ``reason``."""

    ids: list[Annotated[int, Field(ge=1, le=ID_MAX)]] | None = Field(
        None, min_length=1, max_length=IDS_MAX, description="Entry ids whose open proposals to decide"
    )
    all: StrictBool = Field(False, description="Every open proposal (of ``reason``, if given)")
    reason: ProposalReason | None = Field(None, description="With all: only this reason's proposals")

    @model_validator(mode="after")
    def _one_selection(self) -> ProposalDecisionIn:
        if self.all == (self.ids is not None):
            raise ValueError('give either "ids" or "all": true')
        if self.reason is not None and not self.all:
            raise ValueError('"reason" selects with "all": true; with "ids" name the entries only')
        return self


class ProposalApproveIn(ProposalDecisionIn):
    force: StrictBool = Field(
        False, description="Approve even when the tombstones would trip the circuit breaker"
    )


class SkippedOut(Schema):
    id: int = Field(description="The entry id")
    why: str


class ProposalApproveOut(Schema):
    applied: list[int] = Field(description="Entries archived or tombstoned now (revertible)")
    skipped: list[SkippedOut] = Field(
        description="Named entries left alone: no open proposal, or it no longer holds (accessed, "
        "pinned, held, changed since)"
    )
    backup_file: str | None = Field(description="The pre-prune backup written before the first tombstone")


class ProposalRejectOut(Schema):
    rejected: list[int] = Field(description="Entries whose proposals were closed; each is now held")
    skipped: list[SkippedOut]
