"""ASGI entry point, the one place the application is assembled: ``/mcp`` (and its
protected-resource metadata) through the MCP SDK's app (api.mcp_http), every other HTTP
request through Django, websockets through Channels. The root owns the ASGI lifespan, which
Django's handler refuses and the MCP SDK's session manager needs: it is entered at startup and
left at shutdown (uvicorn's default ``--lifespan auto`` sends both)."""

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import connections
from django.http import FileResponse, HttpResponseBase
from django.urls import set_script_prefix

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

IDLE_THREADS_KEPT = 64  # request threads kept for reuse; more concurrent requests start more


class SyncStackASGIHandler(ASGIHandler):
    """Django's ASGI handler doing a request's synchronous work in one hop to a reused thread.

    Every view of the project is synchronous. Django's own handler, per request, starts a
    thread (a fresh one-thread executor per ``ThreadSensitiveContext``) and a second one to
    join it, and hands work to it three times (request_started, the middleware and view,
    response.close); its async middleware chain would add a hand-off per middleware hook. Here
    the middleware chain is synchronous, and one call on the request's thread sends
    request_started, builds the request, runs middleware and view and, for an ordinary
    (non-streaming) response, closes it — request_finished hands the database connection back
    to the pool on the thread that used it. The threads are kept and reused (each request
    still has one to itself, so a slow request does not hold up the others).
    bench/reports/api.md measures the difference. Websockets are not affected (Channels routes
    them below)."""

    def __init__(self) -> None:
        super().__init__()
        self._idle: list[ThreadPoolExecutor] = []  # touched only on the event loop's thread

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        try:
            executor = self._idle.pop()
        except IndexError:
            executor = ThreadPoolExecutor(1, "request")
        finished = False
        try:
            # Every thread-sensitive call of this request runs on this executor's one thread.
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
            finished = True
        finally:
            # A cancelled request may still be running on its thread: that thread is not
            # handed to the next request.
            if finished and len(self._idle) < IDLE_THREADS_KEPT:
                self._idle.append(executor)
            else:
                # A request that did not finish (its work raised, or it was cancelled) may
                # never have sent request_finished, which hands its thread's database
                # connection back to the pool: that thread closes its connections, after
                # whatever still runs on it, before it ends. Otherwise the pool slot stays
                # taken until the garbage collector frees the thread's connection wrapper.
                executor.submit(connections.close_all)
                executor.shutdown(wait=False)

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        try:
            response = await sync_to_async(self._respond, thread_sensitive=True)(scope, body_file)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:  # the client went away while it was sent
                pass
            finally:
                if response.streaming:  # sent from its iterator: closed once consumed
                    await sync_to_async(response.close, thread_sensitive=True)()
        finally:
            body_file.close()

    def _respond(self, scope: dict[str, Any], body_file: Any) -> HttpResponseBase:
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            assert error_response is not None  # create_request answers one or the other
            response = error_response
        else:
            response = self.get_response(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]
            if isinstance(response, FileResponse):  # the ASGI server chunks the body itself
                response.block_size = self.chunk_size
        if not response.streaming:
            response.close()  # its content is in memory; request_finished runs on this thread
        return response


# Django must be set up before anything imports models (the websocket routes do).
django.setup(set_prefix=False)
django_asgi_app = SyncStackASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from api import mcp_http  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402

site = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
mcp_app = mcp_http.McpDoor()


async def lifespan(receive: Any, send: Any) -> None:
    """Startup enters the MCP session manager, shutdown leaves it (in the same task, as its
    task group requires)."""
    stack = AsyncExitStack()
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await stack.enter_async_context(mcp_app.run())
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": f"MCP endpoint: {exc}"})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await stack.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
    elif mcp_http.serves(scope):
        await mcp_app(scope, receive, send)
    else:
        await site(scope, receive, send)
