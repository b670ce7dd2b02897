from django.contrib import admin

from memory.models import (
    ApiKey,
    CodeAnchor,
    Entry,
    EntryAccess,
    LifecycleEvent,
    Membership,
    Relationship,
    Tag,
    Tombstone,
    Workspace,
)


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "workspace", "role", "created_at"]
    list_filter = ["role", "workspace"]
    search_fields = ["user__username", "workspace__slug"]
    list_select_related = ["user", "workspace"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "prefix",
        "name",
        "workspace",
        "role",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["role", "workspace", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name", "workspace__slug"]
    list_select_related = ["workspace"]
    # Keys are created by `manage.py create_api_key` (the secret is shown once); the admin only
    # reads and revokes them.
    readonly_fields = ["prefix", "secret_hash", "created_at", "created_by", "last_used_at"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False


@admin.register(Tag)
class TagAdmin(admin.ModelAdmin):
    list_display = ["name", "workspace"]
    list_filter = ["workspace"]
    search_fields = ["name"]
    list_select_related = ["workspace"]


class AnchorInline(admin.TabularInline):
    model = CodeAnchor
    extra = 0
    fields = ["repo", "path", "commit", "line_start", "line_end", "status", "checked_at"]


@admin.register(Entry)
class EntryAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "short_label",
        "workspace",
        "entry_type",
        "tier",
        "source",
        "status",
        "importance",
        "retention",
        "pinned",
        "is_latest",
        "created_at",
    ]
    list_filter = [
        "workspace",
        "status",
        "entry_type",
        "tier",
        "source",
        "pinned",
        "is_latest",
        "staged_class",
    ]
    search_fields = ["title", "content", "external_id", "project", "session_key"]
    list_select_related = ["workspace"]
    raw_id_fields = ["supersedes"]
    filter_horizontal = ["tags"]
    readonly_fields = ["content_hash", "lineage_id", "importance", "retention", "scored_at"]
    date_hierarchy = "created_at"
    inlines = [AnchorInline]

    @admin.display(description="entry")
    def short_label(self, obj: Entry) -> str:
        return (obj.title or obj.content)[:80]


@admin.register(EntryAccess)
class EntryAccessAdmin(admin.ModelAdmin):
    list_display = ["lineage_id", "actor", "count", "first_at", "last_at", "workspace"]
    list_filter = ["workspace"]
    search_fields = ["actor"]


@admin.register(Relationship)
class RelationshipAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "from_entry_id",
        "type",
        "to_entry_id",
        "workspace",
        "created_at",
        "pruned_at",
    ]
    list_filter = ["type", "workspace", ("pruned_at", admin.EmptyFieldListFilter)]
    search_fields = ["from_entry__title", "to_entry__title", "created_by"]
    raw_id_fields = ["from_entry", "to_entry"]
    list_select_related = ["workspace"]


@admin.register(CodeAnchor)
class CodeAnchorAdmin(admin.ModelAdmin):
    list_display = ["path", "repo", "commit", "status", "entry_id", "checked_at"]
    list_filter = ["status", "workspace", "repo"]
    search_fields = ["path", "repo", "commit"]
    raw_id_fields = ["entry"]


@admin.register(Tombstone)
class TombstoneAdmin(admin.ModelAdmin):
    list_display = [
        "entry_ref",
        "workspace",
        "reason",
        "actor",
        "created_at",
        "purge_after",
        "restored_at",
        "purged_at",
    ]
    list_filter = [
        "reason",
        "workspace",
        ("restored_at", admin.EmptyFieldListFilter),
        ("purged_at", admin.EmptyFieldListFilter),
    ]
    search_fields = ["entry_ref", "actor", "content_hash"]
    raw_id_fields = ["entry", "run"]
    list_select_related = ["workspace"]


@admin.register(LifecycleEvent)
class LifecycleEventAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "entry_ref",
        "from_status",
        "to_status",
        "reason",
        "automatic",
        "actor",
        "run_id",
    ]
    list_filter = ["to_status", "reason", "automatic", "workspace"]
    search_fields = ["entry_ref", "actor", "reason"]
    raw_id_fields = ["entry", "run", "reverts"]
    date_hierarchy = "created_at"
