"""The MCP tools: the agent API spoken as the Model Context Protocol.

Every tool is the JSON API's own endpoint function called with the caller's principal: the
same role check (``require``), the same services and selectors, the same refusals. Its
arguments are validated by the API's own in-schema (``api.schemas``, strict, unknown keys
refused) before it runs, and its structured result is the API's out-schema dumped exactly as
the API renders it, so a tool's output and the endpoint's JSON body are the same object. A
refusal becomes an MCP tool error whose text carries the API's status and ``detail``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from django.http import HttpRequest
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from api import entries as api
from api import maintenance as maintenance_api
from api import search as api_search
from api.maintenance_schemas import BreakerOut, CountsOut, ProposedCountsOut, PruneIn, RunIn
from api.mcp_calls import call_request, caller, dump, in_django, output_schema, refusal_text
from api.policy_schemas import StatsOut
from api.schemas import (
    NOT_BLANK,
    AccessIn,
    DeleteQuery,
    EntryCreateOut,
    EntryDetailOut,
    EntryId,
    EntryIn,
    EntryListQuery,
    EntryOut,
    EntryPageOut,
    EntryPatchIn,
    EntryTombstoneOut,
    EntryUpdateOut,
    FeedbackIn,
    RelationshipIn,
    RelationshipOut,
    Text,
)
from maintenance.run_results import PRUNE_PARAMS
from memory.errors import ServiceError
from memory.models.choices import OFFSET_MAX
from memory.search import LIMIT_MAX, Q_MAX

SEARCH_LIMIT_DEFAULT = 10
RECENT_LIMIT_DEFAULT = 20
PREVIEW_TOP_DEFAULT = 10
PREVIEW_TOP_MAX = 100


# --- tool arguments: the API's in-schemas -----------------------------------------------------------


class _Args(ArgModelBase):
    """Arguments handed to the tool whole (the SDK would spread them into keywords): a PATCH
    needs to know which keys were sent."""

    def model_dump_one_level(self) -> dict[str, Any]:
        return {"args": self}


class StoreArgs(_Args, EntryIn):
    pass


class SearchArgs(_Args):
    model_config = ConfigDict(extra="forbid", strict=True)

    query: Text = Field(
        min_length=1,
        max_length=Q_MAX,
        pattern=NOT_BLANK,
        description='Web-search syntax: words, "a phrase", -exclude, or',
    )
    limit: int = Field(SEARCH_LIMIT_DEFAULT, ge=1, le=LIMIT_MAX)
    offset: int = Field(0, ge=0, le=OFFSET_MAX)
    include_archived: StrictBool = False


class GetArgs(_Args):
    model_config = ConfigDict(extra="forbid")

    id: EntryId


class RecentArgs(_Args, EntryListQuery):
    # The list's query parameters as JSON arguments: unknown keys refused, flags and numbers
    # strict (a query string's "yes" is no JSON boolean).
    model_config = ConfigDict(extra="forbid")

    sort: Literal["importance", "recent", "retention"] = "recent"
    include_archived: StrictBool = False
    include_staged: StrictBool = False
    limit: StrictInt = Field(RECENT_LIMIT_DEFAULT, ge=1, le=LIMIT_MAX)
    offset: StrictInt = Field(0, ge=0, le=OFFSET_MAX)


class UpdateArgs(_Args, EntryPatchIn):
    id: EntryId


class FeedbackArgs(_Args, FeedbackIn):
    id: EntryId


class AccessArgs(_Args):
    model_config = ConfigDict(extra="forbid")

    id: EntryId
    actor: Text | None = Field(
        None, min_length=1, max_length=200, pattern=NOT_BLANK, description="who read it; omitted: this key"
    )
    dispatch: StrictBool = Field(False, description="it went into a real agent context")


class LinkArgs(_Args, RelationshipIn):
    pass


class PreviewArgs(_Args):
    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["full", "prune", "decay", "hygiene", "contradictions", "consolidate"] = "full"
    top: int = Field(
        PREVIEW_TOP_DEFAULT, ge=1, le=PREVIEW_TOP_MAX, description="affected ids listed per action"
    )


class NoArgs(_Args):
    model_config = ConfigDict(extra="forbid")


# --- tool results that are not an endpoint's --------------------------------------------------------


class AffectedTopOut(BaseModel):
    archived: list[int]
    tombstoned: list[int]
    purged: list[int]
    proposed_archive: list[int]
    proposed_tombstone: list[int]


class PreviewOut(BaseModel):
    """A dry run: what a real run of this kind would change now (nothing was changed). On a
    large workspace the dry run is queued for the worker instead: then ``status`` is
    ``queued``, ``url`` names its record and the counts come with that record once it ended."""

    run_id: int = Field(description="The dry run's record (GET /api/v1/maintenance/runs/{id})")
    kind: str
    dry_run: bool
    status: str
    counts: CountsOut | None = Field(None, description="None while the dry run is queued")
    affected_counts: dict[str, int] | None = Field(
        None, description="How many entries each action would affect (None while queued)"
    )
    affected_top: AffectedTopOut | None = Field(
        None, description="The first `top` of them per action (None while queued)"
    )
    proposed: ProposedCountsOut | None = None
    breaker: BreakerOut | None = None
    url: str | None = Field(None, description="Queued: the run's record in the API, to read once it ended")
    note: str | None = None


# --- tools -----------------------------------------------------------------------------------------


def _store(request: HttpRequest, args: StoreArgs) -> Any:
    return api.create_entry(request, args).value


def _search(request: HttpRequest, args: SearchArgs) -> Any:
    return api_search.search_entries(
        request, q=args.query, limit=args.limit, offset=args.offset, include_archived=args.include_archived
    )


def _get(request: HttpRequest, args: GetArgs) -> Any:
    return api.get_entry(request, args.id)


def _recent(request: HttpRequest, args: RecentArgs) -> Any:
    return api.list_entries(request, args)


def _update(request: HttpRequest, args: UpdateArgs) -> Any:
    patch = EntryPatchIn.model_validate(args.model_dump(exclude_unset=True, exclude={"id"}))
    return api.update_entry(request, args.id, patch)


def _forget(request: HttpRequest, args: GetArgs) -> Any:
    return api.delete_entry(request, args.id, DeleteQuery(purge=False))


def _feedback(request: HttpRequest, args: FeedbackArgs) -> Any:
    return api.give_entry_feedback(request, args.id, FeedbackIn(signal=args.signal))


def _access(request: HttpRequest, args: AccessArgs) -> Any:
    actor = args.actor if args.actor is not None else request.principal.actor  # type: ignore[attr-defined]
    return api.record_entry_access(request, args.id, AccessIn(actor=actor, dispatch=args.dispatch))


def _link(request: HttpRequest, args: LinkArgs) -> Any:
    return api.create_relationship(request, args).value


def _preview(request: HttpRequest, args: PreviewArgs) -> Any:
    if args.kind == "prune":
        payload: RunIn = PruneIn.model_validate({"dry_run": True})
        params: dict[str, Any] = {"params": payload.model_dump(include=set(PRUNE_PARAMS))}
    else:
        payload, params = RunIn.model_validate({"dry_run": True}), {}
    result = maintenance_api.start_run(request, payload, args.kind, **params)
    if isinstance(result, maintenance_api.Queued):
        return {
            **result.body,
            "note": "The workspace is large: this dry run was queued for the worker and works in the "
            f"background. Read its counts at {result.body['url']} once its status is no longer "
            "queued or running.",
        }
    affected = result["affected"]
    proposed = affected.get("proposed") or {"archive": [], "tombstone": []}
    lists = {
        "archived": affected["archived"],
        "tombstoned": affected["tombstoned"],
        "purged": affected["purged"],
        "proposed_archive": proposed["archive"],
        "proposed_tombstone": proposed["tombstone"],
    }
    return {
        **result,
        "affected_counts": {name: len(ids) for name, ids in lists.items()},
        "affected_top": {name: ids[: args.top] for name, ids in lists.items()},
    }


def _stats(request: HttpRequest, args: NoArgs) -> Any:
    return maintenance_api.stats(request)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    args: type[_Args]
    out: type[BaseModel]
    run: Callable[[HttpRequest, Any], Any]
    read_only: bool
    destructive: bool = False
    idempotent: bool = False


READ = {"read_only": True, "idempotent": True}
TOOLS: list[ToolSpec] = [
    ToolSpec(
        "memory_store",
        "Store a memory",
        "Store a memory (content required; title, type, tier, tags, code anchors, links to other "
        "memories, impact/trust, significance, pinned, expires_at, staged_class). Returns it with "
        "its id and any contradictions (disputes) a constitutional rule was found to be part of.",
        StoreArgs,
        EntryCreateOut,
        _store,
        read_only=False,
    ),
    ToolSpec(
        "memory_search",
        "Search memories",
        "Full-text search of the live memories (archived ones too with include_archived), best "
        "first: text rank, then importance. Paginated: `limit` (default 10) from `offset`; `count` "
        "is the total; snippets mark matched words between « and ».",
        SearchArgs,
        api_search.SearchOut,
        _search,
        **READ,
    ),
    ToolSpec(
        "memory_get",
        "Read one memory",
        "One memory by id: every field, its importance breakdown, tags, code anchors and links.",
        GetArgs,
        EntryDetailOut,
        _get,
        **READ,
    ),
    ToolSpec(
        "memory_recent",
        "List memories",
        "The latest visible memories, newest first (sort recent, the default), or by importance or "
        "retention; filters status, entry_type, tier, tag, project, include_archived, "
        "include_staged. Paginated: `limit` (default 20) from `offset`; `count` is the total.",
        RecentArgs,
        EntryPageOut,
        _recent,
        **READ,
    ),
    ToolSpec(
        "memory_update",
        "Update a memory",
        "Change the fields given of a memory's latest version; changed content makes a new version "
        "(the old one is kept in its lineage). `tags` and `anchors` replace the current ones.",
        UpdateArgs,
        EntryUpdateOut,
        _update,
        read_only=False,
    ),
    ToolSpec(
        "memory_forget",
        "Forget a memory",
        "Tombstone a memory: it leaves every list, search and briefing at once; an operator can "
        "restore it until it is purged after the workspace's grace period.",
        GetArgs,
        EntryTombstoneOut,
        _forget,
        read_only=False,
        destructive=True,
        idempotent=True,
    ),
    ToolSpec(
        "memory_feedback",
        "Give feedback on a memory",
        "helpful / not_helpful step the memory's salience; stale / wrong drop it and flag it for an "
        "operator's review.",
        FeedbackArgs,
        EntryOut,
        _feedback,
        read_only=False,
    ),
    ToolSpec(
        "memory_access",
        "Record a read",
        "Record that an actor (default: this key) read the memory; dispatch=true means it went into "
        "a real agent context (counts toward graduating a staged trace).",
        AccessArgs,
        EntryOut,
        _access,
        read_only=False,
    ),
    ToolSpec(
        "memory_link",
        "Link two memories",
        "Link one memory to another (references, implements, caused, supersedes, contradicts, ...). "
        "An identical link is reported (duplicate: true), not made twice.",
        LinkArgs,
        RelationshipOut,
        _link,
        read_only=False,
        idempotent=True,
    ),
    ToolSpec(
        "memory_maintenance_preview",
        "Preview maintenance",
        "A dry run of maintenance (full, prune, decay, hygiene, contradictions or consolidate): "
        "what a real run would archive, tombstone or purge now, with counts and the first ids per "
        "action. Changes no memory; the dry run is recorded in the run history.",
        PreviewArgs,
        PreviewOut,
        _preview,
        **READ,
    ),
    ToolSpec(
        "memory_stats",
        "Workspace statistics",
        "Entries by status, tags, links, anchors, open tombstones and disputes, the last run of each "
        "kind and the maintenance policy.",
        NoArgs,
        StatsOut,
        _stats,
        **READ,
    ),
]


def make_tool(spec: ToolSpec) -> Tool:
    def call(args: _Args) -> CallToolResult:
        def work() -> CallToolResult:
            who = caller()
            request = call_request(who)
            data, text = dump(spec.out, spec.run(request, args), request)
            return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)

        try:
            return in_django(work)  # type: ignore[no-any-return]
        except ServiceError as exc:
            raise ToolError(refusal_text(exc)) from None

    call.__name__ = spec.name
    return Tool(
        fn=call,
        name=spec.name,
        title=spec.title,
        description=spec.description,
        parameters=spec.args.model_json_schema(by_alias=True),
        # The published output schema is the API's out-schema; the result is built by dump()
        # above, exactly as the API renders it, and handed over as it is.
        fn_metadata=FuncMetadata(arg_model=spec.args, output_schema=output_schema(spec.out)),
        is_async=False,
        context_kwarg=None,
        annotations=ToolAnnotations(
            title=spec.title,
            read_only_hint=spec.read_only,
            destructive_hint=spec.destructive,
            idempotent_hint=spec.idempotent,
            open_world_hint=False,
        ),
    )
