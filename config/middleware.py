"""Project middleware, and the API's answer to a server-side error."""

from __future__ import annotations

import logging
import sqlite3
import sys
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import psycopg
from django.core.signals import got_request_exception
from django.db import DatabaseError, InterfaceError
from django.http import HttpRequest, HttpResponseBase, JsonResponse

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1/"

# How long a client should wait before retrying a request the database could not serve now.
RETRY_AFTER_SECONDS = 5
# SQLSTATEs after which the same request may well succeed a moment later: connection
# exceptions (08), too many connections (53), a server shutting down or starting (57P), a
# serialization failure or deadlock (40001, 40P01), a lock or statement timeout (55P03, 57014).
_TRANSIENT_SQLSTATES = ("08", "53", "57P", "40001", "40P01", "55P03", "57014")


def database_unavailable(exc: BaseException) -> bool:
    """True for a database error that says "not now" rather than "never": SQLite's "database
    is locked" (its busy timeout ran out), a PostgreSQL lock or statement timeout, a deadlock,
    or no connection to be had (refused, timed out, the pool's timeout)."""
    if isinstance(exc, InterfaceError):  # "connection already closed"
        return True
    if not isinstance(exc, DatabaseError):
        return False
    cause = exc.__cause__ or exc
    if isinstance(cause, sqlite3.OperationalError):
        return "locked" in str(cause) or "busy" in str(cause)
    if isinstance(cause, psycopg.Error):
        if cause.sqlstate:
            return cause.sqlstate.startswith(_TRANSIENT_SQLSTATES)
        # No SQLSTATE: psycopg failed to connect or lost the connection, or the pool's
        # getconn timed out (psycopg_pool.PoolTimeout is an OperationalError too).
        return isinstance(cause, psycopg.OperationalError | psycopg.InterfaceError)
    return False


def server_error_response(exc: BaseException | None) -> JsonResponse:
    """The API's JSON answer to an error it did not expect, whatever DEBUG says: 503 with
    Retry-After when the database could not serve the request now (a retry may succeed), 500
    otherwise. Nothing of the error is shown to the client; the log has it."""
    if exc is not None and database_unavailable(exc):
        detail = f"the database is busy or unreachable; retry in {RETRY_AFTER_SECONDS} s"
        response = JsonResponse({"detail": detail}, status=503)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    return JsonResponse({"detail": "internal server error"}, status=500)


def log_server_error(request: HttpRequest, exc: BaseException) -> None:
    if database_unavailable(exc):  # an expected condition under load: one line, no traceback
        log.warning("%s %s: database unavailable: %s", request.method, request.path, exc)
    else:
        log.error("%s %s: internal error", request.method, request.path, exc_info=exc)


_DETAIL = {
    404: "not found: no such endpoint (see /api/v1/docs)",
    405: "method not allowed",
}


def _is_json(response: HttpResponseBase) -> bool:
    return response.get("Content-Type", "").startswith("application/json")


def _replace(response: HttpResponseBase, replaced: JsonResponse) -> JsonResponse:
    # Everything the inner layers set stays: Allow, Retry-After, security headers, Vary, cookies.
    for header, value in response.items():
        if header.lower() not in ("content-type", "content-length"):
            replaced[header] = value
    replaced.cookies = response.cookies
    response.close()
    return replaced


def _json_error(response: HttpResponseBase) -> HttpResponseBase:
    """The API's one error shape for a 4xx that Django or django-ninja answered outside the
    API's own exception handlers: an unknown path under /api/v1/ (Django's HTML 404 page), a
    method an endpoint does not take (django-ninja's plain-text 405), a bad Host (400)."""
    status = response.status_code
    if not 400 <= status < 500 or _is_json(response):
        return response
    try:
        reason = HTTPStatus(status).phrase.lower()
    except ValueError:
        reason = "client error"
    return _replace(response, JsonResponse({"detail": _DETAIL.get(status, reason)}, status=status))


def _remember_exception(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    # Django turns an exception that escaped the view into its HTML 500 page (the debug page
    # with DEBUG) before the response reaches this middleware; the signal it sends first is
    # the one place the exception can still be seen, so that a lock still answers 503.
    if request is not None and request.path_info.startswith(API_PREFIX):
        request._api_exception = sys.exc_info()[1]  # type: ignore[attr-defined]


def api_json_errors(
    get_response: Callable[[HttpRequest], HttpResponseBase],
) -> Callable[[HttpRequest], HttpResponseBase]:
    """Every error under /api/v1/ is JSON ``{"detail": ...}``, whichever layer made
    it: a 4xx of Django or django-ninja, and a 5xx of an exception that escaped the API's own
    handlers (config.api), e.g. one raised by a middleware or while closing the request.
    Synchronous only: WhiteNoise, next in the chain, is, so the chain runs synchronously under
    ASGI too."""
    got_request_exception.connect(_remember_exception, dispatch_uid="api_json_errors")

    def middleware(request: HttpRequest) -> HttpResponseBase:
        response = get_response(request)
        if not request.path_info.startswith(API_PREFIX):
            return response
        if response.status_code >= 500 and not _is_json(response):
            # Django has logged the exception already.
            return _replace(response, server_error_response(getattr(request, "_api_exception", None)))
        return _json_error(response)

    return middleware
