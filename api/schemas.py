"""Request and response schemas of the memory API.

In schemas forbid unknown keys and carry the limits of the domain model, so a bad request is
refused with 422 before any service runs. Enum fields hand plain strings to the services
(``use_enum_values``). Every free-text input refuses NUL characters (PostgreSQL cannot store
them); pydantic already refuses lone surrogates. Out schemas read model instances.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Schema
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ModelWrapValidatorHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    model_validator,
)

from memory.models import Entry
from memory.models.choices import (
    CONTENT_MAX,
    ID_MAX,
    OFFSET_MAX,
    TITLE_MAX,
    AnchorStatus,
    EntryType,
    FeedbackSignal,
    HoldReason,
    RelationshipType,
    SignificanceType,
    Source,
    StagedClass,
    Tier,
    TombstoneReason,
    ValidationStatus,
)
from memory.policy_model import MaintenancePolicy
from memory.write_input import (
    ANCHORS_PER_ENTRY_MAX,
    INT32_MAX,
    LINKS_PER_WRITE_MAX,
    TAG_MAX,
    TAGS_PER_ENTRY_MAX,
)
from memory.writes import write_policy

PAGE_MAX = 500  # the most items one page of a list returns: limit ≤ 500
METADATA_MAX_CHARS = 100_000  # serialised size of an entry's metadata object
ANCHOR_FILES_MAX = 5000  # files per POST /anchors/check
FILE_HASH_MAX = 128  # a hex sha512 fits
# The default of a field that may be left out but not set to null (never validated, and left
# out of ``model_dump(exclude_unset=True)``); typed Any so it fits any field.
OMITTED: Any = None
NOT_BLANK = r"\S"  # at least one non-space character (a search, in pydantic as in JSON Schema)


def no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _utc_compatible(value: datetime | None) -> datetime | None:
    # A far-future local time can overflow when converted to UTC (the databases store UTC),
    # e.g. 9999-12-31T23:00-05:00; refuse it here instead of failing in the database layer.
    if value is None:
        return None
    try:
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    except OverflowError:
        raise ValueError("is outside the supported range of dates") from None


def _json_object(value: dict[str, Any] | None) -> dict[str, Any] | None:
    # Both databases must be able to store it: no NaN/Infinity (PostgreSQL's jsonb refuses
    # them), no lone surrogates (not UTF-8), and a bounded size.
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except (ValueError, TypeError, UnicodeEncodeError):
        raise ValueError("must be a JSON object of finite numbers and valid text") from None
    if len(text) > METADATA_MAX_CHARS:
        raise ValueError(f"is larger than {METADATA_MAX_CHARS} characters once serialised")
    return value


Text = Annotated[str, AfterValidator(no_nul)]
EntryId = Annotated[StrictInt, Field(ge=1, le=ID_MAX)]
TagName = Annotated[str, Field(max_length=TAG_MAX), AfterValidator(no_nul)]


def _iso_text_only(value: object) -> object:
    """The schema publishes date-time strings; pydantic would also take a bare number as a
    Unix timestamp, which the published schema does not allow (and a client would not expect)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError("must be an ISO-8601 date-time string")
    return value


When = Annotated[datetime | None, BeforeValidator(_iso_text_only), AfterValidator(_utc_compatible)]
Metadata = Annotated[dict[str, Any] | None, AfterValidator(_json_object)]
LineNumber = Annotated[StrictInt | None, Field(ge=1, le=INT32_MAX)]
ListStatus = Literal["staged", "active", "stale", "archived"]
Sort = Literal["importance", "recent", "retention"]


class InSchema(Schema):
    model_config = ConfigDict(extra="forbid", use_enum_values=True)


# --- in ---------------------------------------------------------------------------------------


class AnchorIn(InSchema):
    path: Text = Field(min_length=1, max_length=1000, pattern=NOT_BLANK)
    repo: Text = Field("", max_length=300)
    commit: Text = Field("", max_length=64)
    line_start: LineNumber = None
    line_end: LineNumber = None
    content_hash: Text = Field("", max_length=64)


class LinkIn(InSchema):
    to_id: EntryId
    type: RelationshipType = RelationshipType.REFERENCES


class EntryIn(InSchema):
    """The fields of an entry a writer may set."""

    content: Text = Field(min_length=1, max_length=CONTENT_MAX, pattern=NOT_BLANK)
    title: Text | None = Field(None, max_length=TITLE_MAX)
    entry_type: EntryType = EntryType.OBSERVATION
    tier: Tier = Tier.EPISODIC
    source: Source = Source.AGENT
    impact_score: StrictFloat | None = Field(None, ge=0.0, le=1.0)
    trust_score: StrictFloat | None = Field(None, ge=0.0, le=1.0)
    validation_status: ValidationStatus = ValidationStatus.NONE
    significance_type: SignificanceType | None = None
    salience: StrictFloat | None = Field(None, ge=0.25, le=2.0)
    pinned: StrictBool = False
    expires_at: When = None
    project: Text | None = Field(None, max_length=200)
    session_key: Text | None = Field(None, max_length=200)
    external_id: Text | None = Field(None, min_length=1, max_length=200, pattern=NOT_BLANK)
    metadata: Metadata = None
    staged_class: StagedClass | None = None
    tags: list[TagName] = Field(default_factory=list, max_length=TAGS_PER_ENTRY_MAX)
    anchors: list[AnchorIn] = Field(default_factory=list, max_length=ANCHORS_PER_ENTRY_MAX)
    links: list[LinkIn] = Field(default_factory=list, max_length=LINKS_PER_WRITE_MAX)


class EntryPatchIn(InSchema):
    """Only the keys sent are changed; ``tags`` and ``anchors`` replace the current ones.

    Fields that cannot be cleared are not nullable: their default (``OMITTED``) only makes them
    optional and an explicit null is refused, so the schema says exactly what the service
    accepts."""

    content: Text = Field(OMITTED, min_length=1, max_length=CONTENT_MAX, pattern=NOT_BLANK)
    title: Text | None = Field(None, max_length=TITLE_MAX)
    entry_type: EntryType = Field(OMITTED)
    tier: Tier = Field(OMITTED)
    source: Source = Field(OMITTED)
    impact_score: StrictFloat | None = Field(None, ge=0.0, le=1.0)
    trust_score: StrictFloat | None = Field(None, ge=0.0, le=1.0)
    validation_status: ValidationStatus = Field(OMITTED)
    significance_type: SignificanceType | None = None
    salience: StrictFloat | None = Field(None, ge=0.25, le=2.0)
    pinned: StrictBool = Field(OMITTED)
    expires_at: When = None
    project: Text | None = Field(None, max_length=200)
    session_key: Text | None = Field(None, max_length=200)
    external_id: Text | None = Field(None, min_length=1, max_length=200, pattern=NOT_BLANK)
    metadata: Metadata = None
    tags: list[TagName] = Field(OMITTED, max_length=TAGS_PER_ENTRY_MAX)
    anchors: list[AnchorIn] = Field(OMITTED, max_length=ANCHORS_PER_ENTRY_MAX)


class EntryListQuery(Schema):
    # Query schemas do not forbid unknown keys: a member's session names its workspace in the
    # ``workspace`` query parameter.
    model_config = ConfigDict(use_enum_values=True)

    status: ListStatus | None = None
    entry_type: EntryType | None = None
    tier: Tier | None = None
    tag: TagName | None = None
    project: Text | None = Field(None, max_length=200)
    include_archived: bool = False
    include_staged: bool = False
    sort: Sort = "importance"
    limit: int = Field(50, ge=1, le=PAGE_MAX)
    offset: int = Field(0, ge=0, le=OFFSET_MAX)


class PageQuery(Schema):
    limit: int = Field(50, ge=1, le=PAGE_MAX)
    offset: int = Field(0, ge=0, le=OFFSET_MAX)


class DeleteQuery(Schema):
    purge: bool = False


class AccessIn(InSchema):
    actor: Text = Field(min_length=1, max_length=200, pattern=NOT_BLANK)
    dispatch: StrictBool = False


class FeedbackIn(InSchema):
    signal: FeedbackSignal


class RelationshipIn(InSchema):
    from_id: EntryId
    to_id: EntryId
    type: RelationshipType = RelationshipType.REFERENCES


class AnchorFileIn(InSchema):
    path: Text = Field(min_length=1, max_length=1000, pattern=NOT_BLANK)
    # Required, though nullable: only an explicit null says "this file was deleted", so a
    # client that forgets the key cannot invalidate anchors by accident.
    content_hash: Text | None = Field(..., max_length=FILE_HASH_MAX)


class AnchorCheckIn(InSchema):
    repo: Text = Field("", max_length=300)
    files: list[AnchorFileIn] = Field(max_length=ANCHOR_FILES_MAX)


# --- out --------------------------------------------------------------------------------------


class ErrorOut(Schema):
    detail: Any


def hold_days(request: Any, workspace_id: int | None = None) -> int:
    """The caller's workspace's operator_hold_days: from the policy the request's key lookup read
    (no query), else read once per request (a member's session) and kept on the request. Without
    a request (a schema used outside the API), the entry's workspace's policy."""
    if isinstance(request, HttpRequest):
        cached = getattr(request, "_hold_days", None)
        if isinstance(cached, int):
            return cached
        who = getattr(request, "principal", None)
        if who is not None:
            days = write_policy(who.workspace).operator_hold_days
            request._hold_days = days  # type: ignore[attr-defined]
            return days
    if workspace_id is None:
        return 0
    return MaintenancePolicy.for_workspace(workspace_id).operator_hold_days  # type: ignore[arg-type]


class EntryOut(BaseModel):
    """An entry as every endpoint returns it. A plain pydantic model reading the instance's
    attributes (no django-ninja resolvers): serialising a page costs a fraction of what ninja's
    per-attribute getter took (bench/reports/api.md, section "Figures moved from the code").
    ``held`` is the entry's operator hold judged under the workspace's ``operator_hold_days``
    now (the request is in the validation context django-ninja passes)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    title: str
    content: str
    content_hash: str
    external_id: str | None
    project: str
    session_key: str
    entry_type: str
    tier: str
    source: str
    metadata: dict[str, Any]
    impact_score: float | None
    trust_score: float | None
    validation_status: str
    significance_type: str | None
    salience: float | None
    access_count: int
    last_accessed_at: datetime | None
    retrieval_count: int
    reinforced_at: datetime | None
    last_feedback: str
    feedback_at: datetime | None
    pinned: bool
    expires_at: datetime | None
    tags: list[str] = Field(validation_alias="tag_names")
    status: str
    status_changed_at: datetime
    archived_at: datetime | None
    staged_class: str | None
    ttl_expires_at: datetime | None
    lineage_id: int | None
    supersedes: int | None = Field(validation_alias="supersedes_id")
    is_latest: bool
    importance: float
    retention: float
    scored_at: datetime | None
    created_at: datetime
    updated_at: datetime
    held: bool = Field(
        False,
        description="Under an operator hold: no automatic pass archives, marks stale or "
        "tombstones it until released (POST /entries/{id}/release), its content changes, or "
        "operator_hold_days (if > 0) have passed",
    )
    held_at: datetime | None = Field(description="When an operator's decision put the hold (null: none)")
    held_by: str = Field(description="Who put it")
    hold_reason: HoldReason | Literal[""] = Field(
        description="The decision behind it: restore, revert, reject, keep or dispute"
    )

    @model_validator(mode="wrap")
    @classmethod
    def _hold_in_force(
        cls, value: Any, handler: ModelWrapValidatorHandler[EntryOut], info: ValidationInfo
    ) -> EntryOut:
        out = handler(value)
        if out.held_at is not None:
            # An entry, or what wraps one (selectors.EntryDetail reads its attributes from it).
            entry = value if isinstance(value, Entry) else getattr(value, "entry", None)
            if isinstance(entry, Entry):
                days = hold_days((info.context or {}).get("request"), entry.workspace_id)
                out.held = entry.hold_active(now=timezone.now(), hold_days=days)
            else:  # not read from an entry: a hold that has a start is in force
                out.held = True
        return out


class AnchorOut(Schema):
    id: int
    repo: str
    path: str
    commit: str
    line_start: int | None
    line_end: int | None
    content_hash: str
    status: AnchorStatus
    checked_at: datetime | None
    created_at: datetime


class LinkOut(Schema):
    id: int
    direction: Literal["out", "in"]
    type: str
    other_id: int
    created_at: datetime
    pruned_at: datetime | None


class ImportanceBreakdownOut(Schema):
    """The terms of an entry's importance score, and the inputs they were computed from."""

    significance: float
    relationships: float
    causal: float
    recency: float
    anchor_multiplier: float
    trust_multiplier: float
    importance: float
    relationship_count: int
    causal_count: int
    age_days: float
    anchor_status: AnchorStatus


class EntryDetailOut(EntryOut):
    readers: int
    importance_breakdown: ImportanceBreakdownOut
    anchors: list[AnchorOut]
    links: list[LinkOut]


class EntryPageOut(Schema):
    count: int
    limit: int
    offset: int
    items: list[EntryOut]


class DisputeRefOut(Schema):
    """A contradiction the write was found to be part of, for the operator."""

    id: int
    entry_a: int = Field(alias="entry_a_id")
    entry_b: int = Field(alias="entry_b_id")
    similarity: float


class EntryCreateOut(EntryOut):
    disputes: list[DisputeRefOut] = Field(
        default_factory=list,
        description="Open disputes flagged by the immediate check of a constitutional entry or an "
        "operator's rule; empty otherwise",
    )


class EntryUpdateOut(Schema):
    entry: EntryOut
    new_version: bool
    supersedes: int | None
    disputes: list[DisputeRefOut] = Field(
        default_factory=list, description="As for create: open disputes the written version is part of"
    )


class EntryTombstoneOut(Schema):
    id: int
    entry_id: int = Field(alias="entry_ref")
    lineage_id: int = Field(alias="lineage_ref")
    reason: TombstoneReason
    actor: str
    created_at: datetime
    purge_after: datetime


class PurgeOut(Schema):
    purged: bool
    entry_id: int
    lineage_id: int
    backup_file: str


class EventOut(Schema):
    id: int
    entry_id: int = Field(alias="entry_ref")
    from_status: str
    to_status: str
    reason: str
    run_id: int | None
    actor: str
    automatic: bool
    reverted_at: datetime | None
    created_at: datetime
    details: dict[str, Any]


class EventPageOut(Schema):
    count: int
    limit: int
    offset: int
    items: list[EventOut]


class RelationshipOut(Schema):
    id: int
    from_id: int
    to_id: int
    type: RelationshipType
    created_at: datetime
    pruned_at: datetime | None
    duplicate: bool = False


class DeletedOut(Schema):
    deleted: bool


class AnchorCheckOut(Schema):
    checked: int
    valid: int
    stale: int
    invalidated: int
    changed: int


__all__ = [
    "AccessIn",
    "AnchorCheckIn",
    "AnchorCheckOut",
    "DeleteQuery",
    "DeletedOut",
    "DisputeRefOut",
    "EntryCreateOut",
    "EntryDetailOut",
    "EntryIn",
    "EntryListQuery",
    "EntryOut",
    "EntryPageOut",
    "EntryPatchIn",
    "EntryTombstoneOut",
    "EntryUpdateOut",
    "ErrorOut",
    "EventPageOut",
    "FeedbackIn",
    "PageQuery",
    "PurgeOut",
    "RelationshipIn",
    "RelationshipOut",
]
