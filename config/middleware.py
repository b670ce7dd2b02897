"""Project middleware."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.utils.decorators import sync_and_async_middleware

API_PREFIX = "/api/v1/"

_DETAIL = {
    404: "not found: no such endpoint (see /api/v1/docs)",
    405: "method not allowed",
}


def _json_error(response: HttpResponseBase) -> HttpResponseBase:
    """The API's one error shape for a 4xx that Django or django-ninja answered outside the
    API's own exception handlers: an unknown path under /api/v1/ (Django's HTML 404 page), a
    method an endpoint does not take (django-ninja's plain-text 405), a bad Host (400)."""
    status = response.status_code
    if not 400 <= status < 500 or response.get("Content-Type", "").startswith("application/json"):
        return response
    try:
        reason = HTTPStatus(status).phrase.lower()
    except ValueError:
        reason = "client error"
    replaced = JsonResponse({"detail": _DETAIL.get(status, reason)}, status=status)
    for header in ("Allow", "Retry-After", "WWW-Authenticate"):
        if header in response:
            replaced[header] = response[header]
    return replaced


@sync_and_async_middleware
def api_json_errors(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Every 4xx under /api/v1/ is JSON ``{"detail": ...}`` (SPEC §5), whichever layer made it."""
    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponseBase:
            response = await get_response(request)
            return _json_error(response) if request.path.startswith(API_PREFIX) else response

        return middleware_async

    def middleware(request: HttpRequest) -> HttpResponseBase:
        response = get_response(request)
        return _json_error(response) if request.path.startswith(API_PREFIX) else response

    return middleware
