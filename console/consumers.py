"""Live updates over websockets. The consumer never touches the database: the membership
middleware in front of it resolves the member's role, and publishers send ready-rendered
HTML fragments to the workspace's group (see ``console.live`` for the whole design). In the
embedded mode the first connection of a process starts the outbox relay (``memory.events``),
a task of its own: the consumer only counts its listeners."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from memory import events
from memory.events import workspace_group
from memory.models import Membership, Workspace
from memory.models.choices import Role

CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404


class WorkspaceMembershipMiddleware:
    """Puts ``workspace_id`` and ``workspace_role`` into the scope for a member of the workspace
    named in the route (superusers count as admins); leaves them out for anyone else."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        slug = scope.get("url_route", {}).get("kwargs", {}).get("slug", "")
        found = await _membership(scope.get("user"), slug)
        scope = {**scope, "workspace_id": found[0], "workspace_role": found[1]} if found else scope
        return await self.inner(scope, receive, send)


@database_sync_to_async
def _membership(user: Any, slug: str) -> tuple[int, str] | None:
    if user is None or not user.is_authenticated:
        return None
    if user.is_superuser:
        ws = Workspace.objects.filter(slug=slug).values_list("pk", flat=True).first()
        return (ws, Role.ADMIN) if ws else None
    row = (
        Membership.objects.filter(user=user, workspace__slug=slug).values_list("workspace_id", "role").first()
    )
    return (row[0], row[1]) if row else None


class WorkspaceLiveConsumer(AsyncWebsocketConsumer):
    group: str | None = None
    listening = False

    async def connect(self) -> None:
        if not self.scope.get("workspace_role"):
            # Not a member (or not logged in): refuse without saying whether the workspace exists.
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.group = workspace_group(self.scope["workspace_id"])
        await self.channel_layer.group_add(self.group, self.channel_name)
        events.listener_joined(self.channel_layer)
        self.listening = True
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.listening:
            self.listening = False
            events.listener_left()
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def workspace_update(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["html"])


class NotFoundConsumer(AsyncWebsocketConsumer):
    """Any other websocket path: a clean close instead of a server error."""

    async def connect(self) -> None:
        await self.close(code=CLOSE_NOT_FOUND)
