"""``Idempotency-Key`` for every ``POST`` of the API: a retry gets the first answer, and
nothing is written twice.

Invariants: a key names one request (the same key for another method, path, query, body or
caller within 24 h is 422); keys are kept per workspace, so two workspaces never see each
other's answers; only the answer of a request the endpoint executed is stored (its 2xx and
its 4xx refusals), never one refused before it ran nor a 5xx, after which nothing was
written; a retry racing the first gets 409; of two claims at once exactly one wins (the
unique (workspace, key) index). Other methods ignore the header. The contract clients see is
in docs/api.md ("Safe retries").
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.utils import timezone
from ninja import Router

from memory.auth import principal
from memory.models import IdempotencyKey

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
TTL = timedelta(hours=24)
KEY_MAX = 255
RECLAIM_EVERY = 60.0  # seconds between two reclaims of expired keys by one process
RECLAIM_BATCH = 1000  # rows per DELETE
RECLAIM_BATCHES = 10  # DELETEs per reclaim at most
IN_PROGRESS_RETRY_AFTER = 1  # seconds

_last_reclaim = 0.0


def lock_timeout() -> timedelta:
    return timedelta(seconds=int(getattr(settings, "IDEMPOTENCY_LOCK_SECONDS", 600)))


class _Claim:
    """This request owns the key's row until it stores its answer."""

    def __init__(self, pk: int, locked_at: datetime):
        self.pk = pk
        self.locked_at = locked_at

    def _mine(self) -> Any:
        # locked_at is the claim's token: a row taken over meanwhile is no longer ours.
        return IdempotencyKey.objects.filter(pk=self.pk, locked_at=self.locked_at, status__isnull=True)

    def store(self, response: HttpResponseBase) -> None:
        if response.status_code >= 500 or not isinstance(response, HttpResponse):
            self.release()
            return
        try:
            body = response.content.decode("utf-8")
        except UnicodeDecodeError:
            self.release()
            return
        try:
            self._mine().update(
                status=response.status_code,
                body=body,
                content_type=response.get("Content-Type", "")[:100],
                locked_at=None,
            )
        except DatabaseError:
            # The request's work is done and its answer goes out; a retry answers 409 (in
            # progress) until the claim's lock times out.
            log.warning("could not store the answer of idempotency key row %s", self.pk, exc_info=True)

    def release(self) -> None:
        """Forget the claim: the request did not finish, a retry runs it again."""
        try:
            self._mine().delete()
        except DatabaseError:  # the database is what failed; the row is taken over later
            log.warning("could not release idempotency key row %s", self.pk, exc_info=True)


def _valid_key(value: str) -> bool:
    return 0 < len(value) <= KEY_MAX and all(" " <= c <= "~" for c in value)


def _canonical_body(raw: bytes) -> bytes:
    """The body as JSON with sorted keys (a client may serialise the same retry in another
    key order), or as sent when it is not JSON."""
    if not raw:
        return b""
    try:
        return json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    except ValueError:
        return raw


def fingerprint(request: HttpRequest) -> str:
    who = principal(request)
    caller = f"key:{who.key.pk}" if who.key is not None else f"user:{getattr(who.user, 'pk', None)}"
    query = sorted(request.GET.lists())
    digest = hashlib.sha256()
    for part in (request.method or "", request.path_info, json.dumps(query), caller):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(_canonical_body(request.body))
    return digest.hexdigest()


def _error(status: int, detail: str, **headers: str) -> JsonResponse:
    response = JsonResponse({"detail": detail}, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


def _replay(row: IdempotencyKey) -> HttpResponse:
    response = HttpResponse(
        row.body.encode("utf-8"), status=row.status, content_type=row.content_type or None
    )
    response[REPLAYED_HEADER] = "true"
    return response


def reclaim_expired(
    now: datetime | None = None, *, batch: int = RECLAIM_BATCH, batches: int = RECLAIM_BATCHES
) -> int:
    """Delete stored answers older than 24 h, ``batch`` rows per statement and at most
    ``batches`` statements; how many went."""
    cutoff = (now or timezone.now()) - TTL
    deleted = 0
    for _ in range(batches):
        ids = list(
            IdempotencyKey.objects.filter(created_at__lt=cutoff)
            .order_by("created_at")
            .values_list("pk", flat=True)[:batch]
        )
        if not ids:
            break
        gone, _ = IdempotencyKey.objects.filter(pk__in=ids, created_at__lt=cutoff).delete()
        deleted += gone
        if len(ids) < batch:
            break
    return deleted


def _maybe_reclaim(now: datetime) -> None:
    """Expired rows (24 h) are deleted in bounded batches by the process that stores a new key,
    at most once every ``RECLAIM_EVERY`` per process; an expired key may be used again."""
    global _last_reclaim
    if time.monotonic() - _last_reclaim < RECLAIM_EVERY:
        return
    _last_reclaim = time.monotonic()
    try:
        reclaim_expired(now)
    except DatabaseError:  # housekeeping never fails the request; the next one tries again
        log.warning("could not reclaim expired idempotency keys", exc_info=True)


def claim(request: HttpRequest, key: str) -> _Claim | HttpResponse:
    """Own ``key`` for this request, or the answer to give instead (a replay, 409, 422)."""
    who = principal(request)
    wanted = fingerprint(request)
    for _ in range(3):  # a row deleted or taken over between two statements: look again
        now = timezone.now()
        try:
            with transaction.atomic():
                row = IdempotencyKey.objects.create(
                    workspace=who.workspace, key=key, fingerprint=wanted, created_at=now, locked_at=now
                )
        except IntegrityError:
            pass
        else:
            _maybe_reclaim(now)
            return _Claim(row.pk, now)
        found = IdempotencyKey.objects.filter(workspace=who.workspace, key=key).first()
        if found is None:
            continue
        expired = found.created_at <= now - TTL
        abandoned = (
            found.status is None
            and found.fingerprint == wanted
            and found.locked_at is not None
            and found.locked_at <= now - lock_timeout()
        )
        if expired or abandoned:
            taken = IdempotencyKey.objects.filter(
                pk=found.pk, created_at=found.created_at, locked_at=found.locked_at
            ).update(fingerprint=wanted, status=None, body="", content_type="", created_at=now, locked_at=now)
            if taken:
                return _Claim(found.pk, now)
            continue
        if found.fingerprint != wanted:
            return _error(
                422,
                f"{HEADER} {key!r} was used within the last 24 h for a different request (method, "
                "path, query, body or caller); send a new key for a new request",
            )
        if found.status is None:
            return _error(
                409,
                f"a request with {HEADER} {key!r} is still in progress; retry in "
                f"{IN_PROGRESS_RETRY_AFTER} s to get its answer",
                **{"Retry-After": str(IN_PROGRESS_RETRY_AFTER)},
            )
        return _replay(found)
    return _error(
        409, f"{HEADER} {key!r} is being used by concurrent requests; retry", **{"Retry-After": "1"}
    )


def _claim_before_operation(func: Callable[..., Any]) -> Callable[..., Any]:
    """Operation mode: after authentication and validation, before the endpoint runs."""

    @functools.wraps(func)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if request.method != "POST" or HEADER not in request.headers:
            return func(request, *args, **kwargs)
        key = request.headers[HEADER]
        if not _valid_key(key):
            return _error(400, f"{HEADER}: 1 to {KEY_MAX} printable ASCII characters")
        outcome = claim(request, key)
        if not isinstance(outcome, _Claim):
            return outcome
        request._idempotency_claim = outcome  # type: ignore[attr-defined]
        return func(request, *args, **kwargs)

    return wrapper


def _store_after_operation(run: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """View mode: around the whole operation, whose answer (an error's too) is final here."""

    @functools.wraps(run)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            response = run(request, *args, **kwargs)
        except BaseException:
            found = getattr(request, "_idempotency_claim", None)
            if isinstance(found, _Claim):
                found.release()
            raise
        found = getattr(request, "_idempotency_claim", None)
        if isinstance(found, _Claim):
            del request._idempotency_claim  # type: ignore[attr-defined]
            found.store(response)
        return response

    return wrapper


def install(router: Router) -> None:
    """Make every POST of ``router`` honour ``Idempotency-Key``: the operation part runs after
    authentication and validation, claims the key (one INSERT against the unique (workspace,
    key) index) or answers from the stored row; the view part, around the whole operation,
    stores the answer the claim produced. A claim whose process died mid-request (status
    still empty) is taken over by a retry after ``IDEMPOTENCY_LOCK_SECONDS``."""
    router.add_decorator(_store_after_operation, mode="view")
    router.add_decorator(_claim_before_operation, mode="operation")
