"""The one NinjaAPI of the project, mounted at /api/v1 (docs at /api/v1/docs).

Every error leaves as JSON ``{"detail": ...}``: service refusals map to their status,
validation errors to 422, malformed bodies to 400, rate limits to 429 with Retry-After, and
anything unexpected to 500, or 503 with Retry-After when the database is locked or unreachable
(``config.middleware`` does the same for what escapes these handlers). Routers are added per
app.
"""

import logging
from typing import Any

import pydantic_core
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.renderers import JSONRenderer
from ninja.responses import NinjaJSONEncoder

from api.entries import reject_malformed_path_ids, reject_repeated_query_parameters
from api.entries import router as memory_router
from api.maintenance import router as maintenance_router
from api.proposals import router as proposals_router
from api.quality import router as quality_router
from api.search import router as search_router
from config.middleware import RETRY_AFTER_SECONDS, log_server_error, server_error_response
from memory import idempotency
from memory.auth import API_AUTH, RateLimited
from memory.errors import ServiceError

log = logging.getLogger(__name__)


class CompiledJSONRenderer(JSONRenderer):
    """JSON written by pydantic's compiled serialiser instead of ``json.dumps`` with Django's
    encoder: a page carries many timestamps, each a Python callback that way, and the compiled
    serialiser took a fraction of the CPU (bench/reports/api.md, the 2026-11-30 06:10 UTC
    diagnosis, "What changed in this session"). Timestamps are ISO 8601 with microseconds, UTC
    as ``Z``; text is UTF-8; non-finite floats are null (valid JSON); a type pydantic does not
    know goes through django-ninja's encoder, and anything pydantic refuses (a lone surrogate)
    through django-ninja's renderer, as before."""

    _fallback = NinjaJSONEncoder().default

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> Any:
        try:
            return pydantic_core.to_json(data, fallback=self._fallback, inf_nan_mode="null")
        except pydantic_core.PydanticSerializationError:
            return super().render(request, data, response_status=response_status)


api = NinjaAPI(
    title="Memory Steward API",
    version="1",
    description=(
        'Authenticate with `Authorization: Bearer <key>`; errors are JSON `{"detail": ...}`.\n\n'
        "**Safe retries**: every POST takes an optional `Idempotency-Key` header (1-255 printable "
        "ASCII characters). A retry with the same key within 24 h answers the first answer (with "
        "`Idempotent-Replayed: true`) and writes nothing; while the first is in hand, 409 with "
        "`Retry-After`; the same key with a different request, 422. Keys are per workspace."
    ),
    urls_namespace="api-v1",
    docs_url="/docs",
    auth=API_AUTH,
    renderer=CompiledJSONRenderer(),
)


@api.exception_handler(RequestDataTooBig)
def body_too_large(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return api.create_response(request, {"detail": "request body too large"}, status=413)


@api.exception_handler(RateLimited)
def rate_limited(request: HttpRequest, exc: RateLimited) -> HttpResponse:
    response = api.create_response(request, {"detail": exc.detail}, status=429)
    response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(ServiceError)
def service_error(request: HttpRequest, exc: ServiceError) -> HttpResponse:
    return api.create_response(request, {"detail": exc.detail, **exc.fields}, status=exc.status_code)


@api.exception_handler(ValidationError)
def validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return api.create_response(request, {"detail": _plain(exc.errors)}, status=422)


@api.exception_handler(AuthenticationError)
def unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return api.create_response(
        request, {"detail": "authentication required: Authorization: Bearer <key>"}, status=401
    )


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=exc.status_code)


@api.exception_handler(Exception)
def server_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    """Anything else, a database error included: JSON whatever DEBUG says (django-ninja would
    answer a plain-text traceback with DEBUG, Django's HTML page without), 503 with Retry-After
    when the database is locked or unreachable."""
    log_server_error(request, exc)
    return server_error_response(exc)


def _plain(errors: Any) -> Any:
    """Validation errors with only JSON-safe values (pydantic may put exceptions in ctx)."""
    out = []
    for err in errors:
        err = dict(err)
        if "ctx" in err:
            err["ctx"] = {k: str(v) for k, v in err["ctx"].items()}
        out.append(err)
    return out


@api.get("/health", auth=None, tags=["meta"])
def health(request: HttpRequest) -> Any:
    """Health check for load balancers: 200 when this process can reach its database, 503
    otherwise. Answered on plain HTTP too (SECURE_REDIRECT_EXEMPT), since a balancer checks
    its backends behind the TLS it terminates."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        log.warning("health check: database unreachable: %s", exc)
        response = api.create_response(
            request, {"status": "unavailable", "detail": "database unreachable"}, status=503
        )
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    return {"status": "ok", "database": "ok"}


for _router in (memory_router, maintenance_router, proposals_router, quality_router, search_router):
    _router.add_decorator(reject_repeated_query_parameters, mode="view")
    _router.add_decorator(reject_malformed_path_ids, mode="view")
    idempotency.install(_router)
api.add_router("/", memory_router)
api.add_router("/", maintenance_router)
api.add_router("/", proposals_router)
api.add_router("/", quality_router)
api.add_router("/", search_router)
