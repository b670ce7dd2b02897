"""Maintenance state: per-workspace lease, runs with their counts, disputes and
backups."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from memory.models import Entry, Workspace


class RunKind(models.TextChoices):
    FULL = "full"
    PRUNE = "prune"
    DECAY = "decay"
    HYGIENE = "hygiene"
    CONTRADICTIONS = "contradictions"
    CONSOLIDATE = "consolidate"


class RunTrigger(models.TextChoices):
    SCHEDULE = "schedule"
    API = "api"
    CLI = "cli"
    UI = "ui"


class RunStatus(models.TextChoices):
    QUEUED = "queued"  # recorded and handed to the worker (django-q2); not started yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    PROPOSED = "proposed"
    FAILED = "failed"
    BLOCKED = "blocked"
    SKIPPED = "skipped"


class MaintenanceRun(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="runs")
    kind = models.CharField(max_length=16, choices=RunKind.choices)
    trigger = models.CharField(max_length=16, choices=RunTrigger.choices)
    dry_run = models.BooleanField(default=False)
    forced = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    actor = models.CharField(max_length=200, default="system")
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    params = models.JSONField(default=dict, blank=True, help_text="Effective parameters")
    counts = models.JSONField(default=dict, blank=True)
    affected = models.JSONField(
        default=dict,
        blank=True,
        help_text="The first AFFECTED_KEPT entry ids of each action (a bounded sample; the complete "
        "lists of a real run are its LifecycleEvents)",
    )
    affected_total = models.JSONField(
        default=dict,
        blank=True,
        help_text="How many entries each action has (archived, tombstoned, purged, proposed_archive, "
        "proposed_tombstone): the true lengths of the lists ``affected`` samples",
    )
    progress = models.JSONField(
        default=dict,
        blank=True,
        help_text="While it works: phase, current pass, passes done, rows done, elapsed seconds",
    )
    result = models.JSONField(default=dict, blank=True, help_text="The result object returned to callers")
    backup_file = models.CharField(max_length=300, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["workspace", "kind", "-started_at"], name="run_history")]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=RunKind.values), name="run_kind_valid"),
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_status_valid"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} {self.kind} ({self.status})"


class RunDaySummary(models.Model):
    """Runs that changed nothing (and skipped ones), folded by the reclaim pass once they are a
    week old: how many runs of one kind, status and dry-run flag started on one UTC day. The
    run history shows these counts where the single rows were."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="run_days")
    day = models.DateField(help_text="UTC day the runs started")
    kind = models.CharField(max_length=16, choices=RunKind.choices)
    status = models.CharField(max_length=16, choices=RunStatus.choices)
    dry_run = models.BooleanField(default=False)
    runs = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name_plural = "run day summaries"
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "day", "kind", "status", "dry_run"], name="run_day_once"
            ),
        ]
        indexes = [models.Index(fields=["workspace", "-day"], name="run_day_recent")]

    def __str__(self) -> str:
        return f"{self.runs} {self.kind} runs {self.status} on {self.day}"


class MaintenanceLease(models.Model):
    """The maintenance lease of a workspace: claimed and renewed with conditional UPDATEs so
    that only one run works on a workspace at a time, across processes and machines."""

    workspace = models.OneToOneField(Workspace, on_delete=models.CASCADE, related_name="lease")
    holder = models.CharField(max_length=64, blank=True, help_text="Empty when free")
    run = models.ForeignKey(
        MaintenanceRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    acquired_at = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"lease of {self.workspace_id}: {self.holder or 'free'}"


class DisputeStatus(models.TextChoices):
    OPEN = "open"
    RESOLVED = "resolved"


class Resolution(models.TextChoices):
    KEEP_BOTH = "keep_both"
    KEEP_FIRST = "keep_first"
    KEEP_SECOND = "keep_second"
    SUPERSEDE = "supersede"


class Dispute(models.Model):
    """Two entries that contradict each other, stored once per pair (entry_a < entry_b)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="disputes")
    entry_a = models.ForeignKey(Entry, on_delete=models.CASCADE, related_name="+")
    entry_b = models.ForeignKey(Entry, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32, default="polarity_conflict")
    similarity = models.FloatField(default=0.0)
    detected_by = models.CharField(max_length=16, choices=[("sweep", "sweep"), ("write", "write")])
    status = models.CharField(max_length=16, choices=DisputeStatus.choices, default=DisputeStatus.OPEN)
    resolution = models.CharField(max_length=16, choices=Resolution.choices, blank=True)
    resolved_by = models.CharField(max_length=200, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    run = models.ForeignKey(
        MaintenanceRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["entry_a", "entry_b", "kind"], name="dispute_once_per_pair"),
            models.CheckConstraint(condition=Q(entry_a__lt=F("entry_b")), name="dispute_pair_ordered"),
        ]
        indexes = [models.Index(fields=["workspace", "status", "-created_at"], name="dispute_queue")]

    def __str__(self) -> str:
        return f"dispute {self.entry_a_id} ⟂ {self.entry_b_id} ({self.status})"


class BackupReason(models.TextChoices):
    PRE_PRUNE = "pre-prune"
    MANUAL = "manual"


class Backup(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="backups")
    file_name = models.CharField(max_length=300)
    reason = models.CharField(max_length=16, choices=BackupReason.choices)
    size_bytes = models.BigIntegerField(default=0)
    entry_count = models.IntegerField(default=0)
    sha256 = models.CharField(max_length=64)
    run = models.ForeignKey(
        MaintenanceRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "file_name"], name="backup_unique_file"),
        ]

    def __str__(self) -> str:
        return self.file_name


class ProposalAction(models.TextChoices):
    ARCHIVE = "archive"
    TOMBSTONE = "tombstone"


class ProposalStatus(models.TextChoices):
    OPEN = "open"
    APPROVED = "approved"
    REJECTED = "rejected"
    SKIPPED = "skipped"  # approved, but the re-check found it no longer held (``note`` says why)
    SUPERSEDED = "superseded"  # a newer run of the same passes no longer proposed it


class Proposal(models.Model):
    """A change a propose-mode run would have made. The open ones of a workspace
    are its one proposal set: a later run of the same passes confirms (moves to itself), adds
    or supersedes them, so the set never grows past what automation currently wants."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="proposals")
    run = models.ForeignKey(MaintenanceRun, on_delete=models.CASCADE, related_name="proposals")
    # A proposal outlives its entry's purge as a closed record, like a Tombstone.
    entry = models.ForeignKey(Entry, null=True, on_delete=models.SET_NULL, related_name="+")
    entry_ref = models.BigIntegerField()
    action = models.CharField(max_length=16, choices=ProposalAction.choices)
    reason = models.CharField(max_length=32, help_text="The count key of the pass that proposed it")
    values = models.JSONField(default=dict, blank=True, help_text="The values that decided it")
    why = models.CharField(max_length=300, blank=True, help_text="The deciding values, in words")
    status = models.CharField(max_length=16, choices=ProposalStatus.choices, default=ProposalStatus.OPEN)
    created_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=200, blank=True)
    note = models.CharField(max_length=300, blank=True, help_text="Why an approval skipped it")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(action__in=ProposalAction.values), name="proposal_action_valid"
            ),
            models.CheckConstraint(
                condition=Q(status__in=ProposalStatus.values), name="proposal_status_valid"
            ),
            models.UniqueConstraint(
                fields=["entry_ref", "action"],
                condition=Q(status="open"),
                name="proposal_one_open_per_entry_action",
            ),
        ]
        indexes = [
            models.Index(
                fields=["workspace", "reason", "entry_ref"],
                condition=Q(status="open"),
                name="proposal_open_set",
            ),
            models.Index(fields=["run", "entry_ref"], name="proposal_by_run"),
        ]

    def __str__(self) -> str:
        return f"proposal {self.action} #{self.entry_ref} ({self.reason}, {self.status})"


class PlanScore(models.Model):
    """A run's plan scores every latest entry into this *temporary* table (created inside the
    plan's transaction, gone with it) instead of rewriting the wide, indexed ``memory_entry``
    row of each entry only to roll the writes back: the plan's passes read importance and
    retention from here (``memory.scoring_db.plan_scores``). Never a real table."""

    entry_id = models.BigIntegerField(primary_key=True)
    importance = models.FloatField()
    retention = models.FloatField()

    class Meta:
        managed = False
        db_table = "maintenance_planscore"

    def __str__(self) -> str:
        return f"plan score of entry {self.entry_id}"


class PlanStatus(models.Model):
    """The status changes a run's plan decided, kept in this *temporary* table (created inside
    the plan's transaction, gone with it) instead of written into ``memory_entry`` and rolled
    back (``maintenance.plan_status``). Never a real table."""

    entry_id = models.BigIntegerField(primary_key=True)
    status = models.CharField(max_length=16)
    changed_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "maintenance_planstatus"

    def __str__(self) -> str:
        return f"planned status of entry {self.entry_id}"


class HygieneAssessment(models.Model):
    """The text half of an entry's hygiene assessment, kept so that the preview, the review
    page's count and pass 6 do not re-run the text detectors over every entry on every call.
    Valid while the entry's title and content hash are the ones assessed and the residue
    patterns (with the detectors' version) are the ones of ``patterns_key``; anything else is
    assessed again and stored over it. The cheap reasons (duplicate, feedback, import) are
    never stored: they are read off the entry each time."""

    entry = models.OneToOneField(Entry, on_delete=models.CASCADE, primary_key=True, related_name="+")
    content_hash = models.CharField(max_length=64)
    title = models.TextField(blank=True)
    patterns_key = models.CharField(max_length=64)
    reasons = models.JSONField(default=list)  # [{"code", "points", "detail"}] of the text detectors
    points = models.IntegerField(
        default=0, db_default=0, help_text="The reasons' points summed (the SQL score reads it)"
    )

    def __str__(self) -> str:
        return f"hygiene assessment of entry {self.entry_id}"


class HygieneRank(models.Model):
    """The hygiene queue kept ranked, so that its first page and its count read a narrow index
    instead of scoring every active entry on every call (``maintenance.hygiene_rank``). One row
    per latest active entry that automation may touch by its own columns (managed source, not
    constitutional, not pinned, not kept) and that is listed (points ≥ CANDIDATE_SCORE) or not
    assessed yet (points NULL). What may change without a write to the entry is read beside it
    when the queue is read: the hold's age (``held_at``) and the policy's excluded tags.
    Kept by folding the entries marked in ``HygieneRankDirty``; a different rank key (residue
    patterns, detector version, points) rebuilds the workspace's rows (``HygieneRankState``)."""

    entry_id = models.BigIntegerField(primary_key=True)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+", db_index=False)
    points = models.IntegerField(null=True)
    created_at = models.DateTimeField()
    held_at = models.DateTimeField(null=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["workspace", "-points", "created_at", "entry_id"], name="hygiene_rank_order"
            ),
        ]

    def __str__(self) -> str:
        return f"hygiene rank of entry {self.entry_id}"


class HygieneRankDirty(models.Model):
    """Entries whose hygiene rank may have changed, written by database triggers on
    ``memory_entry`` (a change of any column the rank reads: inserts, deletes, and updates of
    status, latest flag, title, content hash, source, feedback, tier, pin, hold, keep, created)
    and on ``maintenance_hygieneassessment``: no door of the product can change an entry
    without the rank hearing of it. ``content_hash`` names the copies whose duplicate points
    may have changed with it (NULL: the entry alone). Several rows for one entry are fine:
    folding claims them all."""

    workspace_id = models.BigIntegerField()
    entry_id = models.BigIntegerField()
    content_hash = models.CharField(max_length=64, null=True)

    class Meta:
        indexes = [models.Index(fields=["workspace_id", "id"], name="hygiene_dirty_by_workspace")]

    def __str__(self) -> str:
        return f"hygiene rank of entry {self.entry_id} to fold"


class HygieneRankState(models.Model):
    """The key a workspace's ``HygieneRank`` rows were computed with; its row is also the lock
    that lets one fold at a time work on them."""

    workspace = models.OneToOneField(Workspace, on_delete=models.CASCADE, primary_key=True, related_name="+")
    rank_key = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"hygiene rank state of {self.workspace_id}"
