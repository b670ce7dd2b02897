"""The memory endpoints of the agent API: entries, their lifecycle, links and anchors.

Each endpoint checks the caller's role with ``require`` first, then calls one service or
selector. Every lookup is scoped to the caller's workspace, so another workspace's id answers
404. Refusals are service exceptions, mapped once in ``config.api`` to ``{"detail": ...}``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.utils import timezone
from ninja import Query, Router, Status

from api.schemas import (
    AccessIn,
    AnchorCheckIn,
    AnchorCheckOut,
    DeletedOut,
    DeleteQuery,
    EntryCreateOut,
    EntryDetailOut,
    EntryIn,
    EntryListQuery,
    EntryOut,
    EntryPageOut,
    EntryPatchIn,
    EntryTombstoneOut,
    EntryUpdateOut,
    ErrorOut,
    EventPageOut,
    FeedbackIn,
    PageQuery,
    PurgeOut,
    RelationshipIn,
    RelationshipOut,
)
from maintenance import purge_now
from maintenance.anchors import check_anchor_files
from memory import entry_changes, entry_signals, new_entries, relationships, selectors, writes
from memory.auth import ROLE_LEVEL, Principal, require
from memory.errors import Forbidden, NotFound
from memory.models import Entry, Tombstone
from memory.models.choices import ID_MAX, Source, TombstoneReason

router = Router(tags=["entries"])

# The refusals any endpoint may answer with (documented so that clients and the schema fuzzer
# know them); all share the one JSON shape.
ERRORS: dict[int, Any] = {code: ErrorOut for code in (400, 401, 403, 404, 409, 413, 422, 429)}
UNMANAGED_SOURCES = (Source.OPERATOR, Source.SYSTEM)


def _reject_oversized_bodies(run: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Answer 413 JSON for a body over DATA_UPLOAD_MAX_MEMORY_SIZE. Django raises
    RequestDataTooBig when the body is first read, inside django-ninja's parsing, whose
    fallback handler would turn it into a 500 (DEBUG) or Django's HTML 400; reading it here
    first keeps the API's one error shape."""

    @functools.wraps(run)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            request.body  # noqa: B018 - read (and cached) now, so an oversized body fails here
        except RequestDataTooBig:
            return JsonResponse({"detail": "request body too large"}, status=413)
        return run(request, *args, **kwargs)

    return wrapper


def reject_repeated_query_parameters(run: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Answer 422 when a query parameter is given more than once: every one of the API's is
    a single value, and taking the last of several (Django's way) would accept a request the
    published schema forbids."""

    @functools.wraps(run)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        for name, values in request.GET.lists():
            if len(values) > 1:
                return JsonResponse(
                    {"detail": f"query parameter {name!r} is given more than once"}, status=422
                )
        return run(request, *args, **kwargs)

    return wrapper


_INTEGER = re.compile(r"-?[0-9]+")


def reject_malformed_path_ids(run: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Answer 422 when a path parameter (every one of the API's is an integer id) is not
    written as an integer: pydantic's lax parsing would read " 6" or "\n6" as 6 and accept a
    request the published schema forbids."""

    @functools.wraps(run)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        for name, value in kwargs.items():
            if isinstance(value, str) and not _INTEGER.fullmatch(value):
                return JsonResponse({"detail": f"path parameter {name!r} must be an integer"}, status=422)
        return run(request, *args, **kwargs)

    return wrapper


# "view" mode wraps the whole operation, before authentication and body parsing.
router.add_decorator(_reject_oversized_bodies, mode="view")


def _id(value: int, what: str = "entry") -> int:
    # Ids beyond 64 bits exist in neither database (SQLite would even raise on them).
    if not 0 < value <= ID_MAX:
        raise NotFound(f"{what} {value} not found")
    return value


def _entry(who: Principal, entry_id: int) -> Entry:
    return writes.entry_get(workspace=who.workspace, entry_id=_id(entry_id))


def _check_source(who: Principal, source: str | None) -> None:
    if source in UNMANAGED_SOURCES and who.level < ROLE_LEVEL["operator"]:
        raise Forbidden(f"source {source!r} needs the operator role; your role is {who.role}")


def _page(
    qs: Any,
    limit: int,
    offset: int,
    count_key: str | None = None,
    counted: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    found = selectors.page(qs, limit=limit, offset=offset, count_key=count_key, counted=counted)
    if qs.model is Entry:
        selectors.with_tag_names(found["items"])
    return found


# --- entries ----------------------------------------------------------------------------------


@router.post("/entries", response={201: EntryCreateOut, **ERRORS})
def create_entry(request: HttpRequest, payload: EntryIn) -> Status[Entry]:
    """Create a memory with its tags, anchors and outgoing links (201). A constitutional
    entry or an operator's rule is checked for contradictions first; ``disputes`` names any."""
    who = require(request, "agent")
    _check_source(who, payload.source)
    fields = payload.model_dump(exclude_unset=True)
    content = fields.pop("content")
    entry = new_entries.entry_create(workspace=who.workspace, content=content, actor=who.actor, **fields)
    return Status(201, entry)


@router.get("/entries", response={200: EntryPageOut, **ERRORS})
def list_entries(request: HttpRequest, filters: Query[EntryListQuery]) -> dict[str, Any]:
    """Latest visible entries: active and stale, plus archived and staged when asked for."""
    who = require(request, "viewer")
    params = filters.model_dump(exclude={"limit", "offset"})
    rows = {k: v for k, v in params.items() if k != "sort"}  # what is counted
    count_key = f"entries:{who.workspace.pk}:{sorted(rows.items())!r}"
    return _page(
        selectors.entry_list(who.workspace, **params),
        filters.limit,
        filters.offset,
        count_key,
        counted=lambda: selectors.entry_list_counted(who.workspace, **rows),
    )


@router.get("/entries/{entry_id}", response={200: EntryDetailOut, **ERRORS})
def get_entry(request: HttpRequest, entry_id: int) -> selectors.EntryDetail:
    """One entry (any version) with its importance breakdown, tags, anchors and links."""
    who = require(request, "viewer")
    return selectors.entry_detail(who.workspace, _id(entry_id), now=timezone.now())


@router.patch("/entries/{entry_id}", response={200: EntryUpdateOut, **ERRORS})
def update_entry(request: HttpRequest, entry_id: int, payload: EntryPatchIn) -> dict[str, Any]:
    """Change the latest version; changed content makes a new version (``new_version``)."""
    who = require(request, "agent")
    _check_source(who, payload.source)
    result = entry_changes.entry_update(
        workspace=who.workspace,
        entry_id=_id(entry_id),
        actor=who.actor,
        **payload.model_dump(exclude_unset=True),
    )
    return {
        "entry": result.entry,
        "new_version": result.new_version,
        "supersedes": result.supersedes,
        "disputes": list(result.disputes),
    }


@router.delete("/entries/{entry_id}", response={200: EntryTombstoneOut | PurgeOut, **ERRORS})
def delete_entry(
    request: HttpRequest, entry_id: int, query: Query[DeleteQuery]
) -> Tombstone | dict[str, Any]:
    """Tombstone the entry (reason api; restorable until purged). With ``purge=true`` an
    operator purges an already tombstoned entry now, after a pre-prune backup."""
    if query.purge:
        who = require(request, "operator")
        return purge_now.entry_purge(workspace=who.workspace, entry=_entry(who, entry_id), actor=who.actor)
    who = require(request, "agent")
    return entry_changes.entry_tombstone(
        workspace=who.workspace, entry_id=_id(entry_id), reason=TombstoneReason.API, actor=who.actor
    )


@router.post("/entries/{entry_id}/restore", response={200: EntryOut, **ERRORS})
def restore_entry(request: HttpRequest, entry_id: int) -> Entry:
    """Operator: a stale, archived or tombstoned entry returns to its previous live status."""
    who = require(request, "operator")
    return entry_changes.entry_restore(workspace=who.workspace, entry_id=_id(entry_id), actor=who.actor)


@router.post("/entries/{entry_id}/release", response={200: EntryOut, **ERRORS})
def release_entry(request: HttpRequest, entry_id: int) -> Entry:
    """Operator: clear the entry's operator hold (409 when it has none); automation may change
    it again. The release is a LifecycleEvent of its history."""
    who = require(request, "operator")
    return entry_changes.entry_release(workspace=who.workspace, entry_id=_id(entry_id), actor=who.actor)


@router.get("/entries/{entry_id}/versions", response={200: EntryPageOut, **ERRORS})
def list_entry_versions(request: HttpRequest, entry_id: int, page: Query[PageQuery]) -> dict[str, Any]:
    """Every version of the entry's lineage, oldest first."""
    who = require(request, "viewer")
    return _page(selectors.entry_versions(who.workspace, _entry(who, entry_id)), page.limit, page.offset)


@router.get("/entries/{entry_id}/history", response={200: EventPageOut, **ERRORS})
def list_entry_history(request: HttpRequest, entry_id: int, page: Query[PageQuery]) -> dict[str, Any]:
    """The lifecycle events of the entry's lineage, newest first."""
    who = require(request, "viewer")
    return _page(selectors.entry_history(who.workspace, _entry(who, entry_id)), page.limit, page.offset)


@router.post("/entries/{entry_id}/access", response={200: EntryOut, **ERRORS})
def record_entry_access(request: HttpRequest, entry_id: int, payload: AccessIn) -> Entry:
    """An actor read the entry; ``dispatch`` means it went into a real agent context."""
    who = require(request, "agent")
    return entry_signals.entry_record_access(
        workspace=who.workspace, entry_id=_id(entry_id), actor=payload.actor, dispatch=payload.dispatch
    )


@router.post("/entries/{entry_id}/reinforce", response={200: EntryOut, **ERRORS})
def reinforce_entry(request: HttpRequest, entry_id: int) -> Entry:
    """Confirm the entry was useful."""
    who = require(request, "agent")
    return entry_signals.entry_reinforce(workspace=who.workspace, entry_id=_id(entry_id), actor=who.actor)


@router.post("/entries/{entry_id}/feedback", response={200: EntryOut, **ERRORS})
def give_entry_feedback(request: HttpRequest, entry_id: int, payload: FeedbackIn) -> Entry:
    """helpful / not_helpful step salience; stale / wrong drop it and flag it for review."""
    who = require(request, "agent")
    return entry_signals.entry_feedback(
        workspace=who.workspace, entry_id=_id(entry_id), signal=payload.signal, actor=who.actor
    )


# --- links and anchors ------------------------------------------------------------------------


@router.post("/relationships", response={200: RelationshipOut, 201: RelationshipOut, **ERRORS})
def create_relationship(request: HttpRequest, payload: RelationshipIn) -> Status[dict[str, Any]]:
    """Link two entries (201); an identical link answers 200 with ``duplicate: true``."""
    who = require(request, "agent")
    rel, created = relationships.relationship_create(
        workspace=who.workspace,
        from_id=payload.from_id,
        to_id=payload.to_id,
        type=payload.type,
        actor=who.actor,
    )
    body = {
        "id": rel.pk,
        "from_id": rel.from_entry_id,
        "to_id": rel.to_entry_id,
        "type": rel.type,
        "created_at": rel.created_at,
        "pruned_at": rel.pruned_at,
        "duplicate": not created,
    }
    return Status(201 if created else 200, body)


@router.delete("/relationships/{relationship_id}", response={200: DeletedOut, **ERRORS})
def delete_relationship(request: HttpRequest, relationship_id: int) -> dict[str, bool]:
    """Unlink."""
    who = require(request, "agent")
    relationships.relationship_delete(
        workspace=who.workspace, relationship_id=_id(relationship_id, "relationship")
    )
    return {"deleted": True}


@router.post("/anchors/check", response={200: AnchorCheckOut, **ERRORS}, tags=["anchors"])
def check_anchors(request: HttpRequest, payload: AnchorCheckIn) -> dict[str, int]:
    """Report files of a repository (``content_hash`` null for a deleted file); anchors on
    them become valid, stale or invalidated. Returns the counts."""
    who = require(request, "agent")
    return check_anchor_files(who.workspace, payload.repo, [f.model_dump() for f in payload.files])
