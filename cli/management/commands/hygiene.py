"""``manage.py hygiene --workspace SLUG``: the hygiene queue with each candidate's
content excerpt, filtered by ``--recommendation`` and ``--reason`` as the console's tab is (the
same selector); ``--apply ID...`` archives candidates, ``--keep ID...`` keeps entries."""

import re
from typing import Any

from django.core.management.base import CommandParser

from cli.management.commands._base import WorkspaceCommand
from maintenance import hygiene, hygiene_actions
from maintenance.hygiene import candidate_rows
from maintenance.selectors import hygiene_reason_codes

LINE_CHARS = 70


class Command(WorkspaceCommand):
    help = "Show a workspace's hygiene queue, or archive (--apply) or keep (--keep) entries from it."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        action = parser.add_mutually_exclusive_group()
        action.add_argument(
            "--apply", nargs="+", type=int, metavar="ID", help="Archive these candidates of a fresh preview."
        )
        action.add_argument(
            "--keep", nargs="+", type=int, metavar="ID", help="Keep these entries out of the queue."
        )
        parser.add_argument("--recommendation", choices=["archive", "review"], help="Only these candidates.")
        parser.add_argument(
            "--reason", choices=hygiene_reason_codes(), help="Only candidates with this reason."
        )
        parser.add_argument("--limit", type=int, default=50, help="Candidates to show (default 50).")
        parser.add_argument("--offset", type=int, default=0, help="Candidates to skip (default 0).")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        if options["apply"]:
            result = hygiene_actions.apply(workspace, options["apply"], actor="cli")
            self._report(result, "archived", options["json"])
        elif options["keep"]:
            result = hygiene_actions.keep(workspace, options["keep"], actor="cli")
            self._report(result, "kept", options["json"])
        else:
            preview = queue(
                workspace,
                recommendation=options["recommendation"],
                reason=options["reason"],
                limit=options["limit"],
                offset=options["offset"],
            )
            if options["json"]:
                self.emit_json(preview)
            else:
                self.stdout.write(table(preview, options["offset"]))

    def _report(self, result: dict[str, Any], done: str, as_json: bool) -> None:
        if as_json:
            self.emit_json(result)
            return
        ids = ", ".join(map(str, result[done])) or "none"
        skipped = ", ".join(map(str, result["skipped"])) or "none"
        self.stdout.write(f"{done}: {ids}\nskipped: {skipped}")


def queue(
    workspace: Any, *, recommendation: str | None, reason: str | None, limit: int, offset: int
) -> dict[str, Any]:
    """One page of the candidates matching the filters, in the shape of ``hygiene.preview``
    (``count`` = the matching candidates; ``total`` = all candidates of the queue)."""
    matching, found = hygiene.page(
        workspace, limit=limit, offset=offset, recommendation=recommendation, reason=reason
    )
    rows = candidate_rows(found)
    return {
        "count": matching,
        "total": hygiene.count(workspace) if recommendation or reason else matching,
        "candidates": [
            {
                "id": r["id"],
                "title": r["title"],
                "content_excerpt": r["excerpt"],
                **{k: r[k] for k in ("entry_type", "source", "created_at", "access_count", "score")},
                "reasons": r["reasons"],
                "recommendation": r["recommendation"],
            }
            for r in rows
        ],
    }


def _line(title: str, content: str) -> str:
    text = re.sub(r"\s+", " ", f"{title} — {content}" if title else content).strip()
    return text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 1].rstrip() + "…"


def table(preview: dict[str, Any], offset: int = 0) -> str:
    rows = preview["candidates"]
    filtered = preview["count"] != preview.get("total", preview["count"])
    of = (
        f"{preview['count']} matching candidates (of {preview['total']})"
        if filtered
        else (f"{preview['count']} candidates")
    )
    if not rows:
        return f"{of}; none on this page"
    lines = [f"{'id':>8}  {'score':>5}  {'recommend':<9}  entry / reasons"]
    for c in rows:
        reasons = "; ".join(f"{r['code']} ({r['detail']})" for r in c["reasons"])
        entry = f"{_line(c['title'], c['content_excerpt'])} ({c['entry_type']}, {c['source']})"
        lines.append(f"{c['id']:>8}  {c['score']:>5}  {c['recommendation']:<9}  {entry}")
        lines.append(f"{'':>8}  {'':>5}  {'':<9}  {reasons}")
    first = max(offset, 0) + 1
    lines.append(f"{first}–{first + len(rows) - 1} of {of}")
    return "\n".join(lines)
