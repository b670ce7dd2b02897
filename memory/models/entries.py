"""Entries with their versions (a lineage of rows, one ``is_latest``), their queries and partial
indexes, and their stored scores (``EntryScore``, beside the wide entry row). Every row carries
its workspace so that every query can be scoped."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import models
from django.db.models import BooleanField, Exists, Expression, F, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from memory.models.choices import (
    EXTERNAL_ID_UNIQUE,
    LIVE_STATUSES,
    MANAGED_SOURCES,
    TITLE_MAX,
    VISIBLE_STATUSES,
    EntryType,
    FeedbackSignal,
    HoldReason,
    SignificanceType,
    Source,
    StagedClass,
    Status,
    Tier,
    ValidationStatus,
    choices_check,
)
from memory.models.workspaces import Tag, Workspace


class IndexCondition(Expression):
    """The condition of one of ``model``'s partial indexes, rendered as the index's own
    definition renders it: values as SQL literals. SQLite uses a partial index only when the
    query's WHERE repeats every term of the index's condition, and it compares values only
    when they are literals: ``tier = ?`` with a bound parameter (what Django sends) never
    proves ``tier = 'constitutional'``. PostgreSQL proves
    the implication itself except in a generic prepared plan (``DB_PREPARED``), which the
    literals help too. Filtering by it changes no result when the query's own filter implies
    the condition; the caller makes sure it does."""

    conditional = True

    def __init__(self, model: type[models.Model], name: str) -> None:
        super().__init__(output_field=BooleanField())
        found = [index for index in model._meta.indexes if index.name == name]
        if not found or found[0].condition is None:
            raise ValueError(f"{model.__name__} has no partial index {name!r}")
        self.name = name
        self.condition: Any = found[0].condition

    def get_source_expressions(self) -> list[Any]:
        return [self.condition]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        (self.condition,) = exprs

    def as_sql(self, compiler: Any, connection: Any, **extra_context: Any) -> tuple[str, tuple[Any, ...]]:
        sql, params = compiler.compile(self.condition)
        # As Index._get_condition_sql writes the index's DDL (the schema editor quotes values
        # and doubles a "%" for the driver's placeholder syntax).
        quote = connection.schema_editor().quote_value
        return f"({sql % tuple(quote(p) for p in params)})", ()


class EntryQuerySet(models.QuerySet["Entry"]):
    def on_index(self, name: str) -> EntryQuerySet:
        """Repeat the condition of the partial index ``name`` (``IndexCondition``), so that
        SQLite may read that index; only where the query's filter implies that condition."""
        return self.filter(IndexCondition(Entry, name))

    def of(self, workspace: Workspace | int) -> EntryQuerySet:
        return self.filter(workspace=workspace)

    def latest_versions(self) -> EntryQuerySet:
        return self.filter(is_latest=True)

    def live(self) -> EntryQuerySet:
        """Latest versions that are staged, active or stale."""
        return self.filter(is_latest=True, status__in=LIVE_STATUSES)

    def visible(self, *, include_archived: bool = False, include_staged: bool = False) -> EntryQuerySet:
        statuses = visible_statuses(include_archived=include_archived, include_staged=include_staged)
        return self.filter(is_latest=True, status__in=statuses)

    def managed(self) -> EntryQuerySet:
        return self.filter(source__in=MANAGED_SOURCES)

    def unprotected(
        self,
        *,
        now: datetime,
        hold_days: int,
        exclude_tags: list[str] | tuple[str, ...] = (),
        honour_pin: bool = True,
    ) -> EntryQuerySet:
        """Entries automation may archive, mark stale or tombstone (``protected``)."""
        return self.exclude(
            protected(now=now, hold_days=hold_days, exclude_tags=exclude_tags, honour_pin=honour_pin)
        )

    def held(self, *, now: datetime, hold_days: int) -> EntryQuerySet:
        return self.filter(held(now=now, hold_days=hold_days))


def visible_statuses(*, include_archived: bool = False, include_staged: bool = False) -> list[str]:
    """The statuses ``EntryQuerySet.visible`` lists."""
    statuses: list[str] = list(VISIBLE_STATUSES)
    if include_archived:
        statuses.append(Status.ARCHIVED)
    if include_staged:
        statuses.append(Status.STAGED)
    return statuses


def held(*, now: datetime, hold_days: int) -> Q:
    """Under an operator hold: set by an operator's decision, cleared by a release or
    a new version, and over after ``hold_days`` when that is > 0."""
    q = Q(held_at__isnull=False)
    if hold_days > 0:
        q &= Q(held_at__gt=now - timedelta(days=hold_days))
    return q


def protected(
    *,
    now: datetime,
    hold_days: int,
    exclude_tags: list[str] | tuple[str, ...] = (),
    honour_pin: bool = True,
    holds: bool = True,
) -> Q:
    """THE protection rule: entries no automatic pass archives, marks stale or
    tombstones — unmanaged source, constitutional tier, an excluded tag, an operator hold, and
    (unless a writer's TTL overrides it: ``honour_pin=False``) pinned. ``holds=False`` leaves
    the hold out, only to count the held entries a pass skipped."""
    rule = ~Q(source__in=MANAGED_SOURCES) | Q(tier=Tier.CONSTITUTIONAL)
    if honour_pin:
        rule |= Q(pinned=True)
    if exclude_tags:
        tagged = Entry.tags.through.objects.filter(entry_id=OuterRef("pk"), tag__name__in=list(exclude_tags))
        rule |= Q(Exists(tagged))
    if holds:
        rule |= held(now=now, hold_days=hold_days)
    return rule


class Entry(models.Model):
    """One memory, one version. Changing content adds a row; the old row keeps its data."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="entries")
    title = models.CharField(max_length=TITLE_MAX, blank=True)
    content = models.TextField()
    content_hash = models.CharField(max_length=64, editable=False)
    external_id = models.CharField(max_length=200, null=True, blank=True)
    project = models.CharField(max_length=200, blank=True)
    session_key = models.CharField(max_length=200, blank=True)
    entry_type = models.CharField(max_length=32, choices=EntryType.choices, default=EntryType.OBSERVATION)
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.EPISODIC)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.AGENT)
    metadata = models.JSONField(default=dict, blank=True, help_text="Writer's extra fields, kept as given")

    # Scores supplied by writers.
    impact_score = models.FloatField(null=True, blank=True)
    trust_score = models.FloatField(null=True, blank=True)
    validation_status = models.CharField(
        max_length=8, choices=ValidationStatus.choices, default=ValidationStatus.NONE
    )
    significance_type = models.CharField(
        max_length=32, choices=SignificanceType.choices, null=True, blank=True
    )

    # Decay inputs.
    salience = models.FloatField(null=True, blank=True)
    access_count = models.PositiveIntegerField(default=0)
    last_accessed_at = models.DateTimeField(null=True, blank=True)
    retrieval_count = models.PositiveIntegerField(default=0)
    reinforced_at = models.DateTimeField(null=True, blank=True)
    last_feedback = models.CharField(max_length=16, choices=FeedbackSignal.choices, blank=True)
    feedback_at = models.DateTimeField(null=True, blank=True)

    pinned = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    tags = models.ManyToManyField(Tag, related_name="entries", blank=True)

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    status_changed_at = models.DateTimeField(default=timezone.now)
    archived_at = models.DateTimeField(null=True, blank=True)
    staged_class = models.CharField(max_length=16, choices=StagedClass.choices, null=True, blank=True)
    ttl_expires_at = models.DateTimeField(null=True, blank=True)
    # content_hash at the time an operator chose "keep" in the hygiene queue; a content change
    # brings the entry back to the queue.
    review_kept_hash = models.CharField(max_length=64, blank=True)
    # An operator hold; a new version starts without one. db_default: rows written
    # by raw SQL (bulk loaders) that do not name these columns are unheld too.
    held_at = models.DateTimeField(null=True, blank=True)
    held_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    hold_reason = models.CharField(
        max_length=16, choices=HoldReason.choices, blank=True, default="", db_default=""
    )

    # Versions.
    lineage_id = models.BigIntegerField(null=True, blank=True, help_text="Id of the first version")
    # Indexed only where set (``entry_supersedes``): most rows are first versions, and an index
    # entry costs every non-HOT update of the row.
    supersedes = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="superseded_by",
        db_index=False,
    )
    is_latest = models.BooleanField(default=True)

    # Stored importance (refreshed by sweeps and by every write that changes an input, written
    # only where it changed). Retention and when the scores were computed live in the narrow
    # ``EntryScore`` row: they change on every sweep, and rewriting this wide row for them
    # wrote a new entry into each of its indexes (``retention``, ``scored_at`` below).
    importance = models.FloatField(default=0.0)

    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = EntryQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "entries"
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "external_id"],
                condition=Q(is_latest=True, external_id__isnull=False),
                name=EXTERNAL_ID_UNIQUE,
            ),
            choices_check("status", Status, "entry_status_valid"),
            choices_check("tier", Tier, "entry_tier_valid"),
            choices_check("source", Source, "entry_source_valid"),
            choices_check("validation_status", ValidationStatus, "entry_validation_valid"),
            models.CheckConstraint(
                condition=Q(impact_score__isnull=True) | Q(impact_score__gte=0, impact_score__lte=1),
                name="entry_impact_in_range",
            ),
            models.CheckConstraint(
                condition=Q(trust_score__isnull=True) | Q(trust_score__gte=0, trust_score__lte=1),
                name="entry_trust_in_range",
            ),
            models.CheckConstraint(
                condition=Q(salience__isnull=True) | Q(salience__gte=0.25, salience__lte=2.0),
                name="entry_salience_in_range",
            ),
            models.CheckConstraint(
                condition=Q(supersedes__isnull=True) | ~Q(supersedes=F("id")),
                name="entry_not_superseding_itself",
            ),
        ]
        # No index here names ``status`` or ``status_changed_at``, as a key or in a condition:
        # a status change then rewrites none of them, and on PostgreSQL it is a HOT update when
        # the page has room (the table's fillfactor, migration 0010). Lists filter the status
        # off the rows they read in an index's order; the sweeps read their rows in one pass.
        # (SQLite's search index ``entry_search_cover``, made outside the model, holds the
        # status: SQLite has no HOT updates.) Measured: bench/reports/maintenance.md, "What a
        # status change costs in the entry row".
        indexes = [
            # Every latest entry, tombstones included, by importance then id: lists (any filter
            # of statuses), their counts and the walk of a broad search read it in order.
            models.Index(
                fields=["workspace", "-importance", "-id"],
                condition=Q(is_latest=True),
                name="entry_by_importance",
            ),
            models.Index(
                fields=["workspace", "-created_at"],
                condition=Q(is_latest=True),
                name="entry_latest_recent",
            ),
            # The MCP briefing's constitutional rules, first (api.mcp): a workspace has few,
            # and the importance index would be walked to its end to find that out.
            models.Index(
                fields=["workspace", "-importance", "-id"],
                condition=Q(is_latest=True, tier=Tier.CONSTITUTIONAL),
                name="entry_constitutional",
            ),
            models.Index(fields=["lineage_id"], name="entry_lineage"),
            models.Index(
                fields=["supersedes"], condition=Q(supersedes__isnull=False), name="entry_supersedes"
            ),
            models.Index(
                fields=["workspace", "content_hash"], condition=Q(is_latest=True), name="entry_hash"
            ),
            # Sweep predicates, each a partial index on the rows the pass reads.
            # The decay pass's rows in keyset order. Not on retention: a column in an index
            # makes every score refresh of the row a non-HOT update on PostgreSQL (a new entry
            # in each of the table's indexes, the full-text index among them); the pass reads
            # retention off the rows this index finds.
            models.Index(
                fields=["workspace", "id"],
                condition=Q(is_latest=True, tier=Tier.EPISODIC),
                name="entry_sweep_decay_rows",
            ),
            # Staged traces by TTL: only a staged write sets one (a graduated entry keeps it).
            models.Index(
                fields=["workspace", "ttl_expires_at"],
                condition=Q(is_latest=True, ttl_expires_at__isnull=False),
                name="entry_sweep_staged",
            ),
            models.Index(
                fields=["workspace", "expires_at"],
                condition=Q(is_latest=True, expires_at__isnull=False),
                name="entry_sweep_ttl",
            ),
        ]

    def __str__(self) -> str:
        label = self.title or self.content[:60]
        return f"#{self.pk} {label}"

    @property
    def is_managed(self) -> bool:
        return self.source in MANAGED_SOURCES

    def hold_active(self, *, now: datetime, hold_days: int) -> bool:
        """The Python twin of ``held`` for one loaded entry."""
        if self.held_at is None:
            return False
        return hold_days <= 0 or self.held_at > now - timedelta(days=hold_days)

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.pop("_tag_names", None)  # attached by a page read; may be stale now
        super().refresh_from_db(*args, **kwargs)

    def _score(self) -> EntryScore | None:
        try:
            return self.score
        except EntryScore.DoesNotExist:  # never scored (a bulk load, a restore: until a sweep)
            return None

    @property
    def retention(self) -> float:
        """The stored retention (``EntryScore``); ``RETENTION_UNSCORED`` before the first
        scoring. A page of entries loads it with ``select_related("score")``."""
        score = self._score()
        return RETENTION_UNSCORED if score is None else score.retention

    @property
    def scored_at(self) -> datetime | None:
        """When the stored scores were last computed (None: never)."""
        score = self._score()
        return None if score is None else score.scored_at

    @property
    def tag_names(self) -> list[str]:
        """Tag names by name: those ``memory.selectors.with_tag_names`` attached to a page at
        once, else the prefetched tags, else a query."""
        attached = self.__dict__.get("_tag_names")
        return attached if attached is not None else [tag.name for tag in self.tags.all()]


RETENTION_UNSCORED = 1.0  # retention before the first scoring (a fresh memory's at the default salience)


def stored_retention(*, lookup: bool = False) -> Coalesce:
    """An entry's stored retention in a query: its ``EntryScore`` row's (a join; with
    ``lookup`` a subquery per row, for a query that needs it for few of its rows), else
    ``RETENTION_UNSCORED``."""
    if lookup:
        own = EntryScore.objects.filter(entry_id=OuterRef("pk")).values("retention")[:1]
        return Coalesce(Subquery(own), Value(RETENTION_UNSCORED))
    return Coalesce(F("score__retention"), Value(RETENTION_UNSCORED))


class EntryScore(models.Model):
    """An entry's retention and when its scores were last computed, beside the wide entry row.

    A sweep recomputes every latest entry's scores; retention changes every time (it decays
    with age). Kept on ``memory_entry``, each refresh rewrote the whole row and, the row being
    indexed fourteen times, added an entry to each index. Here a refresh writes this narrow
    row, and the entry row only where its importance changed. No row: never scored
    (``RETENTION_UNSCORED``)."""

    entry = models.OneToOneField(Entry, on_delete=models.CASCADE, primary_key=True, related_name="score")
    retention = models.FloatField(default=RETENTION_UNSCORED)
    scored_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"scores of entry {self.entry_id}: retention {self.retention:.3f}"
