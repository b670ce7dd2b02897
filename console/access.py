"""Access to the console pages: every page of a workspace goes through
``workspace_page``, which checks membership and role in the view — a partial or an htmx
request can never bypass it.

- not logged in → the login page;
- not a member of the workspace (or no such workspace) → 404, so existence does not leak;
- a role below the page's → 403 (viewers see, operators act, admins also edit settings).

The decorated view receives a ``Console`` with the workspace, the member's role and the
actor string recorded in LifecycleEvents. Every POST needs CSRF (Django's middleware; htmx
sends the token from the ``hx-headers`` of ``base.html``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_POST

from memory.accounts import actor_for_user
from memory.auth import ROLE_LEVEL
from memory.models import Membership, Workspace
from memory.models.choices import Role


@dataclass(frozen=True)
class Console:
    workspace: Workspace
    role: str
    actor: str

    @property
    def can_act(self) -> bool:
        """Operators and admins act (archive, restore, revert, resolve, run)."""
        return ROLE_LEVEL[self.role] >= ROLE_LEVEL[Role.OPERATOR]

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN


def console_for(request: HttpRequest, slug: str) -> Console:
    """The member's view of workspace ``slug``, or 404."""
    user: Any = request.user
    workspace = Workspace.objects.filter(slug=slug).first()
    if workspace is None:
        raise Http404("no such workspace")
    role: str
    if user.is_superuser:
        role = Role.ADMIN
    else:
        found = (
            Membership.objects.filter(user=user, workspace=workspace).values_list("role", flat=True).first()
        )
        if found is None:
            raise Http404("no such workspace")
        role = found
    return Console(workspace=workspace, role=role, actor=actor_for_user(user))


def workspace_page(
    min_role: str = Role.VIEWER,
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Decorate ``view(request, console, **kwargs)`` routed with a ``slug`` parameter."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required
        @wraps(view)
        def wrapper(request: HttpRequest, slug: str, **kwargs: Any) -> HttpResponse:
            console = console_for(request, slug)
            if ROLE_LEVEL[console.role] < ROLE_LEVEL[min_role]:
                raise PermissionDenied(f"this needs the {min_role} role; yours is {console.role}")
            request.console = console  # type: ignore[attr-defined]  # for templates
            return view(request, console, **kwargs)

        return wrapper

    return decorate


def operator_action(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A state-changing console action: POST only, operator or admin. (Open pages hear of
    what it changed from the domain's announcement, as for every other door.)"""
    return workspace_page(Role.OPERATOR)(require_POST(view))
