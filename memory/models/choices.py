"""The memory domain's vocabularies and limits: the choices of its fields, the status groups
the queries use and the sizes a write may not exceed. Nothing here is a model."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

CONTENT_MAX = 50_000
TITLE_MAX = 200
OFFSET_MAX = (
    1_000_000_000  # the deepest page offset: deeper pages mean nothing, and OFFSET stays far from overflow
)
EXCERPT_CHARS = 240  # of an entry's content in a listing: a page never loads a 50,000-character text
ID_MAX = 2**63 - 1  # the largest id: 64-bit on both databases (SQLite refuses larger integers)


class Role(models.TextChoices):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


class KeyRole(models.TextChoices):
    VIEWER = "viewer"  # reads only: a dashboard's key, or an agent that must not write
    AGENT = "agent"
    OPERATOR = "operator"
    ADMIN = "admin"


class EntryType(models.TextChoices):
    DECISION = "decision"
    BUG_FIX = "bug_fix"
    DEVELOPMENT_NOTE = "development_note"
    TECHNICAL_NOTE = "technical_note"
    OBSERVATION = "observation"
    RULE = "rule"
    LESSON = "lesson"
    RETROSPECTIVE = "retrospective"
    TEST_ENTRY = "test_entry"
    RELEASE = "release"
    RESEARCH = "research"
    PLANNING = "planning"
    MAINTENANCE = "maintenance"
    OTHER = "other"


class Tier(models.TextChoices):
    EPISODIC = "episodic"
    SEMANTIC = "semantic"
    PROCEDURAL = "procedural"
    CONSTITUTIONAL = "constitutional"


class Source(models.TextChoices):
    AGENT = "agent"
    IMPORT = "import"
    PLATFORM = "platform"
    OPERATOR = "operator"
    SYSTEM = "system"


# Automation may archive or tombstone entries from these sources only.
MANAGED_SOURCES = (Source.AGENT, Source.IMPORT, Source.PLATFORM)


class ValidationStatus(models.TextChoices):
    NONE = "none"
    PASSED = "passed"
    FAILED = "failed"


class SignificanceType(models.TextChoices):
    MILESTONE = "milestone"
    BREAKTHROUGH = "breakthrough"
    DECISION = "decision"
    ARCHITECTURE = "architecture"
    LESSON_LEARNED = "lesson_learned"
    BLOCKER_RESOLVED = "blocker_resolved"
    RELEASE = "release"
    SECURITY = "security"


class Status(models.TextChoices):
    STAGED = "staged"
    ACTIVE = "active"
    STALE = "stale"
    ARCHIVED = "archived"
    TOMBSTONED = "tombstoned"


# Shown by default reads and search (staged only when asked for).
VISIBLE_STATUSES = (Status.ACTIVE, Status.STALE)
# Statuses an entry can be restored to; "live" for reads.
LIVE_STATUSES = (Status.STAGED, Status.ACTIVE, Status.STALE)
# Every status but tombstoned: what the console lists, what the other end of a counted link may
# have, what a workspace counts as its live entries.
LISTED_STATUSES = (Status.STAGED, Status.ACTIVE, Status.STALE, Status.ARCHIVED)


class HoldReason(models.TextChoices):
    """Why an operator hold protects an entry: the operator decision behind it."""

    RESTORE = "restore"
    REVERT = "revert"
    REJECT = "reject"
    KEEP = "keep"
    DISPUTE = "dispute"


class StagedClass(models.TextChoices):
    PROCEDURAL = "procedural"
    CONCEPTUAL = "conceptual"
    REFERENCE = "reference"
    ANALOGICAL = "analogical"
    EVIDENCE = "evidence"


class FeedbackSignal(models.TextChoices):
    HELPFUL = "helpful"
    NOT_HELPFUL = "not_helpful"
    STALE = "stale"
    WRONG = "wrong"


class RelationshipType(models.TextChoices):
    REFERENCES = "references"
    IMPLEMENTS = "implements"
    CLARIFIES = "clarifies"
    RESPONSE_TO = "response_to"
    EVOLVES_FROM = "evolves_from"
    BLOCKED_BY = "blocked_by"
    RESOLVED = "resolved"
    CAUSED = "caused"
    SUPERSEDES = "supersedes"
    CONTRADICTS = "contradicts"
    DUPLICATES = "duplicates"


EXTERNAL_ID_UNIQUE = "entry_external_id_unique_per_workspace"

CAUSAL_TYPES = (RelationshipType.BLOCKED_BY, RelationshipType.RESOLVED, RelationshipType.CAUSED)


class AnchorStatus(models.TextChoices):
    VALID = "valid"
    STALE = "stale"
    INVALIDATED = "invalidated"


class TombstoneReason(models.TextChoices):
    PRUNE = "prune"
    DECAY = "decay"
    TTL = "ttl"
    RECLAIM = "reclaim"
    HYGIENE = "hygiene"
    MANUAL = "manual"
    API = "api"


def choices_check(field: str, choices: type[models.TextChoices], name: str) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)
