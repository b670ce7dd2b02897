from django.contrib import admin

from maintenance.models import Backup, Dispute, MaintenanceLease, MaintenanceRun, Proposal, RunDaySummary
from memory.policy_model import MaintenancePolicy


@admin.register(MaintenancePolicy)
class MaintenancePolicyAdmin(admin.ModelAdmin):
    list_display = [
        "workspace",
        "importance_threshold",
        "prune_older_than_days",
        "cold_threshold",
        "review_mode",
        "tombstone_grace_days",
        "maintenance_interval_hours",
        "updated_at",
    ]
    search_fields = ["workspace__slug"]
    list_select_related = ["workspace"]


@admin.register(MaintenanceRun)
class MaintenanceRunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "workspace",
        "kind",
        "trigger",
        "dry_run",
        "status",
        "started_at",
        "finished_at",
    ]
    list_filter = ["kind", "status", "trigger", "dry_run", "workspace"]
    search_fields = ["workspace__slug", "backup_file", "error"]
    list_select_related = ["workspace"]
    date_hierarchy = "started_at"


@admin.register(MaintenanceLease)
class MaintenanceLeaseAdmin(admin.ModelAdmin):
    list_display = ["workspace", "holder", "run", "acquired_at", "renewed_at"]
    list_filter = [("run", admin.EmptyFieldListFilter)]
    search_fields = ["workspace__slug", "holder"]
    list_select_related = ["workspace", "run"]
    # Claimed and renewed only by conditional UPDATEs in maintenance; a hand edit would break
    # the one-run-per-workspace guarantee, so the admin shows leases without changing them.
    readonly_fields = ["workspace", "holder", "run", "acquired_at", "renewed_at"]


@admin.register(Dispute)
class DisputeAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "workspace",
        "entry_a_id",
        "entry_b_id",
        "similarity",
        "detected_by",
        "status",
        "resolution",
    ]
    list_filter = ["status", "resolution", "detected_by", "workspace"]
    search_fields = ["entry_a__content", "entry_b__content"]
    raw_id_fields = ["entry_a", "entry_b", "run"]
    list_select_related = ["workspace"]


@admin.register(Backup)
class BackupAdmin(admin.ModelAdmin):
    list_display = ["file_name", "workspace", "reason", "entry_count", "size_bytes", "created_at"]
    list_filter = ["reason", "workspace"]
    search_fields = ["file_name", "sha256"]
    list_select_related = ["workspace"]


@admin.register(Proposal)
class ProposalAdmin(admin.ModelAdmin):
    """Read-only: proposals are decided through maintenance.proposals (approve re-checks each
    one and writes its backup and events; a hand edit would skip all that)."""

    list_display = ["id", "workspace", "entry_ref", "action", "reason", "status", "why", "run", "created_at"]
    list_filter = ["status", "action", "reason", "workspace"]
    search_fields = ["why", "note", "decided_by"]
    list_select_related = ["workspace", "run"]
    readonly_fields = [f.name for f in Proposal._meta.fields]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False


@admin.register(RunDaySummary)
class RunDaySummaryAdmin(admin.ModelAdmin):
    """Read-only: the reclaim pass folds runs that changed nothing into these counts."""

    list_display = ["day", "workspace", "kind", "status", "dry_run", "runs"]
    list_filter = ["kind", "status", "dry_run", "workspace"]
    search_fields = ["workspace__slug"]
    list_select_related = ["workspace"]
    date_hierarchy = "day"
    readonly_fields = [f.name for f in RunDaySummary._meta.fields]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False
