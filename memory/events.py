"""Delivering live updates: ready-rendered HTML fragments to every open page of a workspace.

Two transports, chosen by the channel layer (``CHANNEL_LAYERS``; the design is described in
``console.live``):

- **Shared layer** (channels-redis, ``REDIS_URL`` set): ``deliver`` sends straight to the
  workspace's group; every web process on every machine receives it.
- **Per-process layer** (InMemoryChannelLayer, the embedded default): ``deliver`` sends to the
  local group (pages served by this very process get it at once) *and* writes a ``LiveMessage``
  row, the outbox. Each web process runs one ``relay`` task that polls the outbox and forwards
  the rows written by *other* processes (a django-q2 worker, a ``manage.py maintain``) to its
  local group.

Nothing here may break or slow the write that announces: every failure is logged and dropped,
a send waits at most ``SEND_TIMEOUT`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import BaseChannelLayer, InMemoryChannelLayer, get_channel_layer
from django.db import connections, transaction
from django.utils import timezone

from memory.models import LiveMessage

log = logging.getLogger(__name__)

SEND_TIMEOUT = 2.0  # seconds; a layer that does not answer by then loses the message, not the run
RELAY_INTERVAL = 0.5  # seconds between two polls of the outbox
RELAY_LOOKBACK = timedelta(seconds=10)  # rows committed out of id order are still picked up
RELAY_IDLE_EXIT = 60.0  # seconds without any open websocket before the relay stops
RETENTION = timedelta(minutes=5)  # outbox rows older than this are deleted
CLEAN_EVERY = 60.0  # seconds between two clean-ups by one process
RELAY_BATCH = 200

_RANDOM = secrets.token_hex(4)


def workspace_group(workspace_id: int) -> str:
    return f"workspace.{workspace_id}"


def origin() -> str:
    """This process (a forked child gets its own, since the pid is part of it)."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{_RANDOM}"


def uses_outbox(layer: BaseChannelLayer | None = None) -> bool:
    """True when the channel layer reaches only this process, so other processes need the
    outbox to reach the pages this process serves."""
    layer = layer if layer is not None else get_channel_layer()
    return isinstance(layer, InMemoryChannelLayer)


def publish_html(workspace_id: int, html: str) -> None:
    """Send an HTML fragment (htmx out-of-band swaps) to every open page of the workspace, once
    the current transaction commits (a rolled-back write announces nothing)."""
    transaction.on_commit(lambda: deliver(workspace_id, html), robust=True)


def _layer(workspace_id: int) -> BaseChannelLayer | None:
    try:
        return get_channel_layer()
    except Exception:
        log.exception("live update of workspace %s dropped: no channel layer", workspace_id)
        return None


def deliver(workspace_id: int, html: str) -> None:
    """Send now (call it after commit). Never raises."""
    layer = _layer(workspace_id)
    if layer is None:
        return
    if uses_outbox(layer):
        _write_outbox(workspace_id, html)
    _send(layer, workspace_id, html)


def deliver_aside(workspace_id: int, html: str, cursor: Any) -> None:
    """Send now from inside a transaction that will be rolled back (a maintenance plan): the
    outbox row, when the layer needs one, is written through ``cursor``, a connection of its
    own that commits at once. Never raises."""
    layer = _layer(workspace_id)
    if layer is None:
        return
    if uses_outbox(layer):
        try:
            cursor.execute(
                f"INSERT INTO {LiveMessage._meta.db_table} (workspace_id, html, origin, created_at)"
                " VALUES (%s, %s, %s, %s)",
                [workspace_id, html, origin(), timezone.now()],
            )
        except Exception:
            log.warning("live update of workspace %s not written to the outbox", workspace_id, exc_info=True)
    _send(layer, workspace_id, html)


def _send(layer: BaseChannelLayer, workspace_id: int, html: str) -> None:
    message = {"type": "workspace.update", "html": html}

    async def send() -> None:
        await asyncio.wait_for(layer.group_send(workspace_group(workspace_id), message), SEND_TIMEOUT)

    try:
        async_to_sync(send)()
    except Exception:
        log.warning("live update of workspace %s not sent", workspace_id, exc_info=True)


_last_clean = 0.0


def _write_outbox(workspace_id: int, html: str) -> None:
    global _last_clean
    try:
        LiveMessage.objects.create(workspace_id=workspace_id, html=html, origin=origin())
        if time.monotonic() - _last_clean > CLEAN_EVERY:
            _last_clean = time.monotonic()
            clean_outbox()
    except Exception:
        log.warning("live update of workspace %s not written to the outbox", workspace_id, exc_info=True)


def clean_outbox(now: Any = None) -> int:
    """Delete outbox rows older than ``RETENTION``; how many went."""
    cutoff = (now or timezone.now()) - RETENTION
    deleted, _ = LiveMessage.objects.filter(created_at__lt=cutoff).delete()
    return deleted


# --- the relay (web processes, embedded mode) ------------------------------------------------------


class Relay:
    """Forwards outbox rows written by other processes to this process's channel layer.

    ``step`` is one poll: rows with an id above the cursor, plus rows of the last
    ``RELAY_LOOKBACK`` not yet seen (on PostgreSQL a smaller id can commit after a larger one);
    rows written by this process are skipped (``deliver`` already sent them locally).

    Its reads run on a thread of its own (``_off_thread``), not on the one shared thread of
    thread-sensitive work (websocket handshakes), and not on the event loop's default pool:
    the connection they use belongs to that one thread, which ``close`` hands back when the
    relay stops. Channels hands it back after each read as well (``database_sync_to_async``),
    except while its test communicator sends or receives: that replaces channels' clean-up
    with a no-op for the whole process, and a read that ran meanwhile kept its connection
    open until the garbage collector found it (a session left on the test database)."""

    def __init__(self, layer: BaseChannelLayer) -> None:
        self.layer = layer
        self.cursor: int | None = None
        self.seen: dict[int, float] = {}
        self.last_clean = time.monotonic()
        self.thread = ThreadPoolExecutor(1, "live-relay")

    def _off_thread(self, func: Any) -> Any:
        """``func`` on the relay's thread, with Django's connection handling."""
        return database_sync_to_async(func, thread_sensitive=False, executor=self.thread)

    def close(self) -> Future[None]:
        """Hand back the database connection of the relay's thread and let the thread end
        (after any read still running on it); the future is done once the connection is."""
        closed = self.thread.submit(connections.close_all)
        self.thread.shutdown(wait=False)
        return closed

    async def start(self) -> None:
        """Begin after what is already there: pages opened now show it already."""
        self.cursor, recent = await self._off_thread(_current)()
        now = time.monotonic()
        self.seen = dict.fromkeys(recent, now)

    async def step(self) -> int:
        """One poll; returns how many messages were forwarded."""
        if self.cursor is None:
            await self.start()
        assert self.cursor is not None
        rows = await self._off_thread(_fetch)(self.cursor, origin())
        forwarded = 0
        now = time.monotonic()
        for pk, workspace_id, html in rows:
            self.cursor = max(self.cursor, pk)
            if pk in self.seen:
                continue
            self.seen[pk] = now
            if html is None:  # our own row: only remembered
                continue
            message = {"type": "workspace.update", "html": html}
            try:
                await asyncio.wait_for(
                    self.layer.group_send(workspace_group(workspace_id), message), SEND_TIMEOUT
                )
                forwarded += 1
            except Exception:
                log.warning("live relay: message %s not forwarded", pk, exc_info=True)
        horizon = now - 2 * RELAY_LOOKBACK.total_seconds()
        self.seen = {pk: at for pk, at in self.seen.items() if at >= horizon}
        if now - self.last_clean > CLEAN_EVERY:
            self.last_clean = now
            await self._off_thread(clean_outbox)()
        return forwarded

    async def run(self) -> None:
        try:
            await self._polls()
        finally:
            self.close()

    async def _polls(self) -> None:
        idle_since: float | None = None
        while True:
            await asyncio.sleep(RELAY_INTERVAL)
            if _listeners > 0:
                idle_since = None
            else:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > RELAY_IDLE_EXIT:
                    return
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("live relay: poll failed; retrying", exc_info=True)
                await asyncio.sleep(5 * RELAY_INTERVAL)


def _current() -> tuple[int, list[int]]:
    """The newest id of the outbox and the ids the lookback of the next poll would return."""
    newest = LiveMessage.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    recent = LiveMessage.objects.filter(created_at__gte=timezone.now() - RELAY_LOOKBACK, pk__lte=newest)
    return newest, list(recent.values_list("pk", flat=True))


def _fetch(cursor: int, own: str) -> list[tuple[int, int, str | None]]:
    from django.db.models import Q

    since = timezone.now() - RELAY_LOOKBACK
    rows = (
        LiveMessage.objects.filter(Q(pk__gt=cursor) | Q(created_at__gte=since))
        .order_by("pk")
        .values_list("pk", "workspace_id", "html", "origin")[:RELAY_BATCH]
    )
    return [(pk, ws, None if who == own else html) for pk, ws, html, who in rows]


_relay: Relay | None = None
_relay_task: asyncio.Task[None] | None = None
_listeners = 0
RELAY_AUTOSTART = True  # tests switch it off to drive the relay step by step


def listener_joined(layer: BaseChannelLayer) -> None:
    """A websocket of this process opened: make sure the relay runs (embedded mode only).
    Called from the consumer; starts a task, touches no database itself."""
    global _listeners, _relay, _relay_task
    _listeners += 1
    if not RELAY_AUTOSTART or not uses_outbox(layer):
        return
    loop = asyncio.get_running_loop()
    task = _relay_task
    if task is not None and not task.done() and task.get_loop() is loop:
        return
    _relay = Relay(layer)
    _relay_task = loop.create_task(_relay.run(), name="live-outbox-relay")


def listener_left() -> None:
    global _listeners
    _listeners = max(0, _listeners - 1)
