from django.contrib import admin

from maintenance.models import Backup, Dispute, MaintenanceLease, MaintenancePolicy, MaintenanceRun


@admin.register(MaintenancePolicy)
class MaintenancePolicyAdmin(admin.ModelAdmin):
    list_display = [
        "workspace",
        "importance_threshold",
        "prune_older_than_days",
        "cold_threshold",
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
