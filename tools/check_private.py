"""Fail when a project module reaches into another module's private names.

A name starting with one underscore is its module's own: another module of the project (under
``config``, ``memory``, ``maintenance``) neither imports it (``from memory.writes import
_x``) nor reads it through the module (``writes._x``). Tests and benchmarks may. Run by
``make lint``; prints each use as ``path:line: module._name`` and exits 1 if there is one."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("config", "memory", "maintenance", "api", "console", "cli")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_module(dotted: str) -> bool:
    base = Path(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    own = _module_name(path)
    found: list[str] = []
    aliases: dict[str, str] = {}  # a local name bound to a project module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in PACKAGES or node.module == own:
                continue
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if _private(alias.name):
                    found.append(f"{path}:{node.lineno}: {target}")
                if _is_module(target):
                    aliases[alias.asname or alias.name] = target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES and alias.name != own:
                    aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.append(f"{path}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return found


def main() -> int:
    found = [
        use for package in PACKAGES for path in sorted(Path(package).rglob("*.py")) for use in uses(path)
    ]
    for use in found:
        print(use)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
