"""API authentication and roles.

Two ways in, both resolving to a ``Principal`` (workspace, role, actor); the MCP endpoint uses
the first (``key_principal``):

- ``Authorization: Bearer <key>``: the key fixes the workspace and the role (agent, operator,
  admin). Only the key's sha256 is stored; a revoked key is unknown.
- A browser session of a workspace member, with CSRF (django-ninja checks it for cookie
  auth), naming the workspace in the ``X-Workspace`` header or the ``workspace`` query
  parameter. Member roles are viewer, operator, admin; superusers act as admins.

Roles are ordered viewer < agent < operator < admin. ``require(request, role)`` is the one
check every endpoint calls; it answers 403 for a role too low. Ids of other workspaces are
never looked up outside the principal's workspace, so they answer 404, never 403.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Model
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer
from ninja.security.session import SessionAuth

from memory import rawsql
from memory.accounts import actor_for_key, actor_for_user, hash_key
from memory.errors import Forbidden, ServiceError
from memory.models import ApiKey, Membership, Workspace
from memory.models.choices import Role
from memory.policy import PolicyValues
from memory.policy_model import MaintenancePolicy

ROLE_LEVEL = {"viewer": 0, "agent": 1, "operator": 2, "admin": 3}
LAST_USED_RESOLUTION = timedelta(seconds=60)  # write last_used_at at most once a minute per key


class RateLimited(ServiceError):
    status_code = 429

    def __init__(self, retry_after: int):
        super().__init__(f"rate limit exceeded; retry in {retry_after} s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Principal:
    workspace: Workspace
    role: str
    actor: str
    key: ApiKey | None = None
    user: Any = None

    @property
    def level(self) -> int:
        return ROLE_LEVEL[self.role]


def principal(request: HttpRequest) -> Principal:
    found = getattr(request, "principal", None)
    if not isinstance(found, Principal):  # an endpoint without auth asked for one
        raise Forbidden("authentication required")
    return found


def require(request: HttpRequest, role: str) -> Principal:
    """The caller's principal, if its role is at least ``role``; else 403."""
    who = principal(request)
    if who.level < ROLE_LEVEL[role]:
        raise Forbidden(f"this action needs the {role} role; your role is {who.role}")
    return who


def _rate_limit(bucket: str) -> None:
    """Fixed one-minute windows counted in the cache (Redis in hosted mode, so every web
    process shares them; per process in embedded mode)."""
    limit = int(getattr(settings, "API_RATE_LIMIT_PER_MINUTE", 600))
    if limit <= 0:
        return
    window = int(time.time() // 60)
    key = f"ratelimit:{bucket}:{window}"
    cache.add(key, 0, timeout=120)
    try:
        count = cache.incr(key)
    except ValueError:  # evicted between add and incr
        cache.set(key, 1, timeout=120)
        count = 1
    if count > limit:
        raise RateLimited(retry_after=max(1, math.ceil((window + 1) * 60 - time.time())))


# What the key lookup reads, table alias and model: the key, its workspace and the
# workspace's maintenance policy (LEFT JOIN: a workspace may have none yet).
_LOOKUP: tuple[tuple[str, type[Model]], ...] = (("k", ApiKey), ("w", Workspace), ("p", MaintenancePolicy))


@functools.cache
def _live_key_sql(vendor: str) -> str:
    """``ApiKey.objects.select_related("workspace")`` plus the workspace's policy, filtered by
    hash and not revoked, as SQL written once: every API request runs it, and compiling it
    through the ORM each time was a share of every request's CPU (bench/reports/api.md,
    section "Figures moved from the code")."""
    q = connection.ops.quote_name
    columns = [f"{alias}.{q(f.column)}" for alias, model in _LOOKUP for f in model._meta.concrete_fields]
    return (
        f"SELECT {', '.join(columns)} FROM {q(ApiKey._meta.db_table)} k "
        f"JOIN {q(Workspace._meta.db_table)} w ON w.{q('id')} = k.{q('workspace_id')} "
        f"LEFT JOIN {q(MaintenancePolicy._meta.db_table)} p ON p.{q('workspace_id')} = w.{q('id')} "
        f"WHERE k.{q('secret_hash')} = %s AND k.{q('revoked_at')} IS NULL"
    )


def _live_key(secret_hash: str) -> ApiKey | None:
    """The unrevoked key with this hash, its workspace loaded, in one query. The workspace
    carries its policy as read now (``memory.writes.write_policy``: a write's scores need
    it, and this request has just read it)."""
    with connection.cursor() as cursor:
        cursor.execute(_live_key_sql(connection.vendor), [secret_hash])
        row = cursor.fetchone()
    if row is None:
        return None
    key, workspace = (_instance(model, row[start:end]) for model, start, end in _SPANS[:2])
    if not isinstance(key, ApiKey) or not isinstance(workspace, Workspace):
        return None
    _model, start, end = _SPANS[2]
    raw = tuple(row[start:end])
    try:
        policy = _policy_values(raw)
    except TypeError:  # a value the driver returned is not hashable: convert it uncached
        policy = _policy_values.__wrapped__(raw)
    workspace.__dict__["policy_at_auth"] = policy
    key.workspace = workspace
    return key


def _spans() -> list[tuple[type[Model], int, int]]:
    """Where each model's columns sit in the lookup's row."""
    spans, start = [], 0
    for _, model in _LOOKUP:
        end = start + len(model._meta.concrete_fields)
        spans.append((model, start, end))
        start = end
    return spans


_SPANS = _spans()


def _instance(model: type[Model], raw: Sequence[Any]) -> Model | None:
    """``model``'s instance from its columns of the row (None for a LEFT JOIN's missing row):
    the driver's values become Python values as in the ORM's own reads (SQLite returns
    datetimes as text)."""
    if raw[0] is None:  # the primary key
        return None
    return rawsql.instance(model, [f.attname for f in model._meta.concrete_fields], raw)


@functools.lru_cache(maxsize=256)
def _policy_values(raw: tuple[Any, ...]) -> PolicyValues:
    """The policy a row of maintenance_maintenancepolicy stands for, by the row's raw values
    (all hashable as the drivers return them: JSON comes back as text): the same row gives the
    same values, so reading the row on every request converts it once per change (a 28-field
    model and its clamping cost ~0.3 ms of every request's CPU)."""
    policy = _instance(MaintenancePolicy, raw)
    return policy.values() if isinstance(policy, MaintenancePolicy) else PolicyValues()


KEY_MAX = 200  # characters of a presented key: longer is no key of ours, refused unhashed


def key_principal(token: str) -> Principal | None:
    """The principal of a presented API key, or None when it is no live key: the one door of
    every key-authenticated request, the JSON API's (``BearerKey``) and the MCP endpoint's
    (``api.mcp``). The key's sha256 is looked up (a revoked key is unknown), its per-key
    rate limit counted (``RateLimited`` past it) and its ``last_used_at`` kept current to
    the minute."""
    if not token or len(token) > KEY_MAX:
        return None
    key = _live_key(hash_key(token))
    if key is None:
        return None
    _rate_limit(f"key:{key.pk}")
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return Principal(workspace=key.workspace, role=key.role, actor=actor_for_key(key), key=key)


class BearerKey(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Principal | None:
        found = key_principal(token)
        if found is not None:
            request.principal = found  # type: ignore[attr-defined]
        return found


class MemberSession(SessionAuth):
    """Session auth of a workspace member (CSRF enforced by django-ninja)."""

    def __call__(self, request: HttpRequest) -> Principal | None:
        # Without a session this is not ours to judge: answering the CSRF check here would turn
        # a missing key (401) into a 403.
        if not request.user.is_authenticated:
            return None
        return super().__call__(request)  # type: ignore[no-any-return]

    def authenticate(self, request: HttpRequest, key: str | None) -> Principal | None:
        user = request.user
        if not user.is_authenticated:
            return None
        slug = request.headers.get("X-Workspace") or request.GET.get("workspace") or ""
        workspace = Workspace.objects.filter(slug=slug).first() if slug else None
        if workspace is None:
            return None
        role: str
        if user.is_superuser:
            role = Role.ADMIN
        else:
            row = (
                Membership.objects.filter(user=user, workspace=workspace)
                .values_list("role", flat=True)
                .first()
            )
            if row is None:
                return None
            role = row
        _rate_limit(f"user:{user.pk}")
        found = Principal(workspace=workspace, role=role, actor=actor_for_user(user), user=user)
        request.principal = found  # type: ignore[attr-defined]
        return found


API_AUTH = [BearerKey(), MemberSession()]
