"""Fail when one rule is written down twice: a constant of the same name and the same value
defined at the top of two project modules (``OFFSET_MAX = 1_000_000_000`` in three API
modules was one rule in three places). Batch sizes are each module's own tuning and may
agree by chance (``PER_MODULE``). Run by ``make lint``; prints each duplicate and exits 1."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGES = ("config", "memory", "maintenance", "api", "console", "cli")
PER_MODULE = {"BATCH_SIZE", "CHUNK", "RECLAIM_BATCH", "RECLAIM_BATCHES"}


def constants(path: Path) -> dict[str, str]:
    """The module's top-level UPPER_CASE names and their values (as written, if not literal)."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not isinstance(target, ast.Name):
            continue
        name = target.id.lstrip("_")
        if not name.isupper() or name in PER_MODULE:
            continue
        try:
            found[name] = repr(ast.literal_eval(value))
        except ValueError:
            found[name] = ast.unparse(value)
    return found


def main() -> int:
    where: dict[tuple[str, str], list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted(Path(package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for name, value in constants(path).items():
                where[(name, value)].append(str(path))
    twice = {key: paths for key, paths in where.items() if len(paths) > 1}
    for (name, value), paths in sorted(twice.items()):
        print(f"{name} = {value[:60]} is defined in {', '.join(paths)}: give it one home")
    return 1 if twice else 0


if __name__ == "__main__":
    sys.exit(main())
