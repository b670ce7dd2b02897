"""Project middleware."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from django.http import HttpRequest, HttpResponseBase, JsonResponse

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
    # Everything the inner layers set stays: Allow, security headers, Vary, cookies.
    for header, value in response.items():
        if header.lower() not in ("content-type", "content-length"):
            replaced[header] = value
    replaced.cookies = response.cookies
    response.close()
    return replaced


def api_json_errors(
    get_response: Callable[[HttpRequest], HttpResponseBase],
) -> Callable[[HttpRequest], HttpResponseBase]:
    """Every 4xx under /api/v1/ is JSON ``{"detail": ...}`` (SPEC §5), whichever layer made it.
    Synchronous only: WhiteNoise, next in the chain, is, so the chain runs synchronously
    under ASGI too."""

    def middleware(request: HttpRequest) -> HttpResponseBase:
        response = get_response(request)
        return _json_error(response) if request.path_info.startswith(API_PREFIX) else response

    return middleware
