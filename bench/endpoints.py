"""Time every read endpoint of the agent API, and the maintenance dry runs, on a large workspace.

    .venv/bin/python bench/endpoints.py [--database-url postgres://postgres@127.0.0.1:5432/bench_api]
        [--entries 1000000] [--repeat 3] [--skip-slow] [--out bench/reports/endpoints.md]

The data is ``bench/api.py``'s (``bench/datagen.py`` makes sure workspace ``bench-<N>`` holds N
generated entries; the first run generates them, ~3 minutes for 1,000,000). Each request goes
in-process through Django's test client with an operator key, with the production settings
``bench/api.py`` serves with (``DJANGO_DEBUG=0``), so the times are the server's own work
without HTTP; the SQL statements of each request are counted. Read endpoints: the best of
``--repeat`` calls after one warm-up call. The dry runs and the hygiene preview scan the
whole workspace and are called once each, in a child process stopped after
``--slow-timeout`` seconds (default 600; ``--skip-slow`` leaves them out). This is where a
large hosted workspace would find an endpoint too slow: no targets, just the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from machine import cpu_model, python_loop_seconds, ram_gib  # bench/machine.py

ROOT = Path(__file__).resolve().parent.parent
# The project first (bench/maintenance.py would shadow its ``maintenance`` package), bench/ last.
sys.path[:] = [
    str(ROOT),
    *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"),
    str(ROOT / "bench"),
]

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/bench_api"
LEASE_WAIT = 65  # seconds: a workspace's run lease lasts 60
API = "/api/v1"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_DB)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-slow", action="store_true", help="leave out the whole-workspace scans")
    parser.add_argument("--slow-timeout", type=float, default=600.0, help="seconds per whole-workspace call")
    parser.add_argument("--one", nargs=3, metavar=("METHOD", "PATH", "BODY"), help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "bench" / "reports" / "endpoints.md"))
    args = parser.parse_args()

    os.environ.update(
        {
            "DATABASE_URL": args.database_url,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DJANGO_DEBUG": "0",
            "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-endpoints-" + "x" * 40),
            "ALLOWED_HOSTS": "testserver",
            "API_RATE_LIMIT_PER_MINUTE": "0",
            "LOG_LEVEL": "WARNING",
        }
    )
    os.environ.pop("REDIS_URL", None)
    started = datetime.now(UTC)
    if not args.one:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )

    import django

    django.setup()
    import datagen
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from memory import accounts
    from memory.models import Entry, Tag, Workspace

    def call(client: Client, method: str, path: str, body: Any = None) -> tuple[int, float, int]:
        """One request: its status, milliseconds and SQL statements."""
        kwargs: dict[str, Any] = {"secure": True}
        if body is not None:
            kwargs.update(data=json.dumps(body), content_type="application/json")
        with CaptureQueriesContext(connection) as queries:
            t = time.perf_counter()
            response = getattr(client, method)(API + path, **kwargs)
            ms = 1000 * (time.perf_counter() - t)
        return response.status_code, ms, len(queries.captured_queries)

    def operator(ws: Workspace, name: str) -> Client:
        _, raw = accounts.api_key_create(workspace=ws, name=name, role="operator")
        return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")

    if args.one:  # a child: one call, its result as JSON on stdout
        method, path, body = args.one
        ws = Workspace.objects.get(slug=f"bench-{args.entries}")
        status, ms, n = call(
            operator(ws, "endpoints (one call)"), method, path, json.loads(body) if body else None
        )
        print(json.dumps({"status": status, "ms": ms, "statements": n}))
        return 0
    yardstick = python_loop_seconds()
    gen = datagen.ensure(args.entries, seed=args.seed)
    ws = Workspace.objects.get(pk=gen.workspace_id)
    client = operator(ws, f"endpoints {started:%Y-%m-%d %H:%M}")
    entry = Entry.objects.filter(workspace=ws, is_latest=True, status="active").order_by("pk").first()
    assert entry is not None, "the workspace has no active entry"
    tag = Tag.objects.filter(workspace=ws).order_by("name").values_list("name", flat=True).first()

    reads = [
        "/entries?limit=20",
        "/entries?sort=recent&limit=20",
        "/entries?sort=retention&limit=20",
        "/entries?status=stale&limit=20",
        "/entries?entry_type=decision&limit=20",
        "/entries?tier=constitutional&limit=20",
        *([f"/entries?tag={tag}&limit=20"] if tag else []),
        "/entries?include_archived=true&limit=500",
        "/entries?limit=20&offset=500000",
        f"/entries/{entry.pk}",
        f"/entries/{entry.pk}/versions",
        f"/entries/{entry.pk}/history",
        "/search?q=retention",
        "/search?q=retention&limit=100&offset=400",
        "/maintenance/runs",
        "/tombstones",
        "/backups",
        "/stats",
        "/policy",
        "/disputes",
    ]
    rows: list[tuple[str, int, float, int, str]] = []
    for path in reads:
        call(client, "get", path)  # warm-up (and a list's cached count)
        best = min((call(client, "get", path) for _ in range(max(1, args.repeat))), key=lambda r: r[1])
        rows.append((f"GET {path}", best[0], best[1], best[2], f"best of {args.repeat}"))
        print(f"{rows[-1][0]:60s} {best[0]} {best[1]:10.1f} ms {best[2]:3d} statements", flush=True)
    if not args.skip_slow:
        slow = [
            ("get", "/hygiene/preview?limit=20", None),
            ("post", "/maintenance/sweep-decay", {"dry_run": True}),
            ("post", "/maintenance/prune", {"dry_run": True}),
            ("post", "/maintenance/run", {"dry_run": True}),
        ]
        for method, path, body in slow:
            label = f"{method.upper()} {path}" + (f" {json.dumps(body)}" if body else "")
            child = [
                sys.executable,
                __file__,
                "--database-url",
                args.database_url,
                "--entries",
                str(args.entries),
            ]
            child += ["--one", method, path, json.dumps(body) if body else ""]
            try:
                done = subprocess.run(
                    child, cwd=ROOT, capture_output=True, text=True, timeout=args.slow_timeout
                )
                got = json.loads(done.stdout.strip().splitlines()[-1])
                rows.append((label, got["status"], got["ms"], got["statements"], "once"))
            except subprocess.TimeoutExpired:
                _cancel_backends(connection)
                rows.append((label, 0, 1000 * args.slow_timeout, 0, f"stopped after {args.slow_timeout:g} s"))
                time.sleep(LEASE_WAIT)  # the stopped run's lease would make the next one skip
            print(f"{label:60s} {rows[-1][1]} {rows[-1][2]:10.1f} ms {rows[-1][3]:3d} statements", flush=True)

    lines = [
        "# Every read endpoint, and the dry runs, on a large workspace",
        "",
        f"Generated by `{shlex.join(['.venv/bin/python', 'bench/endpoints.py', *sys.argv[1:]])}` "
        f"on {started:%Y-%m-%d %H:%M} UTC.",
        "",
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs, {ram_gib():.0f} GiB RAM; "
        f"{platform.platform()}; Python {platform.python_version()}; yardstick "
        f"(`bench/machine.py`) {yardstick:.2f} s",
        f"- data: workspace `{gen.slug}`, {gen.entries:,} generated entries (`bench/datagen.py`), "
        f"PostgreSQL on the same machine with its settings as found",
        "- each request in-process (Django's test client, no HTTP), operator key, `DJANGO_DEBUG=0`",
        "",
        "| request | status | ms | SQL statements | timing |",
        "| --- | ---: | ---: | ---: | --- |",
        *(
            f"| `{label}` | {status} | {ms:,.1f} | {n} | {how} |"
            if status
            else f"| `{label}` | — | > {ms:,.0f} | — | {how} |"
            for label, status, ms, n, how in rows
        ),
        "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print(f"report: {out}")
    return 0


def _cancel_backends(connection: Any) -> None:
    """End the stopped child's statements (its process is gone; its backend may run on)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'"
        )


if __name__ == "__main__":
    sys.exit(main())
