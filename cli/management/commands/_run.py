"""Shared plumbing of the maintenance commands: a progress bar over the passes on a terminal
and the human summary of a result object (changes apart from metrics; a blocked, proposed or
skipped run says why and what to do next)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

from maintenance.models import MaintenanceRun, RunKind, RunStatus
from maintenance.run_results import COUNT_KEYS, METRICS, PROPOSING
from maintenance.runs import steps


@contextmanager
def pass_progress(kind: str, *, enabled: bool) -> Iterator[Callable[[str], None] | None]:
    """A tqdm bar advanced once per pass; only on a terminal and never with --json."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    bar = tqdm(total=len(steps(kind)), desc=f"{kind} run", unit="pass", file=sys.stderr, leave=False)

    def step(name: str) -> None:
        bar.set_postfix_str(name)
        bar.update(1)

    try:
        yield step
    finally:
        bar.close()


def _listed(counts: dict[str, Any], keys: tuple[str, ...] | list[str]) -> str:
    return ", ".join(_shown(k, counts[k]) for k in keys if counts.get(k))


def _shown(key: str, value: Any) -> str:
    if isinstance(value, dict):  # reclaimed_rows: rows removed by kind
        return f"{key} " + "/".join(f"{kind} {n}" for kind, n in value.items())
    return f"{key} {value}"


def summary(result: dict[str, Any], *, command: str) -> str:
    """A run's result for a person: what it changed, apart from what it measured; and for a
    blocked, proposed or skipped run, why and what to do next (``command`` is the command that
    ran, for the hint)."""
    counts = result["counts"]
    status = result["status"]
    dry = result["dry_run"]
    workspace = result["workspace"]
    row = MaintenanceRun.objects.filter(pk=result["run_id"]).only("error", "params").first()
    error, params = (row.error, row.params or {}) if row else ("", {})
    head = f"run {result['run_id']} ({result['kind']}{', dry run' if dry else ''}) on {workspace}: {status}"
    proposing = [*PROPOSING, "summaries_created"]
    changes = [k for k in COUNT_KEYS if k not in METRICS]
    metrics = _metrics(counts, result["kind"])
    lines: list[str] = []
    if status == RunStatus.SKIPPED:
        lines += [
            f"{head} — nothing was done",
            f"  {error or 'another run holds this workspace'}; try again when it has ended",
        ]
        return "\n".join(lines)
    if status == RunStatus.BLOCKED:
        breaker = result.get("breaker") or {}
        limit = params.get("max_tombstone_fraction")
        lines.append(f"{head} — the circuit breaker stopped it; nothing was changed")
        if breaker.get("live"):
            share = breaker["tombstones"] / breaker["live"]
            lines.append(
                f"  it would tombstone {breaker['tombstones']} of the {breaker['live']} live entries "
                f"({share:.0%}"
                + (f", more than max_tombstone_fraction {limit:.0%})" if limit is not None else ")")
            )
        elif error:
            lines.append(f"  {error}")
        lines.append(f"  would change: {_listed(counts, changes) or 'nothing'}")
        lines.append(f"  metrics: {metrics}")
        lines += [
            "  next: check what it would do (the same command with --dry-run --json lists the ids),",
            f"        then apply it anyway with --force: manage.py {command} --workspace {workspace} --force",
        ]
        return "\n".join(lines)
    if status == RunStatus.PROPOSED:
        proposed = result.get("proposed") or {}
        archives, tombstones = proposed.get("archive", 0), proposed.get("tombstone", 0)
        verb = "would await" if dry else "await"
        lines.append(
            f"{head} — {archives} archives and {tombstones} tombstones {verb} approval; "
            "nothing was archived or tombstoned"
        )
        lines.append(f"  proposed: {_listed(counts, proposing)}")
        applied = [k for k in changes if k not in proposing]
        lines.append(f"  {'would apply' if dry else 'applied'}: {_listed(counts, applied) or 'nothing'}")
        lines.append(f"  metrics: {metrics}")
        breaker = result.get("breaker") or {}
        if breaker.get("would_trip"):
            lines.append(
                f"  approving every tombstone ({breaker['tombstones']} of {breaker['live']} live entries) "
                "trips the circuit breaker: approve with --force once you have checked them"
            )
        if result.get("backup_file"):
            lines.append(f"  backup: {result['backup_file']}")
        if dry:
            lines.append(f"  a real run (manage.py {command} --workspace {workspace}) records them")
        else:
            lines += [
                f"  next: review them with 'manage.py proposals --workspace {workspace}', then",
                f"        'manage.py proposals --workspace {workspace} --approve-all [--reason R]'"
                " or '--approve ID...' / '--reject ID...'",
            ]
        return "\n".join(lines)
    lines.append(head)
    lines.append(f"  {'would change' if dry else 'changes'}: {_listed(counts, changes) or 'none'}")
    lines.append(f"  metrics: {metrics}")
    if result.get("backup_file"):
        lines.append(f"  backup: {result['backup_file']}")
    return "\n".join(lines)


def _metrics(counts: dict[str, int], kind: str) -> str:
    """Measurements, not changes: entries scored, orphans (a full run counts them) and
    held_skipped when there are any."""
    shown = [f"scored {counts.get('scored', 0)}"]
    if kind == RunKind.FULL:
        shown.append(f"orphans {counts.get('orphans', 0)}")
    if counts.get("held_skipped"):
        shown.append(
            f"held_skipped {counts['held_skipped']} (operator holds kept automation away; "
            "'manage.py release ENTRY_ID' ends one)"
        )
    return ", ".join(shown)
