from typing import Any

from django.core.management.base import CommandParser

from maintenance import hygiene
from memory.management.commands._base import WorkspaceCommand


class Command(WorkspaceCommand):
    help = (
        "Show a workspace's hygiene queue (SPEC §4.4), or archive (--apply) or keep (--keep) entries from it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        action = parser.add_mutually_exclusive_group()
        action.add_argument(
            "--apply", nargs="+", type=int, metavar="ID", help="Archive these candidates of a fresh preview."
        )
        action.add_argument(
            "--keep", nargs="+", type=int, metavar="ID", help="Keep these entries out of the queue."
        )
        parser.add_argument("--limit", type=int, default=50, help="Candidates to show (default 50).")
        parser.add_argument("--offset", type=int, default=0, help="Candidates to skip (default 0).")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        if options["apply"]:
            result = hygiene.apply(workspace, options["apply"], actor="cli")
            self._report(result, "archived", options["json"])
        elif options["keep"]:
            result = hygiene.keep(workspace, options["keep"], actor="cli")
            self._report(result, "kept", options["json"])
        else:
            preview = hygiene.preview(workspace, limit=options["limit"], offset=options["offset"])
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


def table(preview: dict[str, Any], offset: int = 0) -> str:
    rows = preview["candidates"]
    if not rows:
        return f"{preview['count']} candidates; none on this page"
    lines = [f"{'id':>8}  {'score':>5}  {'recommend':<9}  reasons"]
    for c in rows:
        reasons = "; ".join(f"{r['code']} ({r['detail']})" for r in c["reasons"])
        lines.append(f"{c['id']:>8}  {c['score']:>5}  {c['recommendation']:<9}  {reasons}")
    first = max(offset, 0) + 1
    lines.append(f"{first}–{first + len(rows) - 1} of {preview['count']} candidates")
    return "\n".join(lines)
