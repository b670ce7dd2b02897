"""Time the agent API's common reads in-process: the top 20 by importance and 2-word searches.

    .venv/bin/python bench/reads.py [--database-url postgres://...] [--entries 10000,100000]
        [--requests 400] [--out bench/reports/reads.md]

Without ``--database-url`` the data lives in the SQLite file ``var/bench-reads.sqlite3`` (the
embedded default's engine, apart from the developer's own ``var/db.sqlite3``). For each N,
``bench/datagen.py`` makes sure workspace ``bench-<N>`` holds N generated entries (the first
run generates them: ~80 s for 100,000 on SQLite here), then three operations are called
through Django's test client with an agent key and the production settings
``bench/endpoints.py`` uses (``DJANGO_DEBUG=0``, no rate limit), so the times are the server's
own work without HTTP:

* ``GET /entries?sort=importance&limit=20`` (the default list: top 20 by importance);
* ``GET /search?q=<2 words>``, selective: a generated 2-word query (``datagen.TextGen``) with
  1 to max(5, N/1000) matches; a different one of ``--queries`` such queries each call;
* ``GET /search?q=<2 words>``, broad: one matching at least 2% of the N entries (at 100,000
  that is more than ``broad_threshold``, and the search ranks only the 100 most important of
  its matches, see memory/search.py; the report says how many were ranked).

The calls are made in rounds, each round calling every operation a few times, so that the
machine's moments of load spread over all three alike; after ``--warmup`` calls of each, the
next ``--requests`` calls of each are timed (wall clock and this process's CPU time) and every
answer must be 200. The count caches stay as they are in a server: a list above 10,000 rows
counts exactly once every 30 s, inside the timed calls. The report gives p50/p95 per
operation and N, SQL statements per call, the query plans of the list page and its count, the
machine (``bench/machine.py``) and its load average; each database's section replaces that
database's previous one and keeps the other.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import statistics
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

DEFAULT_DB = "sqlite:///var/bench-reads.sqlite3"
DEFAULT_OUT = ROOT / "bench" / "reports" / "reads.md"
API = "/api/v1"
OPERATIONS = [
    ("list", "top 20 by importance: `GET /entries?sort=importance&limit=20`"),
    ("selective", "2-word selective search: `GET /search?q=…`"),
    ("broad", "2-word broad search: `GET /search?q=…`"),
]
# Issue 16 item 7: in-process p50 at 100,000 entries, on SQLite (and the same or better on
# PostgreSQL).
TARGETS_MS = {"list": 5.0, "selective": 4.0, "broad": 15.0}
TARGET_N = 100_000


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1))]


def log(msg: str) -> None:
    print(f"[reads {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pick_queries(ws: Any, n: int, want: int, seed: int) -> dict[str, list[tuple[str, int, int]]]:
    """``want`` selective and ``want`` broad 2-word queries, each with its matches and how
    many of them the search ranks."""
    import datagen

    from memory.search import search

    gen = datagen.TextGen(seed=seed + 7)
    most_selective = max(5, n // 1000)
    found: dict[str, list[tuple[str, int, int]]] = {"selective": [], "broad": []}
    seen: set[str] = set()
    for _ in range(20_000):
        q = gen.query()
        if len(q.split()) != 2 or q in seen:
            continue
        seen.add(q)
        result = search(ws, q, limit=1)
        if 1 <= result.count <= most_selective:
            kind = "selective"
        elif result.count >= n // 50:
            kind = "broad"
        else:
            continue
        if len(found[kind]) < want:
            found[kind].append((q, result.count, result.ranked or 0))
        if all(len(v) >= want for v in found.values()):
            break
    return found


def measure(ws: Any, n: int, args: argparse.Namespace) -> dict[str, Any]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from memory import accounts, selectors

    _, raw = accounts.api_key_create(
        workspace=ws, name=f"bench reads {datetime.now(UTC):%H:%M:%S}", role="agent"
    )
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    queries = pick_queries(ws, n, args.queries, args.seed)
    for kind, qs in queries.items():
        if not qs:
            raise SystemExit(f"no {kind} 2-word query found at N={n}")
    position = {"selective": 0, "broad": 0}

    def call(op: str) -> Any:
        if op == "list":
            return client.get(f"{API}/entries", {"sort": "importance", "limit": "20"}, secure=True)
        qs = queries[op]
        q = qs[position[op] % len(qs)][0]
        position[op] += 1
        return client.get(f"{API}/search", {"q": q}, secure=True)

    statements = {}
    for op, _label in OPERATIONS:
        with CaptureQueriesContext(connection) as captured:
            response = call(op)
        assert response.status_code == 200, (op, response.status_code, response.content[:300])
        statements[op] = len(captured.captured_queries)

    wall: dict[str, list[float]] = {op: [] for op, _ in OPERATIONS}
    cpu: dict[str, list[float]] = {op: [] for op, _ in OPERATIONS}
    per_round = 10
    done = 0
    total = args.warmup + args.requests
    while done < total:
        for op, _label in OPERATIONS:
            for _ in range(per_round):
                c0, t0 = time.process_time(), time.perf_counter()
                response = call(op)
                t1, c1 = time.perf_counter(), time.process_time()
                if response.status_code != 200:
                    raise SystemExit(f"{op}: {response.status_code} {response.content[:300]!r}")
                if done >= args.warmup:
                    wall[op].append(1000 * (t1 - t0))
                    cpu[op].append(1000 * (c1 - c0))
        done += per_round

    plans = {}
    listed = selectors.entry_list(ws, sort="importance")
    plans["list page"] = listed[:20].explain()
    counted = selectors.entry_list_counted(ws).order_by()[: selectors.COUNT_EXACT_UP_TO + 1]
    plans["list count (up to 10,001 rows)"] = counted.explain()
    visible = selectors.entry_list_counted(ws).count()
    return {
        "n": n,
        "visible": visible,
        "queries": queries,
        "statements": statements,
        "results": {
            op: {
                "calls": len(wall[op]),
                "p50": statistics.median(wall[op]),
                "p95": pct(wall[op], 0.95),
                "cpu_p50": statistics.median(cpu[op]),
            }
            for op, _ in OPERATIONS
        },
        "plans": plans,
    }


def database_facts() -> dict[str, str]:
    from django.db import connection

    with connection.cursor() as c:
        if connection.vendor == "sqlite":
            c.execute("SELECT sqlite_version()")
            return {"vendor": "sqlite", "version": f"SQLite {c.fetchone()[0]}"}
        c.execute("SHOW server_version")
        version = c.fetchone()[0]
        c.execute("SHOW shared_buffers")
        return {
            "vendor": connection.vendor,
            "version": f"PostgreSQL {version}, shared_buffers {c.fetchone()[0]}",
        }


def render_section(
    args: argparse.Namespace, facts: dict[str, str], runs: list[dict[str, Any]], **kw: Any
) -> str:
    vendor = facts["vendor"]
    title = "SQLite (the embedded default)" if vendor == "sqlite" else "PostgreSQL"
    command = ".venv/bin/python bench/reads.py" + (
        "" if args.database_url == DEFAULT_DB else " --database-url " + shlex.quote(args.database_url)
    )
    command += f" --entries {args.entries} --requests {args.requests}"
    lines = [
        f"<!-- reads:{vendor} -->",
        f"## {title}",
        "",
        f"Measured {kw['started']:%Y-%m-%d %H:%M} – {kw['finished']:%H:%M} UTC with `{command}`.",
        "",
        f"- database: {facts['version']}",
        f"- machine: {cpu_model()}, {os.cpu_count()} CPUs, {ram_gib():.1f} GiB RAM; "
        f"Python {platform.python_version()}; yardstick (10M-step Python loop, bench/machine.py) "
        f"{kw['loop_seconds']:.2f} s CPU",
        f"- load average (1, 5, 15 min) at start {kw['load_start'][0]:.2f} {kw['load_start'][1]:.2f} "
        f"{kw['load_start'][2]:.2f}, at end {kw['load_end'][0]:.2f} {kw['load_end'][1]:.2f} "
        f"{kw['load_end'][2]:.2f} (a shared machine: other people's work ran meanwhile)",
        f"- {args.requests} timed calls per operation and N after {args.warmup} warm-up calls, "
        "in-process (Django test client, agent key, `DJANGO_DEBUG=0`)",
        "",
        "| operation | N | visible | p50 ms | p95 ms | CPU p50 ms | statements | target (p50 at 100k) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for op, label in OPERATIONS:
            r = run["results"][op]
            target = TARGETS_MS[op]
            if run["n"] != TARGET_N:
                verdict = "—"
            elif r["p50"] <= target:
                verdict = f"≤ {target:g} ms: **met**"
            else:
                verdict = f"≤ {target:g} ms: **not met**"
            lines.append(
                f"| {label} | {run['n']:,} | {run['visible']:,} | {r['p50']:.2f} | {r['p95']:.2f} | "
                f"{r['cpu_p50']:.2f} | {run['statements'][op]} | {verdict} |"
            )
    lines.append("")
    for run in runs:
        lines.append(f"Queries at N = {run['n']:,} (matches, ranked):")
        for kind in ("selective", "broad"):
            shown = ", ".join(f"`{q}` ({count:,}, {ranked:,})" for q, count, ranked in run["queries"][kind])
            lines.append(f"- {kind}: {shown}")
        lines.append("")
    for run in runs:
        for name, plan in run["plans"].items():
            lines += [f"Plan of the {name} at N = {run['n']:,}:", "", "```", plan, "```", ""]
    lines.append(f"<!-- /reads:{vendor} -->")
    return "\n".join(lines)


HEADER = """# Reads: top 20 by importance and 2-word searches, in-process

Written by `bench/reads.py` (issue 16, item 7): each database's section below is replaced by
the next run on that database. Targets (SQLite at 100,000 entries, p50; PostgreSQL the same or
better): top 20 by importance ≤ 5 ms, selective 2-word search ≤ 4 ms, broad ≤ 15 ms.
"""


def write_report(out: Path, section: str, vendor: str) -> None:
    old = out.read_text() if out.is_file() else HEADER
    start, end = f"<!-- reads:{vendor} -->", f"<!-- /reads:{vendor} -->"
    if start in old and end in old:
        text = old[: old.index(start)] + section + old[old.index(end) + len(end) :]
    else:
        text = old.rstrip("\n") + "\n\n" + section + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_DB)
    parser.add_argument("--entries", default="10000,100000", help="comma-separated sizes")
    parser.add_argument("--requests", type=int, default=400, help="timed calls per operation and size")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--queries", type=int, default=20, help="distinct queries of each kind")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    os.environ.update(
        {
            "DATABASE_URL": args.database_url,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DJANGO_DEBUG": "0",
            "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-reads-" + "x" * 40),
            "ALLOWED_HOSTS": "testserver",
            "API_RATE_LIMIT_PER_MINUTE": "0",
            "LOG_LEVEL": "WARNING",
        }
    )
    os.environ.pop("REDIS_URL", None)
    started = datetime.now(UTC)
    load_start = os.getloadavg()
    loop_seconds = python_loop_seconds()
    import subprocess

    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL
    )
    import django

    django.setup()
    import datagen

    from memory.models import Workspace

    facts = database_facts()
    runs = []
    for n in (int(x) for x in args.entries.split(",")):
        gen = datagen.ensure(n, seed=args.seed)
        ws = Workspace.objects.get(pk=gen.workspace_id)
        log(f"N={n:,}: measuring")
        run = measure(ws, n, args)
        for op, label in OPERATIONS:
            r = run["results"][op]
            log(f"N={n:,} {label}: p50 {r['p50']:.2f} ms, p95 {r['p95']:.2f} ms")
        runs.append(run)
    finished = datetime.now(UTC)
    section = render_section(
        args,
        facts,
        runs,
        started=started,
        finished=finished,
        loop_seconds=loop_seconds,
        load_start=load_start,
        load_end=os.getloadavg(),
    )
    write_report(Path(args.out), section, facts["vendor"])
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
