"""The rows around entries: per-actor access counters, links, code anchors, tombstones, the
lifecycle audit trail, the live outbox and idempotency keys. Each carries its workspace
(directly or through its entry)."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from memory.models.choices import (
    AnchorStatus,
    RelationshipType,
    Status,
    TombstoneReason,
    choices_check,
)
from memory.models.entries import Entry
from memory.models.workspaces import Workspace


class EntryAccess(models.Model):
    """Per-actor access counter of a lineage; the number of rows is the entry's readers."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    lineage_id = models.BigIntegerField()
    actor = models.CharField(max_length=200)
    count = models.PositiveIntegerField(default=0)
    first_at = models.DateTimeField(default=timezone.now)
    last_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "entry accesses"
        constraints = [
            models.UniqueConstraint(fields=["lineage_id", "actor"], name="access_unique_lineage_actor")
        ]

    def __str__(self) -> str:
        return f"{self.actor} → lineage {self.lineage_id} ×{self.count}"


class Relationship(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="relationships")
    from_entry = models.ForeignKey(Entry, on_delete=models.CASCADE, related_name="links_out")
    to_entry = models.ForeignKey(Entry, on_delete=models.CASCADE, related_name="links_in")
    type = models.CharField(
        max_length=16, choices=RelationshipType.choices, default=RelationshipType.REFERENCES
    )
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=200, blank=True)
    pruned_at = models.DateTimeField(null=True, blank=True, help_text="Deactivated by maintenance")
    pruned_by_run = models.ForeignKey(
        "maintenance.MaintenanceRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["from_entry", "to_entry", "type"], name="relationship_unique_triple"
            ),
            models.CheckConstraint(condition=~Q(from_entry=F("to_entry")), name="relationship_no_self_link"),
            choices_check("type", RelationshipType, "relationship_type_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.from_entry_id} -{self.type}-> {self.to_entry_id}"


class CodeAnchor(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    entry = models.ForeignKey(Entry, on_delete=models.CASCADE, related_name="anchors")
    repo = models.CharField(max_length=300, blank=True)
    path = models.CharField(max_length=1000)
    commit = models.CharField(max_length=64, blank=True)
    line_start = models.PositiveIntegerField(null=True, blank=True)
    line_end = models.PositiveIntegerField(null=True, blank=True)
    content_hash = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=16, choices=AnchorStatus.choices, default=AnchorStatus.VALID)
    checked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["workspace", "repo", "path"], name="anchor_by_path")]
        constraints = [
            choices_check("status", AnchorStatus, "anchor_status_valid"),
            models.CheckConstraint(
                condition=Q(line_start__isnull=True)
                | Q(line_end__isnull=True)
                | Q(line_end__gte=F("line_start")),
                name="anchor_line_range_ordered",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.repo}:{self.path}@{self.commit[:10]} ({self.status})"


class Tombstone(models.Model):
    """A soft deletion. It outlives a purged entry as a content-free record. Its workspace,
    entry and run are not re-checked by the database per row, as ``LifecycleEvent``'s are not:
    a Tombstone is written by the transaction that holds its entry's row lock, and a purge
    locks a lineage's entries before the ORM unlinks what names them. The deferred check of
    the entry was most of the commits of a first run's evictions (bench/reports/maintenance.md,
    "Fewer round trips and checks per batch")."""

    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="tombstones", db_constraint=False
    )
    entry = models.ForeignKey(
        Entry,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="tombstones",
        db_constraint=False,
    )
    entry_ref = models.BigIntegerField(help_text="Entry id, kept after purge")
    lineage_ref = models.BigIntegerField(help_text="Lineage id, kept after purge")
    content_hash = models.CharField(max_length=64)
    reason = models.CharField(max_length=16, choices=TombstoneReason.choices)
    previous_status = models.CharField(max_length=16, choices=Status.choices)
    run = models.ForeignKey(
        "maintenance.MaintenanceRun",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="tombstones",
        db_constraint=False,
    )
    actor = models.CharField(max_length=200, default="system")
    created_at = models.DateTimeField(default=timezone.now)
    purge_after = models.DateTimeField()
    restored_at = models.DateTimeField(null=True, blank=True)
    purged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            choices_check("reason", TombstoneReason, "tombstone_reason_valid"),
            models.UniqueConstraint(
                fields=["entry"],
                condition=Q(restored_at__isnull=True, purged_at__isnull=True),
                name="tombstone_one_open_per_entry",
            ),
        ]
        indexes = [
            models.Index(
                fields=["workspace", "purge_after"],
                condition=Q(restored_at__isnull=True, purged_at__isnull=True),
                name="tombstone_sweep_purge",
            )
        ]

    def __str__(self) -> str:
        return f"tombstone of #{self.entry_ref} ({self.reason})"


class LifecycleEvent(models.Model):
    """One row per status change of an entry: the audit trail behind every revert.

    Its references (workspace, entry, run) are not re-checked by the database per row
    (``db_constraint=False``), as an audit log's usually are not: a first run over a large
    workspace writes an event for most of its entries, and the deferred checks of those three
    references cost about as much as writing the event (bench/reports/maintenance.md, "The
    audit trail's own cost"). Workspaces, entries and runs are deleted only through the ORM,
    whose ``on_delete`` removes the events or unlinks them (a purged entry's events keep
    ``entry_ref``), and an event is written by the transaction that holds its entry's row lock,
    so no purge can slip between (tests/test_audit_trail.py). The workspace and the run have
    no index of their own: ``event_recent`` and ``event_by_run`` lead with them."""

    workspace = models.ForeignKey(
        Workspace,
        on_delete=models.CASCADE,
        related_name="lifecycle_events",
        db_constraint=False,
        db_index=False,
    )
    entry = models.ForeignKey(
        Entry, null=True, blank=True, on_delete=models.SET_NULL, related_name="events", db_constraint=False
    )
    entry_ref = models.BigIntegerField()
    from_status = models.CharField(max_length=16, blank=True, help_text="Empty for a creation")
    to_status = models.CharField(max_length=16, help_text="A status, or 'purged'")
    reason = models.CharField(max_length=32)
    run = models.ForeignKey(
        "maintenance.MaintenanceRun",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="events",
        db_constraint=False,
        db_index=False,
    )
    actor = models.CharField(max_length=200, default="system")
    automatic = models.BooleanField(default=False, help_text="Made by maintenance, not by a person or key")
    # Indexed where set only (``event_reverts``): most events revert nothing.
    reverts = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reverted_by", db_index=False
    )
    reverted_at = models.DateTimeField(null=True, blank=True, help_text="When this change was undone")
    created_at = models.DateTimeField(default=timezone.now)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["workspace", "-created_at"], name="event_recent"),
            models.Index(fields=["entry_ref", "-created_at"], name="event_by_entry"),
            # A run's affected entries, by action, paged in id order (the run page and the API).
            models.Index(fields=["run", "to_status", "entry_ref"], name="event_by_run"),
            models.Index(fields=["reverts"], condition=Q(reverts__isnull=False), name="event_reverts"),
            # The automatic changes a revert would still undo (the review tab and its count, on
            # every console page): only those rows, not every event of the workspace.
            models.Index(
                fields=["workspace", "run"],
                condition=Q(
                    automatic=True,
                    reverted_at__isnull=True,
                    entry__isnull=False,
                    to_status__in=[Status.ARCHIVED, Status.TOMBSTONED],
                ),
                name="event_automatic_open",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.entry_ref} {self.from_status or '∅'} → {self.to_status} ({self.reason})"


class LiveMessage(models.Model):
    """The outbox of live updates in the embedded mode (no shared channel layer): a process
    that announces a change writes the rendered fragment here, and the relay task of each web
    process forwards the rows of other processes to its websockets (see ``console.live``). Rows
    live a few minutes."""

    # A plain id, no foreign key: the outbox is transport, not workspace data (no backup, no
    # cascade); rows of a deleted workspace simply age out.
    workspace_id = models.BigIntegerField()
    html = models.TextField()
    origin = models.CharField(max_length=100, help_text="The process that wrote it (host:pid:random)")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"live message {self.pk} for workspace {self.workspace_id}"


class IdempotencyKey(models.Model):
    """The first answer to a ``POST`` of the API that carried an ``Idempotency-Key`` header,
    kept 24 h per key and workspace so that a retry gets the same answer without a second
    write (``memory.idempotency``). ``status`` is null while the first request is in hand."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    # sha256 of what makes the request this request: method, path, query, body and caller.
    fingerprint = models.CharField(max_length=64)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    body = models.TextField(blank=True, default="")
    content_type = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    locked_at = models.DateTimeField(null=True, blank=True, help_text="Set while the request is in hand")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "key"], name="idempotencykey_unique_workspace_key")
        ]

    def __str__(self) -> str:
        return f"idempotency key {self.key!r} of workspace {self.workspace_id}"
