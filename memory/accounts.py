"""Workspaces, their members and API keys, and the actor names of users and keys.

A key's secret is returned once at creation and only its hash is stored."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Any

from django.db import transaction

from memory.errors import Conflict, InvalidInput, NotFound
from memory.models import ApiKey, Membership, Workspace
from memory.models.choices import KeyRole, Role
from memory.policy import PROPOSE
from memory.policy_model import MaintenancePolicy
from memory.write_input import (
    valid_choice,
    valid_text,
)
from memory.writes import (
    SYSTEM_ACTOR,
    resolve_now,
)


def actor_for_user(user: Any) -> str:
    return f"user:{user.get_username()}"


def actor_for_key(key: ApiKey) -> str:
    return f"key:{key.prefix}"


def workspace_create(*, slug: str, name: str = "", review_mode: str | None = None) -> Workspace:
    """A workspace with its policy row. ``review_mode`` defaults to propose: nothing
    is archived or tombstoned before an operator has approved it."""
    from django.core.exceptions import ValidationError
    from django.core.validators import validate_slug

    try:
        validate_slug(slug)
    except ValidationError:
        raise InvalidInput(f"slug: {slug!r} may contain only letters, digits, '-' and '_'") from None
    with transaction.atomic():
        if Workspace.objects.filter(slug=slug).exists():
            raise Conflict(f"workspace {slug!r} already exists")
        workspace = Workspace.objects.create(slug=slug, name=name or slug)
        MaintenancePolicy.objects.create(workspace=workspace, review_mode=review_mode or PROPOSE)
    return workspace


def workspace_get(slug: str) -> Workspace:
    try:
        return Workspace.objects.get(slug=slug)
    except Workspace.DoesNotExist:
        raise NotFound(f"workspace {slug!r} not found") from None


def membership_set(*, workspace: Workspace, user: Any, role: str) -> Membership:
    valid_choice(role, Role.values, "role")
    membership, _ = Membership.objects.update_or_create(
        user=user, workspace=workspace, defaults={"role": role}
    )
    return membership


def api_key_create(
    *, workspace: Workspace, name: str, role: str, actor: str = SYSTEM_ACTOR
) -> tuple[ApiKey, str]:
    """Create a key and return it with its secret, which is never stored and never shown again."""
    valid_choice(role, KeyRole.values, "role")
    valid_text(name, "name", 100, required=True)
    raw = "msk_" + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        workspace=workspace,
        name=name,
        role=role,
        prefix=raw[:12],
        secret_hash=hash_key(raw),
        created_by=actor,
    )
    return key, raw


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def api_key_revoke(*, workspace: Workspace, key_id: int, now: datetime | None = None) -> ApiKey:
    key = ApiKey.objects.filter(workspace=workspace, pk=key_id).first()
    if key is None:
        raise NotFound(f"api key {key_id} not found")
    if key.revoked_at is None:
        key.revoked_at = resolve_now(now)
        key.save(update_fields=["revoked_at"])
    return key
