"""The one NinjaAPI of the project, mounted at /api/v1 (docs at /api/v1/docs)."""

from ninja import NinjaAPI

api = NinjaAPI(
    title="Memory Steward API",
    version="1",
    urls_namespace="api-v1",
    docs_url="/docs",
)


@api.get("/health", auth=None, tags=["meta"])
def health(request):  # type: ignore[no-untyped-def]
    """Liveness probe: answers without touching the database."""
    return {"status": "ok"}
