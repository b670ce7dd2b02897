"""Django work in a separate process, for the run-safety tests (tests/test_run_safety.py).

The test process imports the small functions at the top to build environments and start
processes; the subprocess runs this file as a script against the database named by
``DATABASE_URL`` (a real file or server database, never pytest's in-memory one)::

    python tests/helpers_subprocess.py seed --workspace W --entries N --now ISO [--seed S]
    python tests/helpers_subprocess.py run --workspace W --now ISO --batch-size 5 [--force] [--dry-run]

``seed`` creates a workspace whose content is a pure function of (entries, now, seed), so two
workspaces seeded alike are identical copies. ``run`` calls run_maintenance with a small batch
size (the management commands take none), so one run commits many batches and a kill lands
between two of them; it prints the result object as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# The policy of every seeded workspace: over many batches the run stale-marks nothing, archives
# the old unimportant entries, tombstones those past 90 days (prune) and, with no grace, purges
# them in the same run; protected and recent entries stay.
SEEDED_POLICY = {
    "archive_older_than_days": 30,
    "prune_older_than_days": 90,
    "importance_threshold": 0.15,
    "tombstone_grace_days": 0,
    "stale_after_days": 365,
    "cold_threshold": 0.2,
    "exclude_tags": ["keep"],
    "max_tombstone_fraction": 1.0,
    "backups_keep": 100,
}


def subprocess_env(database_url: str, backup_dir: Path) -> dict[str, str]:
    """This process's environment pointed at ``database_url`` and ``backup_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        DATABASE_URL=database_url,
        BACKUP_DIR=str(backup_dir),
        DJANGO_SETTINGS_MODULE="config.settings",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


def manage(args: Sequence[str], env: Mapping[str, str], *, timeout: float = 120) -> str:
    """Run ``manage.py args`` to completion; its stdout, or an AssertionError with stderr."""
    done = subprocess.run(
        [PYTHON, str(ROOT / "manage.py"), *args],
        env=dict(env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def start_manage(args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PYTHON, str(ROOT / "manage.py"), *args],
        env=dict(env),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_helper(args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PYTHON, str(Path(__file__).resolve()), *args],
        env=dict(env),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def helper(args: Sequence[str], env: Mapping[str, str], *, timeout: float = 120) -> str:
    proc = start_helper(args, env)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"helpers_subprocess {' '.join(args)} exited {proc.returncode}:\n{err}"
    return out


# --- inside the subprocess ------------------------------------------------------------------------


def journal_lines(entries: int, now: datetime, seed: int) -> list[str]:
    """``entries`` journal records, the same for the same arguments: a mix of recent, old and
    very old notes, some of them protected (pinned, operator-written, an excluded tag)."""
    rng = random.Random(seed)
    lines = []
    for i in range(entries):
        age = rng.choice([1, 5, 40, 60, 120, 200, 400])
        record: dict[str, Any] = {
            "id": f"gen-{i:05d}",
            "content": f"note {i}: {rng.choice(['cache', 'retry', 'deploy', 'index'])} "
            f"{rng.choice(['worked', 'failed', 'was slow', 'needs a follow-up'])} after {age} days",
            "created_at": (now - timedelta(days=age, minutes=i)).isoformat(),
            "entry_type": rng.choice(["development_note", "observation", "technical_note"]),
            "tags": ["keep"] if rng.random() < 0.05 else [],
        }
        # Every record names the same fields: journal._insert_rows takes its defaults from
        # the first row of a batch (KeyError on a batch that mixes present and absent fields).
        roll = rng.random()
        record["pinned"] = roll < 0.05
        record["source"] = "operator" if 0.05 <= roll < 0.08 else "import"
        lines.append(json.dumps(record))
    return lines


def _setup_django() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def _seed(slug: str, entries: int, now: datetime, seed: int) -> dict[str, Any]:
    from maintenance.models import MaintenancePolicy
    from memory import journal, services

    workspace = services.workspace_create(slug=slug)
    policy = MaintenancePolicy.objects.get(workspace=workspace)
    for name, value in SEEDED_POLICY.items():
        setattr(policy, name, value)
    policy.save()
    counts = journal.import_lines(workspace=workspace, lines=journal_lines(entries, now, seed), now=now)
    return {"workspace": slug, "created": counts.created, "invalid": counts.invalid}


def _run(
    slug: str, now: datetime, batch_size: int, force: bool, kind: str, dry_run: bool, statement_delay: float
) -> dict[str, Any]:
    from django.db import connection

    from maintenance.runs import run_maintenance
    from memory.models import Workspace

    def slowly(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        # Stretches the run so a test can kill it between two batches whatever the machine's
        # speed (a fast run would otherwise finish before the kill lands).
        result = execute(sql, params, many, context)
        time.sleep(statement_delay)
        return result

    workspace = Workspace.objects.get(slug=slug)
    with connection.execute_wrapper(slowly) if statement_delay else contextlib.nullcontext():
        return run_maintenance(
            workspace=workspace,
            kind=kind,
            trigger="cli",
            force=force,
            dry_run=dry_run,
            now=now,
            batch_size=batch_size,
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="helpers_subprocess")
    sub = parser.add_subparsers(dest="command", required=True)
    seed = sub.add_parser("seed")
    seed.add_argument("--workspace", required=True)
    seed.add_argument("--entries", type=int, required=True)
    seed.add_argument("--now", type=datetime.fromisoformat, required=True)
    seed.add_argument("--seed", type=int, default=0)
    run = sub.add_parser("run")
    run.add_argument("--workspace", required=True)
    run.add_argument("--now", type=datetime.fromisoformat, required=True)
    run.add_argument("--batch-size", type=int, default=500)
    run.add_argument("--kind", default="full")
    run.add_argument("--force", action="store_true")
    run.add_argument("--dry-run", action="store_true")
    run.add_argument("--statement-delay", type=float, default=0.0, help="seconds after each SQL statement")
    args = parser.parse_args(argv)

    _setup_django()
    if args.command == "seed":
        result = _seed(args.workspace, args.entries, args.now, args.seed)
    else:
        options = (args.batch_size, args.force, args.kind, args.dry_run, args.statement_delay)
        result = _run(args.workspace, args.now, *options)
    print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
