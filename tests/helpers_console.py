"""Helpers shared by the console page tests."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.test import Client

from memory import accounts
from memory.models import Workspace


def login(client: Client, workspace: Workspace, role: str = "operator", username: str | None = None) -> Any:
    """A member of ``workspace`` with ``role`` (user ``<role>-user`` unless named), logged in."""
    user, _ = get_user_model().objects.get_or_create(username=username or f"{role}-user")
    accounts.membership_set(workspace=workspace, user=user, role=role)
    client.force_login(user)
    return user
