"""A workspace's maintenance policy as stored: one row per workspace, its values clamped on
save and again when read (``memory.policy`` holds the limits and the rules)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields as dc_fields
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils import timezone

from memory.models import Workspace
from memory.policy import (
    LIMITS,
    PROPOSE,
    REVIEW_MODES,
    PolicyValues,
    clamp_value,
    clean_residue_patterns,
    clean_review_mode,
    clean_tags,
)


def _limit_field(name: str) -> models.Field[Any, Any]:
    limit = LIMITS[name]
    help_text = f"default {limit.default}, range {limit.low}..{limit.high}"
    if limit.integer:
        return models.IntegerField(default=int(limit.default), help_text=help_text)
    return models.FloatField(default=limit.default, help_text=help_text)


class MaintenancePolicy(models.Model):
    """One per workspace; read fresh at the start of every run. Values are clamped on save and
    again when read, so a hand-edited row can never push a run out of range."""

    workspace = models.OneToOneField(Workspace, on_delete=models.CASCADE, related_name="policy")
    importance_threshold = _limit_field("importance_threshold")
    archive_older_than_days = _limit_field("archive_older_than_days")
    prune_older_than_days = _limit_field("prune_older_than_days")
    hard_delete_older_than_days = _limit_field("hard_delete_older_than_days")
    decay_lambda = _limit_field("decay_lambda")
    decay_sigma = _limit_field("decay_sigma")
    decay_mu = _limit_field("decay_mu")
    salience_default = _limit_field("salience_default")
    cold_threshold = _limit_field("cold_threshold")
    breadth_weight = _limit_field("breadth_weight")
    tombstone_grace_days = _limit_field("tombstone_grace_days")
    decay_interval_seconds = _limit_field("decay_interval_seconds")
    maintenance_interval_hours = _limit_field("maintenance_interval_hours")
    stale_after_days = _limit_field("stale_after_days")
    archive_after_days = _limit_field("archive_after_days")
    reclaim_archived_after_days = _limit_field("reclaim_archived_after_days")
    low_quality_min_age_days = _limit_field("low_quality_min_age_days")
    contradiction_batch = _limit_field("contradiction_batch")
    contradiction_max_flags = _limit_field("contradiction_max_flags")
    consolidation_min_group = _limit_field("consolidation_min_group")
    consolidation_min_age_days = _limit_field("consolidation_min_age_days")
    max_tombstone_fraction = _limit_field("max_tombstone_fraction")
    backups_keep = _limit_field("backups_keep")
    operator_hold_days = _limit_field("operator_hold_days")
    audit_retention_days = _limit_field("audit_retention_days")
    review_mode = models.CharField(
        max_length=8,
        choices=[(m, m) for m in REVIEW_MODES],
        default=PROPOSE,
        help_text="propose: automation proposes archives and tombstones for an operator to approve; "
        "apply: it applies them at once",
    )
    exclude_tags = models.JSONField(default=list, blank=True, help_text="Tags no pass may touch")
    residue_patterns = models.JSONField(
        null=True, blank=True, help_text="Hygiene implementation_residue patterns; empty = built-in"
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "maintenance_maintenancepolicy"  # the table it had when maintenance held it
        verbose_name_plural = "maintenance policies"

    def __str__(self) -> str:
        return f"policy of {self.workspace_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.clamp()
        self.updated_at = timezone.now()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        """Admin form validation: residue patterns must compile (the API checks the same)."""
        try:
            self.residue_patterns = clean_residue_patterns(self.residue_patterns)
        except ValueError as exc:
            raise ValidationError({"residue_patterns": str(exc)}) from None

    def clamp(self) -> None:
        for name in LIMITS:
            setattr(self, name, clamp_value(name, getattr(self, name)))
        self.exclude_tags = clean_tags(self.exclude_tags)
        self.review_mode = clean_review_mode(self.review_mode)

    def values(self) -> PolicyValues:
        data = {f.name: getattr(self, f.name) for f in dc_fields(PolicyValues)}
        return PolicyValues.from_mapping(data)

    @classmethod
    def read(cls, workspace: Workspace) -> MaintenancePolicy:
        """The one read of a workspace's policy: its row, fresh, or an unsaved one with the
        defaults when it has none yet (a read never writes). One query."""
        row = cls.objects.filter(workspace=workspace).first()
        return row or cls(workspace=workspace)

    @classmethod
    def for_workspace(cls, workspace: Workspace) -> PolicyValues:
        """The effective policy (``read``), clamped: what a run decides with."""
        return cls.read(workspace).values()

    @classmethod
    def write(cls, workspace: Workspace, changes: Mapping[str, Any]) -> MaintenancePolicy:
        """The one write of a workspace's policy (the API, the settings page): only the named
        settings, clamped, under a row lock, so two admins changing different settings at once
        both win. Residue patterns are validated first (ValueError names the problem); the row
        is created with the defaults when the workspace has none."""
        unknown = set(changes) - set(POLICY_FIELDS)
        if unknown:
            raise ValueError(f"not policy settings: {', '.join(sorted(unknown))}")
        changes = dict(changes)
        if "residue_patterns" in changes:
            changes["residue_patterns"] = clean_residue_patterns(changes["residue_patterns"])
        with transaction.atomic():
            row, _ = cls.objects.select_for_update().get_or_create(workspace=workspace)
            if changes:
                for name, value in changes.items():
                    setattr(row, name, value)
                row.save(update_fields=[*changes, "updated_at"])
        return row


# The settings, in the order the settings page shows them: what ``MaintenancePolicy.write`` may
# change (not the workspace, not the stamp).
POLICY_FIELDS = ("review_mode", *LIMITS, "exclude_tags", "residue_patterns")
