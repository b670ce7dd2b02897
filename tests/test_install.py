"""`make run` installs what running needs and nothing more; `make test` adds the dev extra.
The product's own modules import only what the runtime install brings."""

import ast
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCAL = {
    "config",
    "memory",
    "maintenance",
    "api",
    "console",
    "cli",
}  # the product's packages, and manage.py beside them


def make_dry_run(target: str, tmp_path: Path) -> str:
    """The commands ``make target`` would run for a clone without a virtualenv yet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    done = subprocess.run(
        ["make", "-n", f"VENV={tmp_path / 'venv'}", target],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def pip_installs(commands: str) -> list[str]:
    return [line for line in commands.splitlines() if "pip install" in line]


def test_make_run_installs_the_runtime_dependencies_only(tmp_path):
    installs = pip_installs(make_dry_run("run", tmp_path))
    assert installs and all("[dev]" not in line for line in installs), installs
    assert installs[-1].endswith("-e ."), installs


def test_make_test_and_make_lint_install_the_dev_extra(tmp_path):
    for target in ("test", "lint"):
        assert any(line.endswith("-e '.[dev]'") for line in pip_installs(make_dry_run(target, tmp_path)))


def runtime_closure() -> set[str]:
    """Every distribution the project's runtime install brings: its dependencies without the
    dev extra, and theirs, with the extras they ask for (``uvicorn[standard]``)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [("memory-steward", frozenset())]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if (key, extras) in seen:
            continue
        seen.add((key, extras))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras or {""}):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return {key for key, _ in seen}


def imported_top_level_names() -> dict[str, Path]:
    found: dict[str, Path] = {}
    files = [ROOT / "manage.py", *(p for package in LOCAL for p in (ROOT / package).rglob("*.py"))]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path)
    return found


def test_the_product_imports_nothing_that_only_the_dev_extra_installs():
    closure = runtime_closure()
    assert {"django", "uvicorn", "psycopg-pool", "websockets"} <= closure  # the walk follows extras
    assert not {"pytest", "mypy", "playwright", "schemathesis"} & closure
    providers = metadata.packages_distributions()
    outside = {}
    for name, path in imported_top_level_names().items():
        if name in LOCAL or name in sys.stdlib_module_names or name == "__future__":
            continue
        dists = {canonicalize_name(d) for d in providers.get(name, [])}
        if not dists & closure:
            outside[name] = (sorted(dists), str(path.relative_to(ROOT)))
    assert outside == {}
