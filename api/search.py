"""``GET /search``: full-text search of the caller's workspace (memory.search)."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Query, Router
from pydantic import BaseModel, ConfigDict, Field

from api.entries import ERRORS
from memory.auth import require
from memory.models.choices import OFFSET_MAX
from memory.search import LIMIT_MAX, search

router = Router(tags=["search"])


# Plain pydantic models reading the hits' attributes (as ``EntryOut``): django-ninja's Schema
# reads each attribute through a Python getter, a share of every search's CPU
# (bench/reports/api.md, section "Figures moved from the code").
class SearchHitOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    title: str
    snippet: str  # plain text; matched words between « and »
    rank: float | None = Field(
        description="higher is better, comparable within one response only; null for a broad "
        "query's matches past its ranked ones (listed by importance, see `ranked`)"
    )
    importance: float
    status: str
    entry_type: str
    created_at: datetime


class SearchOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    count: int = Field(description="all matches; items are `limit` of them from `offset` on, best first")
    count_exact: bool = Field(
        description="false when `count` is PostgreSQL's estimate (a broad query, see `ranked`)"
    )
    ranked: int = Field(
        description="matches that were ranked: `count` when every match was; for a broad query "
        "(more matches than sqrt(50 x the workspace's visible entries), at least 2,000) only "
        "its 100 most important matches are ranked, and pages past them list its further "
        "matches by importance"
    )
    limit: int
    offset: int
    items: list[SearchHitOut]


@router.get("/search", response={200: SearchOut, **ERRORS})
def search_entries(
    request: HttpRequest,
    q: str,
    limit: int = Query(20, ge=1, le=LIMIT_MAX),
    offset: int = Query(0, ge=0, le=OFFSET_MAX),
    include_archived: bool = False,
) -> dict[str, object]:
    """Latest active and stale entries matching ``q`` (archived ones with include_archived),
    best first: text rank, then importance. Web-search syntax: words, "a phrase", -exclude,
    or. An empty ``q`` or one over 500 characters is 422; stop words alone find nothing.
    A broad query ranks only its most important matches (``ranked``)."""
    who = require(request, "viewer")
    result = search(who.workspace, q, limit=limit, offset=offset, include_archived=include_archived)
    return {
        "count": result.count,
        "count_exact": result.count_exact,
        "ranked": result.ranked,
        "limit": limit,
        "offset": offset,
        "items": result.hits,
    }
