"""Reads that span models. Every function takes the workspace (or the user) it is scoped to."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, QuerySet

from memory.models import Entry, Membership, Status, Workspace


def workspaces_for_user(user: Any) -> QuerySet[Workspace]:
    if not getattr(user, "is_authenticated", False):
        return Workspace.objects.none()
    if user.is_superuser:
        return Workspace.objects.all()
    return Workspace.objects.filter(memberships__user=user)


def membership_role(user: Any, workspace: Workspace) -> str | None:
    row = Membership.objects.filter(user=user, workspace=workspace).values_list("role", flat=True).first()
    return row


def status_counts(workspace: Workspace) -> dict[str, int]:
    """Latest entries of a workspace by status, in one query."""
    rows = (
        Entry.objects.of(workspace)
        .latest_versions()
        .values("status")
        .annotate(n=Count("id"))
        .order_by("status")
    )
    return {row["status"]: row["n"] for row in rows}


def workspace_summaries(user: Any) -> list[dict[str, Any]]:
    """Each workspace the user may see with its entry counts by status (two queries in all)."""
    workspaces = list(workspaces_for_user(user).order_by("slug"))
    rows = (
        Entry.objects.filter(workspace__in=workspaces, is_latest=True)
        .values("workspace_id", "status")
        .annotate(n=Count("id"))
    )
    counts: dict[int, dict[str, int]] = {}
    for row in rows:
        counts.setdefault(row["workspace_id"], {})[row["status"]] = row["n"]
    return [
        {
            "workspace": ws,
            "counts": counts.get(ws.pk, {}),
            "cells": [counts.get(ws.pk, {}).get(status, 0) for status in Status.values],
        }
        for ws in workspaces
    ]
