"""Publishing live updates: one function, called inside the write's transaction, that delivers
after commit (a rolled-back write must not announce anything)."""

from __future__ import annotations

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction


def workspace_group(workspace_id: int) -> str:
    return f"workspace.{workspace_id}"


def publish_html(workspace_id: int, html: str) -> None:
    """Send an HTML fragment (htmx out-of-band swaps) to every open page of the workspace."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(
                workspace_group(workspace_id), {"type": "workspace.update", "html": html}
            )

    transaction.on_commit(send)
