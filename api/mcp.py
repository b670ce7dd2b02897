"""The MCP server: the tools of ``api.mcp_tools``, the briefing and entry resources and the
session-summary prompt, on the official ``mcp`` SDK (``MCPServer``). Every call runs as
``api.mcp_calls`` describes: as the API key's principal, its connection handed back after.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, cast

from django.db.models import QuerySet
from django.utils import timezone
from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.types import INVALID_PARAMS

from api import entries as api
from api.mcp_calls import call_request, caller, dump, in_django, refusal_text
from api.mcp_tools import TOOLS, RecentArgs, make_tool
from api.schemas import EntryDetailOut
from memory import selectors
from memory.auth import Principal
from memory.errors import NotFound, ServiceError
from memory.models import Entry
from memory.models.choices import Tier
from memory.models.entries import EntryQuerySet

SERVER_NAME = "memory-steward"
INSTRUCTIONS = (
    "A Memory Steward workspace: memories (decisions, fixes, observations, rules) that agents "
    "store and that the workspace keeps lean. Read memory://briefing at the start of a session "
    "(constitutional rules first, then the most important memories, within a token budget); "
    "search before storing to avoid duplicates; give feedback when a memory helped or misled."
)
BRIEFING_BUDGET_DEFAULT = 2000  # tokens (estimated as characters / 4)
BRIEFING_BUDGET_MIN = 200
BRIEFING_BUDGET_MAX = 20_000
BRIEFING_CHUNK = 50  # entries read per query while the budget lasts
SUMMARY_ENTRIES = 12


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
        tools=[make_tool(spec) for spec in TOOLS],
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
            request = call_request(who)
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
            request = call_request(who)
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
