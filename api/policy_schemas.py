"""In and Out schemas of the policy (GET/PATCH /policy) and of the workspace's stats, which
include it. A policy update is clamped into each setting's range, as every stored value is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema

from api.maintenance_schemas import EXCLUDE_TAGS_MAX, StrictIn, TagName
from maintenance.models import RunStatus, RunTrigger
from memory.policy import LIMITS, PROPOSE, REVIEW_MODES

RESIDUE_PATTERNS_MAX = 50
RESIDUE_PATTERN_MAX = 200


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
