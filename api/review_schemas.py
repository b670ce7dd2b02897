"""In and Out schemas of the review endpoints: the hygiene queue, disputes and proposals.

In schemas are strict and forbid unknown keys (``StrictIn``): a decision that archives or keeps
entries does exactly what was typed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import StrictBool, model_validator

from api.maintenance_schemas import PageIn, StrictIn
from maintenance.models import ProposalAction
from maintenance.proposals import ACTIONS
from memory.models.choices import ID_MAX

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
    values: dict[str, Any] = Field(
        description="The values that decided it (e.g. retention, cold_threshold), as of created_at: "
        "a later run that proposes it again moves it (run_id) and keeps them"
    )
    why: str = Field(description="The deciding values in words, as of created_at")
    run_id: int = Field(description="The run that proposed it (the latest that still proposes it)")
    created_at: datetime = Field(
        description="When a run proposed it for this pass (what values and why are of)"
    )
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
