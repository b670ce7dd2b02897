"""Shared plumbing of the maintenance commands: a progress bar over the passes on a terminal
and the human summary of a result object."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

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


def summary(result: dict[str, Any]) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in result["counts"].items() if v)
    lines = [
        f"run {result['run_id']} ({result['kind']}{', dry run' if result['dry_run'] else ''}) "
        f"on {result['workspace']}: {result['status']}",
        f"  {counts or 'nothing to do'}",
    ]
    if result.get("backup_file"):
        lines.append(f"  backup: {result['backup_file']}")
    return "\n".join(lines)
