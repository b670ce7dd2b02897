"""``manage.py proposals --workspace SLUG``: the open proposal set, approved or
rejected from the command line.

Without an action it lists the open set grouped by reason, each proposal with its entry's
content excerpt and the values that decided it. ``--approve ID...`` / ``--approve-all`` and
``--reject ID...`` / ``--reject-all`` call ``maintenance.proposals.approve`` / ``reject``; with
``--json`` their return value is printed as is. An id that names no open proposal is reported
and makes the command exit non-zero (after the others were decided), like any refusal.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models.functions import Substr

from cli.management.commands._base import WorkspaceCommand, service_errors
from maintenance import proposals
from maintenance.models import ProposalAction
from memory.errors import Conflict
from memory.models import Workspace
from memory.models.choices import EXCERPT_CHARS
from memory.policy_model import MaintenancePolicy

LINE_CHARS = 60
IDS_SHOWN = 20
NO_PROPOSAL = "no open proposal for this entry"


class Command(WorkspaceCommand):
    help = (
        "List a workspace's open proposals (what propose-mode runs want to archive or tombstone), "
        "or approve or reject them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        decide = parser.add_mutually_exclusive_group()
        decide.add_argument(
            "--approve", nargs="+", type=int, metavar="ID", help="Approve the proposals of these entries."
        )
        decide.add_argument(
            "--approve-all", action="store_true", help="Approve every open proposal (of --reason/--action)."
        )
        decide.add_argument(
            "--reject", nargs="+", type=int, metavar="ID", help="Reject these entries' proposals."
        )
        decide.add_argument(
            "--reject-all", action="store_true", help="Reject every open proposal (of --reason/--action)."
        )
        parser.add_argument("--reason", choices=list(proposals.ACTIONS), help="Only proposals of this pass.")
        parser.add_argument("--action", choices=ProposalAction.values, help="Only archives or tombstones.")
        parser.add_argument("--force", action="store_true", help="Approve even if the circuit breaker trips.")
        parser.add_argument(
            "--limit", type=int, default=20, help="Proposals listed per reason (default 20; 0 lists all)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        approving = bool(options["approve"] or options["approve_all"])
        deciding = approving or bool(options["reject"] or options["reject_all"])
        if options["force"] and not approving:
            raise CommandError("--force only applies to --approve or --approve-all")
        if options["action"] and (options["approve"] or options["reject"]):
            raise CommandError("--action selects with --approve-all, --reject-all or the list, not with ids")
        if options["limit"] < 0:
            raise CommandError("--limit must be 0 (all) or more")
        if not deciding:
            listing = open_list(
                workspace, reason=options["reason"], action=options["action"], limit=options["limit"]
            )
            if options["json"]:
                self.emit_json(listing)
            else:
                self.stdout.write(table(listing, workspace))
            return
        ids = options["approve"] or options["reject"]
        selection: dict[str, Any] = {"ids": ids} if ids else {"all": True}
        if not ids and options["action"]:
            # approve/reject select by reason; an action is the open ids of that action.
            selection = {"ids": list(_open_ids(workspace, options["reason"], options["action"]))}
        # The proposing runs, for the undo hint: an approved change is an event of its run.
        named = proposals.open_set(workspace, reason=options["reason"])
        if "ids" in selection:
            named = named.filter(entry_ref__in=selection["ids"])
        runs = sorted(set(named.values_list("run_id", flat=True)))
        with service_errors():
            if approving:
                try:
                    result = proposals.approve(
                        workspace, **selection, reason=options["reason"], actor="cli", force=options["force"]
                    )
                except Conflict as exc:
                    if "circuit breaker" not in exc.detail:
                        raise
                    raise CommandError(
                        f"{exc.detail.split('; ')[0]}; nothing was applied. Check them "
                        f"(manage.py proposals --workspace {workspace.slug} --action tombstone), then "
                        "approve again with --force, or approve fewer (--reason R, --approve ID...)"
                    ) from exc
            else:
                result = proposals.reject(workspace, **selection, reason=options["reason"], actor="cli")
        if options["json"]:
            self.emit_json(result)
        else:
            self.stdout.write(decided(result, workspace, runs))
        unknown = [s["id"] for s in result["skipped"] if s["why"] == NO_PROPOSAL]
        if ids and unknown:
            which = "this entry" if len(unknown) == 1 else "these entries"
            raise CommandError(
                f"{_ids(unknown)}: no open proposal for {which} in workspace {workspace.slug!r} "
                f"(list them with: manage.py proposals --workspace {workspace.slug})"
            )


def _open_ids(workspace: Workspace, reason: str | None, action: str | None) -> list[int]:
    qs = proposals.open_set(workspace, reason=reason, action=action)
    return list(qs.values_list("entry_ref", flat=True))


def open_list(workspace: Workspace, *, reason: str | None, action: str | None, limit: int) -> dict[str, Any]:
    """The open set, by reason in run order: each group's count and its first ``limit``
    proposals (0: all), with their entries' title and content excerpt (one query per group)."""
    groups = []
    for group in proposals.counts_by_reason(workspace):
        if (reason and group["reason"] != reason) or (action and group["action"] != action):
            continue
        qs = (
            proposals.open_set(workspace, reason=group["reason"])
            .annotate(excerpt=Substr("entry__content", 1, EXCERPT_CHARS))
            .values("entry_ref", "action", "why", "values", "run_id", "created_at", "entry__title", "excerpt")
        )
        rows = [
            {
                "id": p["entry_ref"],
                "action": p["action"],
                "why": p["why"],
                "values": p["values"],
                "run_id": p["run_id"],
                "proposed_at": p["created_at"],
                "title": p["entry__title"] or "",
                "content_excerpt": p["excerpt"] or "",
            }
            for p in (qs[:limit] if limit else qs)
        ]
        groups.append({**group, "proposals": rows})
    return {
        "workspace": workspace.slug,
        "count": sum(g["count"] for g in groups),
        "reasons": groups,
    }


def _line(title: str, content: str) -> str:
    text = re.sub(r"\s+", " ", f"{title} — {content}" if title else content).strip()
    return text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 1].rstrip() + "…"


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:IDS_SHOWN]))
    return shown + (f", … ({len(ids)} in all; --json lists every id)" if len(ids) > IDS_SHOWN else "")


def table(listing: dict[str, Any], workspace: Workspace) -> str:
    slug = workspace.slug
    if not listing["count"]:
        mode = MaintenancePolicy.for_workspace(workspace).review_mode
        note = (
            "review mode is apply: runs change entries at once (revert them with manage.py revert_run)"
            if mode == "apply"
            else "the next maintenance run records what it would archive or tombstone here"
        )
        return f"No open proposals in workspace {slug!r}; {note}."
    lines = [
        f"{listing['count']} proposals await approval in workspace {slug!r}; "
        "none of these entries has been archived or tombstoned.",
    ]
    for group in listing["reasons"]:
        lines += ["", f"{group['label']} ({group['reason']}, {group['action']}): {group['count']}"]
        lines.append(f"  {'id':>8}  {'entry':<{LINE_CHARS}}  why")
        for p in group["proposals"]:
            entry = _line(p["title"], p["content_excerpt"])
            lines.append(f"  {p['id']:>8}  {entry:<{LINE_CHARS}}  {p['why']}")
        more = group["count"] - len(group["proposals"])
        if more > 0:
            lines.append(f"  … and {more} more (--reason {group['reason']} --limit 0 lists them all)")
    lines += [
        "",
        f"Approve: manage.py proposals --workspace {slug} --approve ID... | --approve-all [--reason R]"
        " [--force]",
        f"Reject:  manage.py proposals --workspace {slug} --reject ID... | --reject-all [--reason R]"
        " (the entries are held: automation leaves them alone)",
    ]
    return "\n".join(lines)


def decided(result: dict[str, Any], workspace: Workspace, runs: list[int]) -> str:
    if "applied" in result:
        done = result["applied"]
        lines = [f"approved and applied {len(done)}: {_ids(done) if done else 'none'}"]
    else:
        done = result["rejected"]
        held = " (held: automation leaves them alone)" if done else ""
        lines = [f"rejected {len(done)}: {_ids(done) if done else 'none'}{held}"]
    skipped = result["skipped"]
    if skipped:
        lines.append(f"skipped {len(skipped)}:")
        lines += [f"  {s['id']:>8}  {s['why']}" for s in skipped[:IDS_SHOWN]]
        if len(skipped) > IDS_SHOWN:
            lines.append(f"  … and {len(skipped) - IDS_SHOWN} more (--json lists them all)")
    if result.get("backup_file"):
        lines.append(f"backup: {result['backup_file']}")
    if "applied" in result and done and runs:
        lines += [
            f"undo: manage.py revert_run {run} --workspace {workspace.slug} "
            f"reverts what was approved from run {run}"
            for run in runs
        ]
    return "\n".join(lines)
