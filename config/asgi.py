"""ASGI entry point: HTTP through Django, websockets through Channels."""

import os
from typing import Any

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


class SyncStackASGIHandler(ASGIHandler):
    """Django's ASGI handler running the middleware stack and the view synchronously, in one
    worker thread per request, as under WSGI.

    Every view of the project is synchronous. Django's async stack runs each middleware's
    process_request/process_response in a worker thread of its own (sync_to_async), so a
    request made about 16 thread hand-offs, over 1 ms of CPU (bench/reports/api.md); here it
    makes one. Websockets are not affected (Channels routes them below)."""

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        response: Any = await sync_to_async(self.get_response, thread_sensitive=True)(request)
        return response  # type: ignore[no-any-return]


# Django must be set up before anything imports models (the websocket routes do).
django.setup(set_prefix=False)
django_asgi_app = SyncStackASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from memory.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
