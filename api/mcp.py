"""The MCP endpoint's tools, resources and prompt: the agent API spoken as the Model Context
Protocol, on the official ``mcp`` SDK (``MCPServer``).

Every tool is the JSON API's own endpoint function called with the caller's principal: the
same role check (``require``), the same services and selectors, the same refusals. Its
arguments are validated by the API's own in-schema (``api.schemas``, strict, unknown keys
refused) before it runs, and its structured result is the API's out-schema dumped exactly as
the API renders it, so a tool's output and the endpoint's JSON body are the same object. A
refusal becomes an MCP tool error whose text carries the API's status and ``detail``.

Who calls is fixed by the API key, never by an argument: over HTTP the key is the bearer token
(``api.mcp_http`` verifies it through ``memory.auth.key_principal``, the JSON API's door);
over stdio (``manage.py mcp_stdio --key``) the same function checks the key on every call, so
a revoked key stops working at once and the per-key rate limit counts every call.

Tools run on the SDK's worker threads (plain ``def`` handlers); each call hands its database
connection back afterwards, as a request does at request_finished.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal, cast

from django.db import close_old_connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from mcp import MCPError
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from api import entries as api
from api import maintenance as maintenance_api
from api import search as api_search
from api.maintenance_schemas import BreakerOut, CountsOut, ProposedCountsOut, PruneIn, RunIn
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
from memory import selectors
from memory.auth import Principal, key_principal
from memory.errors import Forbidden, NotFound, ServiceError
from memory.models import Entry, EntryQuerySet, Tier
from memory.search import LIMIT_MAX, OFFSET_MAX, Q_MAX

SERVER_NAME = "memory-steward"
INSTRUCTIONS = (
    "A Memory Steward workspace: memories (decisions, fixes, observations, rules) that agents "
    "store and that the workspace keeps lean. Read memory://briefing at the start of a session "
    "(constitutional rules first, then the most important memories, within a token budget); "
    "search before storing to avoid duplicates; give feedback when a memory helped or misled."
)
SEARCH_LIMIT_DEFAULT = 10
RECENT_LIMIT_DEFAULT = 20
PREVIEW_TOP_DEFAULT = 10
PREVIEW_TOP_MAX = 100
BRIEFING_BUDGET_DEFAULT = 2000  # tokens (estimated as characters / 4)
BRIEFING_BUDGET_MIN = 200
BRIEFING_BUDGET_MAX = 20_000
BRIEFING_CHUNK = 50  # entries read per query while the budget lasts
SUMMARY_ENTRIES = 12


# --- who calls ------------------------------------------------------------------------------------


class KeyAccess(AccessToken):
    """The SDK's access token of a verified API key, carrying its principal."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    principal: Principal = Field(exclude=True)


@dataclass
class _Stdio:
    key: str | None = None


STDIO = _Stdio()  # set by ``manage.py mcp_stdio``: the key every stdio call is checked with


def caller() -> Principal:
    """The principal of the current call: the bearer key's (HTTP), else the stdio key's."""
    token = get_access_token()
    if isinstance(token, KeyAccess):
        return token.principal
    if STDIO.key is not None:
        found = key_principal(STDIO.key)
        if found is None:
            raise Forbidden("the API key is unknown or revoked")
        return found
    raise Forbidden("authentication required: Authorization: Bearer <key>")


def _request(who: Principal) -> HttpRequest:
    """A request standing for the call, as the API's endpoint functions read it."""
    request = HttpRequest()
    request.method = "POST"
    request.principal = who  # type: ignore[attr-defined]
    return request


def refusal_text(exc: ServiceError) -> str:
    """The API's answer to a refusal as one line: status, reason phrase, detail (and the ids a
    client needs to act on it, as the API puts them beside ``detail``)."""
    text = f"{exc.status_code} {HTTPStatus(exc.status_code).phrase}: {exc.detail}"
    if exc.fields:
        text += " " + json.dumps(exc.fields, default=str, sort_keys=True)
    return text


def in_django(work: Callable[[], Any]) -> Any:
    """Run ``work`` as a request's thread would: stale connections closed first, the
    connection handed back after."""
    close_old_connections()
    try:
        return work()
    finally:
        close_old_connections()


def dump(out: type[BaseModel], value: Any, request: HttpRequest) -> tuple[dict[str, Any], str]:
    """``value`` through the out-schema, as the API would render it: the JSON object and its
    text (both written by pydantic's compiled serialiser)."""
    model = out.model_validate(value, context={"request": request})
    return model.model_dump(mode="json"), model.model_dump_json()


def output_schema(out: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of what ``dump`` writes (field names, not aliases, as the API renders)."""
    return out.model_json_schema(mode="serialization", by_alias=False)


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


def _tool(spec: ToolSpec) -> Tool:
    def call(args: _Args) -> CallToolResult:
        def work() -> CallToolResult:
            who = caller()
            request = _request(who)
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


# --- resources and prompt ---------------------------------------------------------------------------


def _invalid(message: str) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=message)


def _parse_int(value: str, name: str, low: int, high: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise _invalid(f"422 Unprocessable Content: {name}: must be an integer") from None
    if not low <= n <= high:
        raise _invalid(f"422 Unprocessable Content: {name}: must be between {low} and {high}")
    return n


def _tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _briefing_rows(who: Principal, cursor: tuple[int, int]) -> Iterator[tuple[tuple[int, int], Entry]]:
    """The live memories of the briefing from ``cursor`` on, each with its own cursor:
    constitutional rules first (phase 0), then every other memory (phase 1), each by importance
    as the API's default list sorts them."""
    phase, offset = cursor
    while phase < 2:
        rows: QuerySet[Entry]
        if phase == 0:
            rules = cast(EntryQuerySet, selectors.entry_list(who.workspace, tier=Tier.CONSTITUTIONAL))
            rows = rules.on_index("entry_constitutional")
        else:
            rows = selectors.entry_list(who.workspace, sort="importance").exclude(tier=Tier.CONSTITUTIONAL)
        chunk = list(rows[offset : offset + BRIEFING_CHUNK])
        selectors.with_tag_names(chunk)
        for i, entry in enumerate(chunk):
            yield (phase, offset + i), entry
        if len(chunk) < BRIEFING_CHUNK:
            phase, offset = phase + 1, 0
        else:
            offset += BRIEFING_CHUNK


def _entry_block(entry: Entry) -> str:
    tags = f" · tags {', '.join(entry.tag_names)}" if entry.tag_names else ""
    head = f"## #{entry.pk} {entry.title or '(untitled)'}"
    meta = f"{entry.entry_type} · {entry.tier} · importance {entry.importance:.2f}{tags}"
    return f"{head}\n{meta}\n\n{entry.content.strip()}\n"


def _parse_cursor(cursor: str) -> tuple[int, int]:
    if not cursor:
        return (0, 0)
    phase, sep, offset = cursor.partition(".")
    if not sep or phase not in ("0", "1") or not offset.isdigit() or len(offset) > 10:
        raise _invalid("422 Unprocessable Content: cursor: not a cursor this briefing gave")
    return (int(phase), int(offset))


def briefing(who: Principal, budget: int = BRIEFING_BUDGET_DEFAULT, cursor: str = "") -> str:
    """The most important live memories within ``budget`` tokens, constitutional rules first,
    as Markdown; ends with the URI of the next page when more remain."""
    start = _parse_cursor(cursor)
    parts = [
        f"# Memory briefing: {who.workspace.name or who.workspace.slug}\n"
        "Constitutional rules first, then the most important memories. Read one in full with "
        "memory://entry/{id}.\n"
    ]
    used = _tokens(parts[0])
    shown = 0
    more: tuple[int, int] | None = None
    for position, entry in _briefing_rows(who, start):
        block = _entry_block(entry)
        cost = _tokens(block)
        if used + cost > budget:
            if shown == 0:  # one memory larger than the budget: its beginning, said so
                room = max(0, (budget - used) * 4 - 80)
                parts.append(block[:room].rstrip() + f"\n[… truncated: read memory://entry/{entry.pk}]\n")
                shown = 1
                more = (position[0], position[1] + 1)
            else:
                more = position
            break
        parts.append(block)
        used += cost
        shown += 1
    if shown == 0:
        parts.append("No live memories yet.\n")
    if more is not None:
        parts.append(f"\nMore: memory://briefing?budget={budget}&cursor={more[0]}.{more[1]}\n")
    return "\n".join(parts)


def build_server(**auth: Any) -> MCPServer:
    """The MCP server with every tool, resource and prompt. ``auth``: the SDK's
    ``token_verifier`` and ``auth`` settings, for HTTP (``api.mcp_http``); none for stdio."""
    server: MCPServer = MCPServer(
        SERVER_NAME,
        title="Memory Steward",
        instructions=INSTRUCTIONS,
        tools=[_tool(spec) for spec in TOOLS],
        warn_on_duplicate_resources=False,
        **auth,
    )

    def read(work: Callable[[Principal], str], uri: str) -> str:
        def run() -> str:
            return work(caller())

        try:
            return in_django(run)  # type: ignore[no-any-return]
        except NotFound as exc:
            raise ResourceNotFoundError(refusal_text(exc)) from None
        except ServiceError as exc:
            raise MCPError(code=INVALID_PARAMS, message=refusal_text(exc), data={"uri": uri}) from None

    @server.resource(
        "memory://briefing",
        name="briefing",
        title="Memory briefing",
        description=f"The most important live memories within {BRIEFING_BUDGET_DEFAULT} tokens, "
        "constitutional rules first; the last line names the next page.",
        mime_type="text/markdown",
    )
    def briefing_default() -> str:
        return read(briefing, "memory://briefing")

    @server.resource(
        "memory://briefing{?budget,cursor}",
        name="briefing-page",
        title="Memory briefing (budget, page)",
        description=f"The briefing within `budget` tokens ({BRIEFING_BUDGET_MIN}..{BRIEFING_BUDGET_MAX}), "
        "from `cursor` (as the previous page's last line gives it).",
        mime_type="text/markdown",
    )
    def briefing_page(budget: str = str(BRIEFING_BUDGET_DEFAULT), cursor: str = "") -> str:
        tokens = _parse_int(budget, "budget", BRIEFING_BUDGET_MIN, BRIEFING_BUDGET_MAX)
        return read(lambda who: briefing(who, tokens, cursor), "memory://briefing")

    @server.resource(
        "memory://entry/{id}",
        name="entry",
        title="One memory",
        description="One memory as JSON: every field, importance breakdown, tags, anchors, links "
        "(what memory_get returns).",
        mime_type="application/json",
    )
    def entry_resource(id: str) -> str:
        uri = f"memory://entry/{id}"
        if not id.isdigit() or len(id) > 19:
            raise ResourceNotFoundError(f"404 Not Found: entry {id} not found")

        def work(who: Principal) -> str:
            request = _request(who)
            detail = api.get_entry(request, int(id))
            return dump(EntryDetailOut, detail, request)[1]

        return read(work, uri)

    @server.prompt(
        "session-summary",
        title="Session summary",
        description="Write the end-of-session summary (Accomplished / Unfinished / Context for Next "
        "Session) from the workspace's most important recent memories; store it with memory_store.",
    )
    def session_summary(project: str = "") -> str:
        def work(who: Principal) -> str:
            request = _request(who)
            query = RecentArgs.model_validate({"sort": "recent", "limit": 50, "project": project or None})
            page = api.list_entries(request, query)
            entries = sorted(page["items"], key=lambda e: e.importance, reverse=True)[:SUMMARY_ENTRIES]
            lines = [
                f"- #{e.pk} [{e.entry_type}, importance {e.importance:.2f}, "
                f"{timezone.localtime(e.created_at):%Y-%m-%d}] {e.title or e.content[:80]}: "
                f"{' '.join(e.content.split())[:300]}"
                for e in entries
            ]
            recent = "\n".join(lines) or "- (no memories yet)"
            scope = f" of project {project!r}" if project else ""
            return (
                f"Summarise this working session{scope} for whoever continues it. Use three "
                "sections, in this order:\n\n## Accomplished\nWhat was done and decided, with the "
                "memory ids it rests on.\n\n## Unfinished\nWhat is open, blocked or half done, and "
                "the next concrete step for each.\n\n## Context for Next Session\nWhat the next "
                "session must know first: constraints, rules, pitfalls, where things are.\n\n"
                "Then store the summary with memory_store (entry_type retrospective).\n\n"
                f"The workspace's most important recent memories{scope}:\n{recent}\n"
            )

        if len(project) > 200 or "\x00" in project:
            raise ValueError("project: at most 200 characters, no NUL")
        return read(work, "prompt://session-summary")

    return server
