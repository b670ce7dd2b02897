"""The quality endpoints of the agent API: the hygiene review queue and disputes.

Reading the queues needs any member role; archiving, keeping and resolving need an operator.
Each endpoint is a few lines around the services in maintenance/hygiene.py,
maintenance/hygiene_actions.py and maintenance/contradictions.py.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router
from ninja.params import Path

from api.maintenance_schemas import ERRORS, IdPath, PageIn
from api.review_schemas import (
    DisputeListIn,
    DisputePageOut,
    HygieneApplyOut,
    HygieneKeepOut,
    HygienePageOut,
    IdsIn,
    ResolveIn,
    ResolveOut,
)
from maintenance import contradictions, hygiene, hygiene_actions
from memory.auth import require

router = Router(tags=["quality"])


@router.get("/hygiene/preview", response={200: HygienePageOut, **ERRORS})
def hygiene_preview(request: HttpRequest, filters: Query[PageIn]) -> dict[str, Any]:
    """Junk candidates with their reasons and points, highest score first."""
    who = require(request, "viewer")
    result = hygiene.preview(who.workspace, limit=filters.limit, offset=filters.offset)
    return {**result, "limit": filters.limit, "offset": filters.offset}


@router.post("/hygiene/apply", response={200: HygieneApplyOut, **ERRORS})
def hygiene_apply(request: HttpRequest, payload: IdsIn) -> dict[str, Any]:
    """Archive the given ids that a fresh preview still lists; the others are skipped."""
    who = require(request, "operator")
    return hygiene_actions.apply(who.workspace, payload.ids, actor=who.actor)


@router.post("/hygiene/keep", response={200: HygieneKeepOut, **ERRORS})
def hygiene_keep(request: HttpRequest, payload: IdsIn) -> dict[str, Any]:
    """An operator's "keep": the entries leave the queue until their content changes."""
    who = require(request, "operator")
    return hygiene_actions.keep(who.workspace, payload.ids, actor=who.actor)


@router.get("/disputes", response={200: DisputePageOut, **ERRORS})
def disputes(request: HttpRequest, filters: Query[DisputeListIn]) -> dict[str, Any]:
    """Pairs of entries that contradict each other, newest first."""
    who = require(request, "viewer")
    count, items = contradictions.disputes_page(
        who.workspace, status=filters.status, limit=filters.limit, offset=filters.offset
    )
    return {"count": count, "limit": filters.limit, "offset": filters.offset, "items": items}


@router.post("/disputes/{id}/resolve", response={200: ResolveOut, **ERRORS})
def dispute_resolve(request: HttpRequest, path: Path[IdPath], payload: ResolveIn) -> dict[str, Any]:
    """Resolve a dispute: keep both, keep one (the other is archived, restorable), or let one
    supersede the other."""
    who = require(request, "operator")
    return contradictions.resolve(
        who.workspace, path.id, payload.resolution, actor=who.actor, winner_id=payload.winner_id
    )
