"""Time a whole maintenance run on a large workspace, beside the work it must do.

    .venv/bin/python bench/maintenance.py [--databases sqlite,postgres] [--sizes 10000,100000]
        [--postgres-url postgres://postgres@127.0.0.1:5432/bench_maintenance]
        [--sqlite-path var/bench-maintenance.sqlite3] [--label after] [--out bench/reports/maintenance.md]

Data: ``bench/datagen.py`` makes sure the *seed* database of N holds workspace ``bench-<N>``
with N generated entries (the first run generates them; later runs reuse them). Each N has a
seed database of its own (``<name>_<N>`` for ``--postgres-url``'s ``<name>``,
``<stem>-<N>.sqlite3`` for ``--sqlite-path``), so a smaller workspace never shares the tables,
and the timings, of a larger one (generated beside a million entries, 100,000 more once took
over ten minutes to score). Every measured N then starts from a fresh copy of its seed —
PostgreSQL: ``CREATE DATABASE <seed>_work TEMPLATE <seed>``; SQLite: an online copy of the
file — so a run, its revert and its restore never change the seed, and every rerun maintains
the same rows. The seed's hygiene verdicts are made
once (``maintenance.tasks.assess_hygiene_verdicts``, what the worker's schedule does for new
entries), since the generated rows reach the database past every door of the product.

Per N, each step runs in its own child process (a fresh interpreter with Django set up, as
``manage.py`` would be), which reports its wall time, the SQL statements it issued (an
``executemany`` counts once), its peak RSS (``getrusage``) and the load average before and
after (the machine is shared: the report shows the load beside every number):

1. **compute floor** — one SQL statement that reads every latest entry's score inputs (link
   counts, causal counts, worst anchor, readers: the expressions of
   ``memory/scoring_db.py``) and writes both scores into a narrow four-column table; run
   twice, the faster counts. On PostgreSQL twice more with the inputs aggregated once and
   joined (as a run computes them there): the lower of the two is the floor the targets
   compare;
2. **dry run** — ``manage.py maintain <ws> --dry-run --json``;
3. **real run** — ``manage.py maintain <ws> --json``, with ``--force`` when the dry run says
   the circuit breaker trips on the generated data (the report says so); its pre-prune backup
   is timed apart (``backups.write_backup`` wrapped) and the real run's time *excluding* it is
   what the targets compare;
4. **whole-run revert** of that run (``maintenance.revert.revert_run``);
5. **restore** of the run's pre-prune backup (``restore_backup(force=True)``: the run and the
   revert changed rows after the backup was taken), then a checksum of the workspace's
   entries and the table counts, which must equal those before the run;
6. **the worker's hygiene schedule** (``maintenance.tasks.assess_hygiene_verdicts``: the
   verdicts of entries changed meanwhile, then the kept hygiene rank folded or rebuilt), timed
   as its own step, as the worker does it after a run; then the **hygiene preview** first
   page (``hygiene.preview(limit=50)``) and the **review page's tab counts**
   (``console_selectors.review_counts``), each called twice (first, again).

Each pass of the dry and real runs is timed (the passes are wrapped where ``runs.steps``
hands them out), with the rows it reported and its statements; the plan's passes and the
apply's are shown apart. On PostgreSQL the dead rows of ``memory_entry`` after the run are
read from ``pg_stat_user_tables``.

When one invocation measures both 100,000 and 1,000,000 entries on a database, the
1,000,000-entry section also gives the cost ratio between them (the real run without its
backup, and the dry run), against the target of ≤ 11×.

The report keeps one section per (label, database, N): a run replaces only the sections it
measured, so a ``--label before`` baseline stays beside ``--label after``. Text outside the
sections (notes) is kept as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# This file's name is the project's ``maintenance`` package's: the project comes first on the
# path, bench/ (machine.py, datagen.py) last.
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != BENCH), str(BENCH)]

from machine import cpu_model, python_loop_seconds, ram_gib  # noqa: E402 - bench/machine.py

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_maintenance"
DEFAULT_SQLITE = "var/bench-maintenance.sqlite3"
DEFAULT_OUT = ROOT / "bench" / "reports" / "maintenance.md"
DEFAULT_SIZES = {"postgres": "10000,100000,1000000", "sqlite": "10000,100000"}
RESULT = "BENCH-RESULT "
MB = 1024  # ru_maxrss is in KiB on Linux

# Issue 16, item 2: PostgreSQL at 1,000,000 entries (and SQLite at 100,000: the full run).
TARGETS = {
    "real_s": 60.0,
    "real_floor_x": 3.0,
    "dry_s": 30.0,
    "rss_mb": 300.0,
    "backup_s": 60.0,
    "restore_s": 120.0,
    "revert_s": 60.0,
    "hygiene_s": 1.0,
    "review_s": 0.2,
    "ratio": 11.0,
    "sqlite_real_s": 20.0,
}


def log(msg: str) -> None:
    print(f"[maintenance {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the child: one step in a fresh process --------------------------------------------------


class Counter:
    """The statements a child issues, on its own connection and on those its threads open (a
    run's batch workers: ``maintenance.batch_workers``)."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        with self.lock:
            self.n += 1
        return execute(sql, params, many, context)

    def watch_threads(self) -> None:
        """Count on every connection a thread other than the caller's opens, from now on."""
        from django.db.backends.signals import connection_created

        main = threading.get_ident()

        def count(sender: Any, connection: Any, **kwargs: Any) -> None:
            if threading.get_ident() != main and self not in connection.execute_wrappers:
                connection.execute_wrappers.append(self)

        connection_created.connect(count, weak=False)


def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / MB


def child(op: str, slug: str, arg: str) -> dict[str, Any]:
    import django

    django.setup()
    from django.db import connection

    from memory.models import Workspace

    ws = Workspace.objects.get(slug=slug)
    counter = Counter()
    counter.watch_threads()
    out: dict[str, Any] = {"rss_start_mb": _rss_mb(), "load_before": os.getloadavg()}
    t0 = time.perf_counter()
    with connection.execute_wrapper(counter):
        out.update(CHILD_OPS[op](ws, arg, counter))
    out["seconds"] = out.get("seconds", time.perf_counter() - t0)
    out["statements"] = out.get("statements", counter.n)
    out["load_after"] = os.getloadavg()
    out["rss_mb"] = _rss_mb()
    return out


def op_floor(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    from django.db import connection
    from django.utils import timezone

    from memory.models import Entry
    from memory.policy_model import MaintenancePolicy
    from memory.scoring_db import _scores_sql, importance_expr, retention_expr

    now = timezone.now()
    params = MaintenancePolicy.for_workspace(ws).decay_params
    qs = (
        Entry.objects.filter(workspace=ws, is_latest=True)
        .annotate(i=importance_expr(now.timestamp(), now), r=retention_expr(now.timestamp(), params))
        .values_list("pk", "i", "r", "workspace_id")
        .order_by()
    )
    statements = {"lookups": qs.query.sql_with_params()}
    if connection.vendor == "postgresql":
        # The same scores with their inputs aggregated once and joined (what a run computes on
        # PostgreSQL since it does): the lower of the two floors is the one the targets compare.
        sql, sql_params = _scores_sql(ws, now=now, params=params, live_since=now, joined=True)
        statements["joined"] = (sql, sql_params)
    out: dict[str, Any] = {"statements": 1}
    with connection.cursor() as c:
        c.execute("DROP TABLE IF EXISTS bench_floor_scores")
        c.execute(
            "CREATE TABLE bench_floor_scores (entry_id bigint PRIMARY KEY, importance double precision, "
            "retention double precision, scored_at double precision)"
        )
        for name, (sql, sql_params) in statements.items():
            times = []
            for _ in range(2):
                c.execute("DELETE FROM bench_floor_scores")
                start = counter.n
                t = time.perf_counter()
                # Autocommit: the statement is its own transaction. The fourth column stands for
                # scored_at (a constant per row; the joined statement's stored importance).
                c.execute(
                    f"INSERT INTO bench_floor_scores (entry_id, importance, retention, scored_at) {sql}",
                    sql_params,
                )
                out["rows"] = c.rowcount
                times.append(time.perf_counter() - t)
                assert counter.n - start == 1, "the floor is one statement"
            out[name] = {"seconds": min(times), "times": times}
        c.execute("DROP TABLE bench_floor_scores")
    out["seconds"] = min(v["seconds"] for k, v in out.items() if k in statements)
    out["times"] = out["lookups"]["times"]
    return out


def _instrument(passes_log: list[dict[str, Any]], counter: Counter, backup_log: list[dict[str, Any]]) -> None:
    """Time every pass where ``runs.steps`` hands it out, and the pre-prune backup."""
    from maintenance import backups, runs
    from memory import scoring_db

    phase = {"now": "apply"}
    original_steps, original_plan, original_backup = runs.steps, runs._plan, backups.write_backup

    def timed(key: str, step: Any) -> Any:
        def run(ctx: Any) -> Any:
            t, s = time.perf_counter(), counter.n
            result = step(ctx)
            passes_log.append(
                {
                    "phase": phase["now"],
                    "pass": key,
                    "seconds": time.perf_counter() - t,
                    "rows": result.count,
                    "statements": counter.n - s,
                }
            )
            return result

        return run

    def steps(kind: str) -> Any:
        return [(key, timed(key, step)) for key, step in original_steps(kind)]

    def plan(*a: Any, **kw: Any) -> Any:
        phase["now"] = "plan"
        try:
            return original_plan(*a, **kw)
        finally:
            phase["now"] = "apply"

    def write_backup(*a: Any, **kw: Any) -> Any:
        t, s = time.perf_counter(), counter.n
        backup = original_backup(*a, **kw)
        backup_log.append(
            {
                "seconds": time.perf_counter() - t,
                "statements": counter.n - s,
                "file": backup.file_name,
                "entries": backup.entry_count,
                "bytes": backup.size_bytes,
                "reason": backup.reason,
            }
        )
        return backup

    original_once = scoring_db.scores_once

    @contextmanager
    def scores_once(*a: Any, **kw: Any) -> Iterator[None]:
        # A real run on PostgreSQL computes its scores once, before the plan: shown in the
        # plan's column (the plan's own score pass then only counts them).
        t, s = time.perf_counter(), counter.n
        with original_once(*a, **kw):
            held = (scoring_db._once.get() or {}).get("scores")
            passes_log.append(
                {
                    "phase": "plan",
                    "pass": "scores computed once (before the plan)",
                    "seconds": time.perf_counter() - t,
                    "rows": held.scored if held else 0,
                    "statements": counter.n - s,
                }
            )
            yield

    runs.steps, runs._plan, backups.write_backup = steps, plan, write_backup
    scoring_db.scores_once = scores_once


def _maintain(ws: Any, flags: list[str], counter: Counter) -> dict[str, Any]:
    from io import StringIO

    from django.core.management import call_command

    passes_log: list[dict[str, Any]] = []
    backup_log: list[dict[str, Any]] = []
    _instrument(passes_log, counter, backup_log)
    buf = StringIO()
    t = time.perf_counter()
    error = ""
    try:
        call_command("maintain", "--workspace", ws.slug, "--json", *flags, stdout=buf)
    except Exception as exc:  # a failed run still reports its row
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - t
    text = buf.getvalue()
    result = json.loads(text[text.index("{") :]) if "{" in text else {}
    return {
        "seconds": seconds,
        "passes": passes_log,
        "backup": backup_log[0] if backup_log else None,
        "status": result.get("status"),
        "run_id": result.get("run_id"),
        "counts": result.get("counts", {}),
        "breaker": result.get("breaker"),
        "affected": {k: len(v) for k, v in (result.get("affected") or {}).items() if isinstance(v, list)},
        "error": error,
    }


def op_dry(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    return _maintain(ws, ["--dry-run"], counter)


def op_real(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    return _maintain(ws, ["--force"] if arg == "force" else [], counter)


def op_revert(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    from maintenance.revert import revert_run

    t = time.perf_counter()
    result = revert_run(ws, int(arg), actor="bench")
    seconds = time.perf_counter() - t
    summary = {k: len(v) if isinstance(v, list) else v for k, v in result.items()}
    return {"seconds": seconds, "result": summary}


def op_backup(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    from maintenance.backups import write_backup

    t = time.perf_counter()
    backup = write_backup(ws, reason="manual")
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "file": backup.file_name, "entries": backup.entry_count}


def op_restore(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    from django.conf import settings

    from maintenance.restore import restore_backup

    path = Path(settings.BACKUP_DIR) / ws.slug / arg
    t = time.perf_counter()
    result = restore_backup(path, workspace_slug=ws.slug, force=True)
    seconds = time.perf_counter() - t
    return {
        "seconds": seconds,
        "restored": sum(result["restored"].values()),
        "overwritten": sum(result["overwritten"].values()),
        "kept_newer": result["kept_newer"],
    }


CHECKSUM_COLUMNS = (
    "id",
    "lineage_id",
    "is_latest",
    "status",
    "status_changed_at",
    "archived_at",
    "content_hash",
    "updated_at",
    "importance",
)


def _verdicts_note(r: dict[str, Any]) -> str:
    if "stopped" in r or "error" in r:
        return f"failed: {r.get('stopped') or r.get('error')}"
    made = sum((r.get("assessed") or {}).values())
    return f"{made:,} assessed now in {r.get('seconds', 0):.1f} s" if made else "the seed had them all"


def _worker_note(r: dict[str, Any]) -> str:
    """What the worker's hygiene schedule did before the reads: verdicts made, rank folded."""
    made = sum((r.get("assessed") or {}).values())
    ranked = [v for v in (r.get("ranked") or {}).values()]
    folded = sum(v.get("folded", 0) for v in ranked)
    rebuilt = sum(v.get("rebuilt", 0) for v in ranked)
    parts = [f"{made:,} verdicts made"]
    parts.append(f"rank rebuilt ({rebuilt:,} rows)" if rebuilt else f"{folded:,} rank marks folded")
    return ", ".join(parts)


def op_verdicts(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    """What the worker's ``maintenance.hygiene_verdicts`` schedule does once it has caught up
    with the generated rows (written by COPY, past every door of the product): every missing
    hygiene verdict made and stored. Run on the seed, so only its first run pays."""
    from maintenance.tasks import assess_hygiene_verdicts

    return assess_hygiene_verdicts(budget_seconds=float("inf"))


def op_checksum(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    """A checksum of the workspace's entries (the columns a run or a restore changes) and
    row counts of its tables; on PostgreSQL also memory_entry's dead rows. ``arg``, an entry
    id: the checksum and entry count cover the entries up to it (those that existed before the
    run: a restore keeps the ones created after its backup, such as the run's retrospectives),
    and ``newer`` counts the others."""
    import hashlib

    from django.db import connection

    from memory.models import CodeAnchor, Entry, EntryAccess, LifecycleEvent, Relationship, Tombstone

    digest = hashlib.sha256()
    n = 0
    cols = ", ".join(f'"{c}"' for c in CHECKSUM_COLUMNS)
    with connection.cursor() as c:
        upto = int(arg) if arg else None
        where, params = (
            ("workspace_id = %s", [ws.pk])
            if upto is None
            else ("workspace_id = %s AND id <= %s", [ws.pk, upto])
        )
        c.execute(f"SELECT {cols} FROM memory_entry WHERE {where} ORDER BY id", params)
        while True:
            rows = c.fetchmany(10_000)
            if not rows:
                break
            for row in rows:
                digest.update(
                    repr(tuple(round(v, 9) if isinstance(v, float) else str(v) for v in row)).encode()
                )
            n += len(rows)
        dead = None
        if connection.vendor == "postgresql":
            c.execute("SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'memory_entry'")
            live_tup, dead = c.fetchone()
            c.execute("SELECT pg_total_relation_size('memory_entry')")
            size = c.fetchone()[0]
    counts = {
        "entries": n,
        "links": Relationship.objects.filter(workspace=ws, pruned_at__isnull=True).count(),
        "anchors": CodeAnchor.objects.filter(workspace=ws).count(),
        "accesses": EntryAccess.objects.filter(workspace=ws).count(),
        "tags": Entry.tags.through.objects.filter(entry__workspace=ws).count(),
        "open tombstones": Tombstone.objects.filter(
            workspace=ws, restored_at__isnull=True, purged_at__isnull=True
        ).count(),
        "events": LifecycleEvent.objects.filter(workspace=ws).count(),
    }
    counts["entries"] = n
    entries = Entry.objects.filter(workspace=ws)
    out: dict[str, Any] = {
        "sha256": digest.hexdigest(),
        "counts": counts,
        "max_id": entries.order_by("-pk").values_list("pk", flat=True).first() or 0,
        "newer": entries.filter(pk__gt=upto).count() if upto is not None else 0,
    }
    if dead is not None:
        out.update({"dead_rows": dead, "live_rows": live_tup, "table_bytes": size})
    return out


def op_reads(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    from console import selectors_maintenance as console_selectors
    from maintenance import hygiene

    out: dict[str, Any] = {}
    for name, call in (
        ("hygiene", lambda: hygiene.preview(ws, limit=50)),
        ("review", lambda: console_selectors.review_counts(ws)),
    ):
        times, statements = [], []
        for _ in range(2):
            t, s = time.perf_counter(), counter.n
            value = call()
            times.append(time.perf_counter() - t)
            statements.append(counter.n - s)
        out[name] = {"times": times, "statements": statements}
        if name == "hygiene":
            out[name]["count"] = value["count"]
            out[name]["page"] = len(value["candidates"])
        else:
            out[name]["counts"] = value
    return out


def op_mode(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    from memory.policy_model import MaintenancePolicy

    MaintenancePolicy.objects.get_or_create(workspace=ws)
    MaintenancePolicy.objects.filter(workspace=ws).update(review_mode=arg)
    return {"review_mode": MaintenancePolicy.for_workspace(ws).review_mode}


def op_api_load(ws: Any, arg: str, counter: Counter) -> dict[str, Any]:
    """Calls the agent API (POST /entries, PATCH /entries/{id}, POST /entries/{id}/access) one
    after another, ~20 a second, until the file ``arg`` exists; each call's wall time and
    status. A call that raises or answers 5xx is an error; a 4xx (an entry the run tombstoned
    meanwhile) is counted apart."""
    import random

    from django.test import Client

    from memory import accounts
    from memory.models import Entry

    stop = Path(arg)
    _, raw = accounts.api_key_create(workspace=ws, name="bench api load", role="agent")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    pool = list(
        Entry.objects.filter(workspace=ws, is_latest=True, status="active").values_list("pk", flat=True)[
            :5000
        ]
    )
    rng = random.Random(7)
    calls: dict[str, list[float]] = {"post": [], "patch": [], "access": []}
    errors: dict[str, int] = {}
    refused: dict[str, int] = {}
    Path(f"{arg}.ready").touch()
    i = 0
    while not stop.exists():
        op = ("post", "patch", "access")[i % 3]
        i += 1
        t = time.perf_counter()
        try:
            if op == "post":
                body = {"content": f"bench load note {i} about cache retries", "entry_type": "observation"}
                r = client.post(
                    "/api/v1/entries", json.dumps(body), content_type="application/json", secure=True
                )
            elif op == "patch":
                body = {"title": f"touched {i}"}
                r = client.patch(
                    f"/api/v1/entries/{rng.choice(pool)}",
                    json.dumps(body),
                    content_type="application/json",
                    secure=True,
                )
            else:
                r = client.post(
                    f"/api/v1/entries/{rng.choice(pool)}/access",
                    json.dumps({"actor": "agent:bench", "dispatch": False}),
                    content_type="application/json",
                    secure=True,
                )
            status = str(r.status_code)
        except Exception as exc:  # every failure is counted, none stops the load
            status = type(exc).__name__
        calls[op].append(time.perf_counter() - t)
        if not status.isdigit() or status.startswith("5"):
            errors[f"{op} {status}"] = errors.get(f"{op} {status}", 0) + 1
        elif status.startswith("4"):
            refused[f"{op} {status}"] = refused.get(f"{op} {status}", 0) + 1
        time.sleep(0.05)
    return {"calls": calls, "errors": errors, "refused": refused}


CHILD_OPS = {
    "mode": op_mode,
    "floor": op_floor,
    "dry": op_dry,
    "real": op_real,
    "revert": op_revert,
    "backup": op_backup,
    "restore": op_restore,
    "checksum": op_checksum,
    "verdicts": op_verdicts,
    "reads": op_reads,
    "api_load": op_api_load,
}


# --- the parent: databases, copies, children, report -----------------------------------------


class Target:
    """One database of the benchmark: a seed that holds the generated workspaces and a work
    copy that each N's steps change."""

    def __init__(self, vendor: str, args: argparse.Namespace) -> None:
        self.vendor = vendor
        if vendor == "postgres":
            base, _, name = args.postgres_url.rpartition("/")
            self.base, self.name = base, name
            self.work_name = args.work_name or f"{name}_work"
            self.work_url = f"{base}/{self.work_name}"
            self.admin_url = f"{base}/postgres"
        else:
            path = Path(args.sqlite_path)
            self.path = path if path.is_absolute() else ROOT / path
            self.work_path = self.path.with_name(self.path.stem + "-work.sqlite3")
            self.work_url = f"sqlite:///{self.work_path}"
        self.backup_dir = ROOT / "var" / f"bench-maintenance-backups-{vendor}"

    def size(self, n: int) -> None:
        """The seed of N entries: a database (file) of its own per N."""
        if self.vendor == "postgres":
            self.seed_name = f"{self.name}_{n}"
            self.seed_url = f"{self.base}/{self.seed_name}"
        else:
            self.seed_path = self.path.with_name(f"{self.path.stem}-{n}{self.path.suffix}")
            self.seed_url = f"sqlite:///{self.seed_path}"

    def ensure_database(self) -> None:
        if self.vendor != "postgres":
            self.seed_path.parent.mkdir(parents=True, exist_ok=True)
            return
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [self.seed_name]).fetchone()
            if not found:
                conn.execute(f'CREATE DATABASE "{self.seed_name}"')

    def copy_seed(self) -> float:
        t = time.perf_counter()
        if self.vendor == "postgres":
            import psycopg

            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.work_name}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{self.work_name}" TEMPLATE "{self.seed_name}"')
        else:
            for suffix in ("", "-wal", "-shm"):
                Path(str(self.work_path) + suffix).unlink(missing_ok=True)
            src, dst = sqlite3.connect(self.seed_path), sqlite3.connect(self.work_path)
            with dst:
                src.backup(dst)
            src.close()
            dst.close()
        shutil.rmtree(self.backup_dir, ignore_errors=True)
        self.backup_dir.mkdir(parents=True)
        return time.perf_counter() - t

    def drop_work(self) -> None:
        if self.vendor == "postgres":
            import psycopg

            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.work_name}" WITH (FORCE)')
        else:
            for suffix in ("", "-wal", "-shm"):
                Path(str(self.work_path) + suffix).unlink(missing_ok=True)


def child_env(url: str, backup_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DJANGO_DEBUG": "0",
            "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-maintenance-" + "x" * 40),
            "LOG_LEVEL": "WARNING",
            "BACKUP_DIR": str(backup_dir),
        }
    )
    env.pop("REDIS_URL", None)
    return env


def _rss_of(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / MB
    except OSError:
        pass
    return 0.0


def run_child(
    target: Target,
    op: str,
    slug: str,
    arg: str = "",
    timeout: float = 3600,
    max_rss_mb: float = 4000,
    url: str | None = None,
) -> dict[str, Any]:
    """One step in a child process. A step that outlasts ``timeout`` or grows past
    ``max_rss_mb`` (the machine is shared: a step must not take its memory) is stopped and
    reported as such; a step that fails is reported with the end of its error."""
    import tempfile

    cmd = [sys.executable, str(Path(__file__)), "--child", op, slug, arg]
    t = time.perf_counter()
    load = os.getloadavg()
    stopped = ""
    # Files, not pipes: a child that writes much while the parent only polls never blocks.
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        env = child_env(url or target.work_url, target.backup_dir)
        with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out_file, stderr=err_file) as proc:
            peak = 0.0
            while proc.poll() is None:
                peak = max(peak, _rss_of(proc.pid))
                elapsed = time.perf_counter() - t
                if elapsed > timeout:
                    stopped = f"not finished in {timeout:.0f} s"
                elif peak > max_rss_mb:
                    stopped = (
                        f"stopped after {elapsed:.0f} s at {peak:.0f} MB RSS (limit {max_rss_mb:.0f} MB)"
                    )
                if stopped:
                    proc.kill()
                    break
                time.sleep(0.2)
        out_file.seek(0)
        err_file.seek(0)
        stdout, stderr = out_file.read(), err_file.read()
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT)]
    if not stopped and (proc.returncode != 0 or not lines):
        log(f"child {op} failed ({proc.returncode}):\n{stderr[-3000:]}")
        tail = stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        stopped = f"failed: {tail[0][:200]}"
    if stopped:
        return {
            "stopped": stopped,
            "seconds": float("nan"),
            "load_before": load,
            "load_after": os.getloadavg(),
        }
    out = json.loads(lines[-1][len(RESULT) :])
    out["process_seconds"] = time.perf_counter() - t
    return out


def under_api_load(target: Target, slug: str, during: Any) -> tuple[Any, dict[str, Any]]:
    """``during()`` while a child process calls the API (``op_api_load``); its result and the
    calls' statistics."""
    import tempfile

    stop = Path(tempfile.mkdtemp(prefix="bench-load-")) / "stop"
    cmd = [sys.executable, str(Path(__file__)), "--child", "api_load", slug, str(stop)]
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        env = child_env(target.work_url, target.backup_dir)
        # The load (~17 calls a second from one key) is above the API's default rate limit of
        # 600 a minute: a 429 would measure the limiter, not the run. The limit is off for it.
        env["API_RATE_LIMIT_PER_MINUTE"] = "0"
        with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out_file, stderr=err_file) as proc:
            for _ in range(600):
                if Path(f"{stop}.ready").exists() or proc.poll() is not None:
                    break
                time.sleep(0.1)
            time.sleep(2)  # calls before the run starts: the quiet baseline is part of the sample
            try:
                result = during()
            finally:
                time.sleep(2)
                stop.touch()
                proc.wait(timeout=600)
        out_file.seek(0)
        err_file.seek(0)
        lines = [line for line in out_file.read().splitlines() if line.startswith(RESULT)]
        if not lines:
            log(f"api load child failed:\n{err_file.read()[-3000:]}")
            return result, {"stopped": "the load child failed"}
    load = json.loads(lines[-1][len(RESULT) :])
    stats: dict[str, Any] = {"errors": load["errors"], "refused": load["refused"], "ops": {}}
    for op, times in load["calls"].items():
        if times:
            ordered = sorted(times)
            stats["ops"][op] = {
                "n": len(ordered),
                "p50": ordered[len(ordered) // 2],
                "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
                "max": ordered[-1],
            }
    return result, stats


def seed(target: Target, n: int, seed_value: int) -> None:
    env = child_env(target.seed_url, target.backup_dir)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        [sys.executable, "bench/datagen.py", "--entries", str(n), "--seed", str(seed_value)],
        cwd=ROOT,
        env=env,
        check=True,
    )


def measure(target: Target, n: int, args: argparse.Namespace) -> dict[str, Any]:
    slug = f"bench-{n}"
    target.size(n)
    target.ensure_database()
    seed(target, n, args.seed)
    verdicts = run_child(target, "verdicts", slug, timeout=args.timeout, url=target.seed_url)
    log(f"{target.vendor} N={n:,}: hygiene verdicts of the seed made in {verdicts.get('seconds', 0):.1f} s")
    copied = target.copy_seed()
    log(f"{target.vendor} N={n:,}: work copy made in {copied:.1f} s")
    out: dict[str, Any] = {"n": n, "copy_seconds": copied, "verdicts": verdicts}

    def step(name: str, op: str, arg: str = "") -> dict[str, Any]:
        r = run_child(target, op, slug, arg, timeout=args.timeout, max_rss_mb=args.max_rss_mb)
        out[name] = r
        if "stopped" in r:
            log(f"{target.vendor} N={n:,} {name}: {r['stopped']}")
        else:
            log(
                f"{target.vendor} N={n:,} {name}: {r['seconds']:.2f} s, "
                f"{r.get('statements', 0):,} statements, RSS {r.get('rss_mb', 0):.0f} MB, "
                f"load {r['load_before'][0]:.2f}"
            )
        return r

    mode = run_child(target, "mode", slug, args.review_mode)
    assert mode["review_mode"] == args.review_mode, mode
    out["review_mode"] = args.review_mode
    before = step("checksum_before", "checksum")
    if args.backup_restore_only:
        # A manual backup of the untouched workspace and its restore (which then overwrites
        # nothing): the restore's reading and matching cost and its memory, without the hour
        # that a run, its revert and a pre-prune backup take at 1,000,000 entries.
        backup = step("backup", "backup")
        if backup.get("file"):
            step("restore", "restore", backup["file"])
            restored = step("checksum_restored", "checksum")
            out["restore_same"] = restored.get("sha256") == before.get("sha256") and restored.get(
                "counts", {}
            ).get("entries") == before.get("counts", {}).get("entries")
        target.drop_work()
        return out
    if args.reads_only:
        # The read targets alone (hygiene first page, review counts) on the untouched seed: a
        # minute at 1,000,000 entries instead of the hour a run, its revert and restore take.
        step("worker", "verdicts")
        step("reads", "reads")
        target.drop_work()
        return out
    step("floor", "floor")
    dry = step("dry", "dry")
    force = dry.get("status") == "blocked" or bool((dry.get("breaker") or {}).get("would_trip"))
    out["forced"] = force
    real = step("real", "real", "force" if force else "")
    after = step("checksum_after", "checksum")
    # The steady state: the next run finds little to change, and its cost is what a decay
    # sweep every 10 minutes costs (the score refresh of every entry, above all).
    step("again", "real", "force" if force else "")
    if real.get("run_id"):
        step("revert", "revert", str(real["run_id"]))
    if real.get("backup"):
        step("restore", "restore", real["backup"]["file"])
        restored = step("checksum_restored", "checksum", str(before.get("max_id", "")))
        out["restore_newer"] = restored.get("newer", 0)
        out["restore_same"] = restored.get("sha256") == before.get("sha256") and restored.get(
            "counts", {}
        ).get("entries") == before.get("counts", {}).get("entries")
    out["dead_rows"] = after.get("dead_rows")
    # What the worker's hygiene schedule does after the run, revert and restore (verdicts of
    # changed entries, the kept rank folded: timed here), then the reads a visitor makes.
    step("worker", "verdicts")
    step("reads", "reads")
    if args.api_load:
        # Last, on the workspace as the restore left it (the load's writes must not reach the
        # checksums above): a dry run and a real run again, while a second process calls the API.
        _, out["api_dry"] = under_api_load(target, slug, lambda: step("dry_loaded", "dry"))
        _, out["api_real"] = under_api_load(
            target, slug, lambda: step("real_loaded", "real", "force" if force else "")
        )
        loaded = step("checksum_loaded", "checksum")
        out["dead_rows_loaded"] = loaded.get("dead_rows")
    target.drop_work()
    return out


# --- the report --------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    if value is None or value != value:  # NaN: not measured or not finished
        return "—"
    return f"{value:.3f}" if value < 1 else f"{value:.1f}" if value >= 100 else f"{value:.2f}"


def _load(r: dict[str, Any]) -> str:
    if "load_before" not in r:
        return "—"
    return f"{r['load_before'][0]:.2f} → {r['load_after'][0]:.2f}"


def _verdict(ok: bool, text: str) -> str:
    return f"{text}: **{'met' if ok else 'not met'}**"


def real_without_backup(m: dict[str, Any]) -> float:
    """The real run's wall time without its pre-prune backup (NaN when it did not finish)."""
    real = m.get("real", {})
    return real.get("seconds", float("nan")) - (real.get("backup") or {}).get("seconds", 0.0)


def cost_ratio(smaller: dict[str, Any] | None, m: dict[str, Any]) -> tuple[float, float] | None:
    """How many times the 100,000-entry runs (``smaller``, of the same invocation) the
    1,000,000-entry runs cost: the real run without its backup, and the dry run. None when
    either was not measured (or did not finish)."""
    if not smaller or smaller.get("n") != 100_000 or m.get("n") != 1_000_000:
        return None
    real = real_without_backup(m) / real_without_backup(smaller)
    dry = m.get("dry", {}).get("seconds", float("nan")) / smaller.get("dry", {}).get("seconds", float("nan"))
    return None if real != real or dry != dry else (real, dry)


def smaller_of(n: int, measured: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The 100,000-entry measurement of this invocation when ``n`` is 1,000,000 (the cost
    ratio's other end), else None."""
    return measured.get(100_000) if n == 1_000_000 else None


def render_section(
    label: str,
    vendor: str,
    facts: dict[str, Any],
    m: dict[str, Any],
    command: str,
    machine: str,
    smaller: dict[str, Any] | None = None,
) -> str:
    n = m["n"]
    title = "PostgreSQL" if vendor == "postgres" else "SQLite"
    key = f"{label}:{vendor}:{n}"
    lines = [
        f"<!-- maintenance:{key} -->",
        f"## {label}: {title}, {n:,} entries",
        "",
        f"Measured {facts['started']:%Y-%m-%d %H:%M} – {facts['finished']:%H:%M} UTC with `{command}`"
        f" ({facts['database']}).",
        "",
        f"- machine: {machine}",
        f"- review mode of the workspace: {m['review_mode']}",
        "- hygiene verdicts: made beforehand on the seed, as the worker's schedule "
        "(`maintenance.hygiene_verdicts`) makes them once it has caught up with new entries "
        f"({_verdicts_note(m.get('verdicts') or {})})",
        "- load average (1 min) before → after each step is in the last column (a shared machine: "
        "other people's tests ran meanwhile)",
    ]
    dry, real = m.get("dry", {}), m.get("real", {})
    floor = m.get("floor", {})
    backup = real.get("backup") or {}
    real_wo_backup = real_without_backup(m)
    if m.get("forced"):
        lines.append(
            "- the dry run reported that the circuit breaker trips on the generated data: the real run "
            "ran with `--force`"
        )
    lines += [
        "",
        "| step | wall s | statements | peak RSS MB | rows / result | load |",
        "|---|---|---|---|---|---|",
    ]

    def row(name: str, r: dict[str, Any], result: str, seconds: float | None = None) -> None:
        if "stopped" in r:
            lines.append(f"| {name} | {r['stopped']} | — | — | — | {_load(r)} |")
            return
        if not r:
            return
        lines.append(
            f"| {name} | {_s(seconds if seconds is not None else r.get('seconds'))} | "
            f"{r.get('statements', 0):,} | {r.get('rss_mb', 0):.0f} | {result} | {_load(r)} |"
        )

    if floor:
        looked_up = floor.get("lookups", {"seconds": floor.get("seconds"), "times": floor.get("times", [])})
        row(
            "compute floor (1 statement, best of 2)",
            floor,
            f"{floor.get('rows', 0):,} rows; runs {', '.join(_s(t) for t in looked_up['times'])} s",
            seconds=looked_up["seconds"],
        )
        if "joined" in floor:
            row(
                "… the same, inputs aggregated once (as a run computes them)",
                floor,
                f"runs {', '.join(_s(t) for t in floor['joined']['times'])} s; the lower floor, "
                f"{_s(floor['seconds'])} s, is the one compared",
                seconds=floor["joined"]["seconds"],
            )

    def counts_text(r: dict[str, Any]) -> str:
        c = {k: v for k, v in (r.get("counts") or {}).items() if v and k != "scored"}
        if r.get("error"):
            return f"**error**: {r['error'][:200]}"
        text = f"{r.get('status')}; scored {(r.get('counts') or {}).get('scored', 0):,}"
        if c:
            text += "; " + ", ".join(f"{k} {v:,}" for k, v in c.items())
        return text

    row("dry run (`maintain --dry-run`)", dry, counts_text(dry))
    row(f"real run (`maintain{' --force' if m.get('forced') else ''}`)", real, counts_text(real))
    again = m.get("again", {})
    if backup:
        lines.append(
            f"| … of which the pre-prune backup | {_s(backup['seconds'])} | {backup['statements']:,} | — | "
            f"{backup['entries']:,} entries, {backup['bytes'] / 1e6:.1f} MB | — |"
        )
        lines.append(
            f"| … real run without the backup | {_s(real_wo_backup)} | — | — | "
            f"{real_wo_backup / floor['seconds']:.1f}× the floor | — |"
            if floor.get("seconds")
            else f"| … real run without the backup | {_s(real_wo_backup)} | — | — | — | — |"
        )
    if again:
        row("the next real run at once (steady state)", again, counts_text(again))
    if "revert" in m:
        res = m["revert"].get("result", {})
        row(
            "whole-run revert",
            m["revert"],
            ", ".join(f"{k} {v:,}" for k, v in res.items() if isinstance(v, int) and k != "run_id"),
        )
    if "backup" in m:
        row(
            "manual backup of the untouched workspace",
            m["backup"],
            f"{m['backup'].get('entries', 0):,} entries",
        )
    if "restore" in m:
        r = m["restore"]
        same = "same entries checksum and count as before the run" if m.get("restore_same") else "**differs**"
        newer = m.get("restore_newer", 0)
        kept = f"; {newer:,} entries made after the backup (the run's retrospectives) kept" if newer else ""
        row(
            "restore of that backup (force)" if "backup" in m else "restore of the pre-prune backup (force)",
            r,
            f"{r.get('restored', 0):,} rows inserted, {r.get('overwritten', 0):,} overwritten; {same}{kept}",
        )
    if "worker" in m:
        row("the worker's hygiene schedule before the reads", m["worker"], _worker_note(m["worker"]))
    reads = m.get("reads", {})
    for name, label_text in (
        ("hygiene", "hygiene preview, first page of 50"),
        ("review", "review page counts"),
    ):
        if name in reads:
            x = reads[name]
            what = (
                f"{x['count']:,} candidates"
                if name == "hygiene"
                else ", ".join(f"{k} {v:,}" for k, v in x["counts"].items())
            )
            lines.append(
                f"| {label_text} (first / again) | {_s(x['times'][0])} / {_s(x['times'][1])} | "
                f"{x['statements'][0]:,} / {x['statements'][1]:,} | {reads.get('rss_mb', 0):.0f} | {what} | "
                f"{_load(reads)} |"
            )
    if m.get("dead_rows") is not None:
        after = m["checksum_after"]
        lines.append(
            f"| memory_entry after the run | — | — | — | {after['dead_rows']:,} dead rows, "
            f"table + indexes {after['table_bytes'] / 1e6:.0f} MB | — |"
        )
    lines.append("")
    loaded = [(name, m[key]) for name, key in (("dry run", "api_dry"), ("real run", "api_real")) if key in m]
    if loaded:
        dry_s = _s(m.get("dry_loaded", {}).get("seconds"))
        real_s = _s(m.get("real_loaded", {}).get("seconds"))
        lines += [
            "The API during a run (issue 16, item 3): a second process calls POST /entries, PATCH "
            "/entries/{id} (a title) and POST /entries/{id}/access one after another, ~20 a second, "
            "from 2 s before the run to 2 s after it (a dry and a real run again, on the workspace "
            f"the restore left; dry {dry_s} s, real {real_s} s).",
            "",
            "| during the | calls | p50 ms | p99 ms | max ms | errors (5xx, exceptions) | refused (4xx) |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, stats in loaded:
            if "stopped" in stats:
                lines.append(f"| {name} | {stats['stopped']} | — | — | — | — | — |")
                continue
            for op, x in stats["ops"].items():
                errs = sum(v for k, v in stats["errors"].items() if k.startswith(op + " "))
                refused = sum(v for k, v in stats["refused"].items() if k.startswith(op + " "))
                lines.append(
                    f"| {name}: {op} | {x['n']:,} | {x['p50'] * 1000:.0f} | {x['p99'] * 1000:.0f} | "
                    f"{x['max'] * 1000:.0f} | {errs} | {refused} |"
                )
            if stats["errors"]:
                lines.append(f"| {name}: errors by kind | {stats['errors']} | | | | | |")
            if stats["refused"]:
                lines.append(f"| {name}: refused by kind | {stats['refused']} | | | | | |")
        lines.append("")
    # Per pass.
    table: dict[str, dict[str, dict[str, Any]]] = {}
    order: list[str] = []
    for source, r in (("dry", dry), ("real", real), ("next", again)):
        for p in r.get("passes", []):
            col = f"{source} {p['phase']}"
            if p["pass"] not in table:
                table[p["pass"]] = {}
                order.append(p["pass"])
            table[p["pass"]][col] = p
    cols = [
        c
        for c in ("dry plan", "real plan", "real apply", "next plan", "next apply")
        if any(c in v for v in table.values())
    ]
    if order:
        lines += [
            "Each pass: wall seconds (rows it reported, statements).",
            "",
            "| pass | " + " | ".join(cols) + " |",
            "|---|" + "---|" * len(cols),
        ]
        for name in order:
            cells = []
            for c in cols:
                p = table[name].get(c)
                cells.append(f"{_s(p['seconds'])} ({p['rows']:,}, {p['statements']:,})" if p else "—")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        sums = []
        for c in cols:
            sums.append(_s(sum(p[c]["seconds"] for p in table.values() if c in p)))
        lines.append("| all passes | " + " | ".join(sums) + " |")
        lines.append("")
    # Targets.
    verdicts = []
    if vendor == "postgres" and n == 1_000_000:
        t = TARGETS
        if real.get("seconds") == real.get("seconds") and floor.get("seconds"):
            verdicts.append(_verdict(real_wo_backup <= t["real_s"], f"real run ≤ {t['real_s']:g} s"))
            verdicts.append(
                _verdict(
                    real_wo_backup <= t["real_floor_x"] * floor["seconds"],
                    f"real run ≤ {t['real_floor_x']:g}× the floor",
                )
            )
        if "seconds" in dry and dry["seconds"] == dry["seconds"]:
            verdicts.append(_verdict(dry["seconds"] <= t["dry_s"], f"dry run ≤ {t['dry_s']:g} s"))
        ratio = cost_ratio(smaller, m)
        if ratio:
            verdicts.append(
                _verdict(
                    ratio[0] <= t["ratio"],
                    f"100k → 1M cost ≤ {t['ratio']:g}× (real run without its backup {ratio[0]:.1f}×, "
                    f"dry run {ratio[1]:.1f}×, against the 100,000-entry section of this invocation)",
                )
            )
        else:
            verdicts.append(
                f"100k → 1M cost ≤ {t['ratio']:g}×: not measured here (it needs `--sizes 100000,1000000` "
                "in one invocation)"
            )
        rss = max(
            m.get(k, {}).get("rss_mb", 0)
            for k in ("dry", "real", "again", "revert", "backup", "restore", "reads")
        )
        verdicts.append(_verdict(rss <= t["rss_mb"], f"peak RSS ≤ {t['rss_mb']:g} MB ({rss:.0f})"))
        if backup:
            verdicts.append(_verdict(backup["seconds"] <= t["backup_s"], f"backup ≤ {t['backup_s']:g} s"))
        if "restore" in m:
            verdicts.append(
                _verdict(
                    m["restore"]["seconds"] <= t["restore_s"] and bool(m.get("restore_same")),
                    f"restore ≤ {t['restore_s']:g} s, same checksum and counts",
                )
            )
        if "revert" in m:
            verdicts.append(
                _verdict(
                    m["revert"]["seconds"] <= t["revert_s"],
                    f"revert ≤ {t['revert_s']:g} s (of {real.get('affected', {}).get('tombstoned', 0):,} "
                    "tombstoned; the target's run tombstones 250,000)",
                )
            )
        if "hygiene" in reads:
            verdicts.append(
                _verdict(
                    reads["hygiene"]["times"][0] <= t["hygiene_s"],
                    f"hygiene first page ≤ {t['hygiene_s']:g} s",
                )
            )
            verdicts.append(
                _verdict(
                    reads["review"]["times"][0] <= t["review_s"],
                    f"review counts ≤ {t['review_s'] * 1000:g} ms",
                )
            )
    if vendor == "sqlite" and n == 100_000 and "seconds" in real and real["seconds"] == real["seconds"]:
        verdicts.append(
            _verdict(
                real["seconds"] <= TARGETS["sqlite_real_s"], f"full run ≤ {TARGETS['sqlite_real_s']:g} s"
            )
        )
    if verdicts:
        lines += ["Targets (issue 16, item 2): " + "; ".join(verdicts) + ".", ""]
    lines.append(f"<!-- /maintenance:{key} -->")
    return "\n".join(lines)


HEADER = """# Maintenance at scale: a whole run beside the work it must do

Written by `bench/maintenance.py` (issue 16, item 1). One section per (label, database, N); a
run replaces the sections it measured and keeps the rest. Targets (issue 16, item 2), on
PostgreSQL at 1,000,000 entries: real run ≤ 60 s and ≤ 3× the compute floor (both without the
pre-prune backup), dry run ≤ 30 s, peak RSS ≤ 300 MB and flat in N, 100k → 1M cost ≤ 11×,
pre-prune backup ≤ 60 s, its restore ≤ 120 s (same checksum and counts), revert of a run that
tombstoned 250,000 entries ≤ 60 s, hygiene preview first page ≤ 1 s, review page counts
≤ 200 ms; on SQLite at 100,000 entries: full run ≤ 20 s.
"""


def write_report(out: Path, sections: dict[str, str]) -> None:
    text = out.read_text() if out.is_file() else HEADER
    for key, section in sections.items():
        start, end = f"<!-- maintenance:{key} -->", f"<!-- /maintenance:{key} -->"
        if start in text and end in text:
            text = text[: text.index(start)] + section + text[text.index(end) + len(end) :]
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


def database_version(target: Target) -> str:
    if target.vendor == "postgres":
        import psycopg

        with psycopg.connect(target.admin_url) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            buffers = conn.execute("SHOW shared_buffers").fetchone()[0]
        return f"PostgreSQL {version}, shared_buffers {buffers}"
    return f"SQLite {sqlite3.sqlite_version}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        op, slug, arg = sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else ""
        result = child(op, slug, arg)
        print(RESULT + json.dumps(result, default=str), flush=True)
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--databases", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument(
        "--sizes",
        help="comma-separated N (default: 10000,100000 on SQLite, 10000,100000,1000000 on PostgreSQL)",
    )
    parser.add_argument(
        "--postgres-url", default=DEFAULT_PG, help="the seed database (its _work copy is made)"
    )
    parser.add_argument("--sqlite-path", default=DEFAULT_SQLITE, help="the seed file (a -work copy is made)")
    parser.add_argument(
        "--work-name",
        help="PostgreSQL: the work copy's name (default <seed>_work; two runs at once need two)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--review-mode",
        choices=("apply", "propose"),
        default="apply",
        help="the workspace's review mode for the runs (apply: archives and tombstones are applied)",
    )
    parser.add_argument("--label", default="current", help="names this run's sections (e.g. before, after)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per step before it is stopped")
    parser.add_argument(
        "--max-rss-mb", type=float, default=4000, help="memory a step may take before it is stopped"
    )
    parser.add_argument(
        "--api-load",
        action="store_true",
        help="then a dry and a real run again while a second process calls the API (issue 16, item 3)",
    )
    parser.add_argument(
        "--backup-restore-only",
        action="store_true",
        help="only a manual backup of the untouched workspace and its restore (no runs)",
    )
    parser.add_argument(
        "--reads-only",
        action="store_true",
        help="only the hygiene preview's first page and the review counts, on the untouched workspace",
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    if not re.fullmatch(r"[\w .()-]+", args.label):
        parser.error("--label: letters, digits, spaces, . ( ) - only")

    loop = python_loop_seconds()
    machine = (
        f"{cpu_model()}, {os.cpu_count()} CPUs, {ram_gib():.1f} GiB RAM; Python {platform.python_version()}; "
        f"yardstick (10M-step Python loop, bench/machine.py) {loop:.2f} s CPU"
    )
    sections: dict[str, str] = {}
    for vendor in (v.strip() for v in args.databases.split(",")):
        if vendor not in DEFAULT_SIZES:
            parser.error(f"--databases: unknown {vendor!r}")
        target = Target(vendor, args)
        version = database_version(target)
        measured: dict[int, dict[str, Any]] = {}
        for n in (int(x) for x in (args.sizes or DEFAULT_SIZES[vendor]).split(",")):
            started = datetime.now(UTC)
            m = measured[n] = measure(target, n, args)
            facts = {"started": started, "finished": datetime.now(UTC), "database": version}
            sizes = (args.sizes or DEFAULT_SIZES[vendor]) if smaller_of(n, measured) else str(n)
            command = f".venv/bin/python bench/maintenance.py --databases {vendor} --sizes {sizes}"
            if vendor == "postgres" and args.postgres_url != DEFAULT_PG:
                command += " --postgres-url " + shlex.quote(args.postgres_url)
            if vendor == "sqlite" and args.sqlite_path != DEFAULT_SQLITE:
                command += " --sqlite-path " + shlex.quote(args.sqlite_path)
            if args.review_mode != "apply":
                command += " --review-mode " + args.review_mode
            if args.label != "current":
                command += " --label " + shlex.quote(args.label)
            if args.backup_restore_only:
                command += " --backup-restore-only"
            if args.reads_only:
                command += " --reads-only"
            if args.api_load:
                command += " --api-load"
            section = render_section(
                args.label, vendor, facts, m, command, machine, smaller=smaller_of(n, measured)
            )
            sections[f"{args.label}:{vendor}:{n}"] = section
            write_report(Path(args.out), {f"{args.label}:{vendor}:{n}": section})
            print(section, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
