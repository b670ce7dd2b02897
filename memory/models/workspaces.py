"""Workspaces, their members, API keys and tags: every other row is scoped by a workspace, and
nothing crosses workspaces."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from memory.models.choices import (
    KeyRole,
    Role,
    choices_check,
)


class Workspace(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "workspace"], name="membership_unique_user_workspace"),
            choices_check("role", Role, "membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.workspace} ({self.role})"


class ApiKey(models.Model):
    """A bearer key. Only its sha256 is stored: keys are 256-bit random tokens, so a fast hash
    is enough (no dictionary to guard against) and lookups stay a single indexed query."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    role = models.CharField(max_length=16, choices=KeyRole.choices, default=KeyRole.AGENT)
    prefix = models.CharField(max_length=16, unique=True, help_text="Shown in the UI to tell keys apart")
    secret_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=200, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [choices_check("role", KeyRole, "apikey_role_valid")]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Tag(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=100)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="tag_unique_per_workspace")]

    def __str__(self) -> str:
        return self.name
