"""The Django admin, for superusers and staff. Every status change goes through the write
modules (memory.entry_changes, memory.accounts: the same functions the API and the console
call), so each one is recorded as a LifecycleEvent and rescored; nothing here writes a status,
a version or a key secret directly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from memory import accounts, entry_changes
from memory.errors import ServiceError
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

# Skipped rows named in one message; the rest are counted.
SKIPPED_SHOWN = 10


def _without_bulk_delete(actions: dict[str, Any]) -> dict[str, Any]:
    actions.pop("delete_selected", None)
    return actions


def _run_per_row(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    rows: QuerySet[Any],
    call: Callable[[Any, str], Any],
    done_label: str,
) -> None:
    """Call ``call(row, actor)`` for each row, each in its own transaction (inside the service).

    A row the service refuses (already tombstoned, an old version, nothing to restore) is
    skipped and reported; the others still go through. One page of skips is a message, not an
    error page."""
    actor = accounts.actor_for_user(request.user)
    done = 0
    skipped: list[str] = []
    for row in rows:
        try:
            call(row, actor)
        except ServiceError as exc:
            skipped.append(f"#{row.pk}: {exc.detail}")
        else:
            done += 1
    if done:
        modeladmin.message_user(request, f"{done_label} {done}.", messages.SUCCESS)
    if skipped:
        shown = "; ".join(skipped[:SKIPPED_SHOWN])
        more = f" (and {len(skipped) - SKIPPED_SHOWN} more)" if len(skipped) > SKIPPED_SHOWN else ""
        modeladmin.message_user(request, f"Skipped {len(skipped)} — {shown}{more}", messages.WARNING)


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
    # reads and revokes them. The hash is not shown: it is of no use to a person.
    exclude = ["secret_hash"]
    readonly_fields = ["workspace", "prefix", "created_at", "created_by", "last_used_at", "revoked_at"]
    actions = ["revoke_selected"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Deleting a key would lose who used it when; revoking keeps the row.
        return _without_bulk_delete(super().get_actions(request))

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        _run_per_row(
            self,
            request,
            queryset.select_related("workspace").order_by("pk"),
            lambda key, actor: accounts.api_key_revoke(workspace=key.workspace, key_id=key.pk),
            "Revoked keys:",
        )


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
    list_select_related = ["workspace", "score"]
    raw_id_fields = ["supersedes"]
    filter_horizontal = ["tags"]
    # Content, versions and status change only through the services (a new version, an event);
    # an edit here would leave content_hash, the lineage or the audit trail behind.
    readonly_fields = [
        "workspace",
        "content",
        "content_hash",
        "status",
        "status_changed_at",
        "archived_at",
        "lineage_id",
        "supersedes",
        "is_latest",
        "importance",
        "retention",
        "scored_at",
        "created_at",
        "updated_at",
    ]
    date_hierarchy = "created_at"
    inlines = [AnchorInline]
    actions = ["archive_selected", "restore_selected", "pin_selected", "unpin_selected", "tombstone_selected"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Entries come from the API, the console and import_entries, which hash, version and
        # record them; an admin-made row would have none of that.
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # A bulk hard delete would skip the tombstone and its grace period; "Tombstone
        # selected" is the way to remove entries.
        return _without_bulk_delete(super().get_actions(request))

    @admin.display(description="entry")
    def short_label(self, obj: Entry) -> str:
        return (obj.title or obj.content)[:80]

    def _each(
        self, request: HttpRequest, queryset: QuerySet[Entry], call: Callable[[Entry, str], Any], label: str
    ) -> None:
        # Each entry is handled in its own workspace: a selection may span several.
        _run_per_row(self, request, queryset.select_related("workspace").order_by("pk"), call, label)

    @admin.action(description="Archive selected entries", permissions=["change"])
    def archive_selected(self, request: HttpRequest, queryset: QuerySet[Entry]) -> None:
        self._each(
            request,
            queryset,
            lambda e, actor: entry_changes.entry_set_status(
                workspace=e.workspace, entry_id=e.pk, status="archived", reason="manual", actor=actor
            ),
            "Archived entries:",
        )

    @admin.action(description="Restore selected entries", permissions=["change"])
    def restore_selected(self, request: HttpRequest, queryset: QuerySet[Entry]) -> None:
        self._each(
            request,
            queryset,
            lambda e, actor: entry_changes.entry_restore(workspace=e.workspace, entry_id=e.pk, actor=actor),
            "Restored entries:",
        )

    @admin.action(description="Pin selected entries", permissions=["change"])
    def pin_selected(self, request: HttpRequest, queryset: QuerySet[Entry]) -> None:
        self._each(
            request,
            queryset,
            lambda e, actor: entry_changes.entry_set_pinned(
                workspace=e.workspace, entry_id=e.pk, pinned=True, actor=actor
            ),
            "Pinned entries:",
        )

    @admin.action(description="Unpin selected entries", permissions=["change"])
    def unpin_selected(self, request: HttpRequest, queryset: QuerySet[Entry]) -> None:
        self._each(
            request,
            queryset,
            lambda e, actor: entry_changes.entry_set_pinned(
                workspace=e.workspace, entry_id=e.pk, pinned=False, actor=actor
            ),
            "Unpinned entries:",
        )

    @admin.action(description="Tombstone selected entries", permissions=["delete"])
    def tombstone_selected(self, request: HttpRequest, queryset: QuerySet[Entry]) -> None:
        self._each(
            request,
            queryset,
            lambda e, actor: entry_changes.entry_tombstone(
                workspace=e.workspace, entry_id=e.pk, reason="manual", actor=actor
            ),
            "Tombstoned entries:",
        )


@admin.register(EntryAccess)
class EntryAccessAdmin(admin.ModelAdmin):
    list_display = ["lineage_id", "actor", "count", "first_at", "last_at", "workspace"]
    list_filter = ["workspace"]
    search_fields = ["actor"]
    list_select_related = ["workspace"]


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
