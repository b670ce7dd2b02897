"""Benchmark the agent API under a production-style ASGI server on PostgreSQL holding N entries.

    .venv/bin/python bench/api.py [--database-url postgres://postgres@127.0.0.1:5432/bench_api]
        [--entries 1000000] [--duration 20] [--requests 5000] [--concurrency 2,8] [--workers 2]
        [--out bench/reports/api.md] [--regenerate] [--server-env KEY=VALUE ...] [--no-diagnose]

1. ``manage.py migrate`` on the database, then ``bench/datagen.py`` makes sure workspace
   ``bench-<N>`` holds N generated entries (reused when it already does; entries added by an
   earlier run's POSTs are removed first), and an agent API key is created.
2. The server runs as W separate processes (``--workers W``, default 2), each
   ``python -m uvicorn config.asgi:application --port P --loop uvloop --http httptools
   --no-access-log`` on a port of its own, the load spread over them round-robin as a load
   balancer would (uvicorn's own ``--workers`` races for each accepted connection and left
   keep-alive connections 6/2 on two workers), with ``DJANGO_DEBUG=0``, ``SECRET_KEY``, ``ALLOWED_HOSTS`` and
   ``API_RATE_LIMIT_PER_MINUTE=0`` (the per-key limit would otherwise answer 429 after 600
   requests a minute). Requests carry ``X-Forwarded-Proto: https`` as from a TLS-terminating
   proxy, so the production ``SECURE_SSL_REDIRECT`` stays on.
3. A second process (``bench/api.py --drive PLAN``: asyncio, raw HTTP/1.1 over keep-alive
   loopback connections, uvloop) runs each scenario with a fixed concurrency: a short warm-up,
   then requests until the request count or the time limit is reached, whichever comes first.
   Every non-2xx answer is an error. It reports p50/p95/p99, mean, max and requests/s.
4. Unless ``--no-diagnose``: in-process, per endpoint, the SQL queries of one request
   (``CaptureQueriesContext``) and their time, the cost of opening a database connection, and
   ``EXPLAIN ANALYZE`` of the list and search SQL, appended to the report.

The report (markdown) and the table on stdout give the machine, PostgreSQL version, data size,
server command, load average at start and end, the results and the targets with PASS/FAIL:
a p95 target judged at the highest concurrency not above the CPU count (beyond it requests
queue for the CPUs and p95 measures the queue; shown, not judged), the throughput target at
the concurrency that reached the most.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import secrets
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
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
DEFAULT_OUT = ROOT / "bench" / "reports" / "api.md"
# Everything from this line on in an existing report (a hand-written analysis) is kept on rewrite.
ANALYSIS_MARK = "<!-- analysis: kept when bench/api.py rewrites this report -->"
API = "/api/v1"

# name -> (label, target kind, target value); p95 targets in ms, throughput in requests/s.
SCENARIOS = [
    ("health", "GET /api/v1/health (framework floor + SELECT 1)"),
    ("list", "GET /entries?sort=importance&limit=20"),
    ("get", "GET /entries/{id}"),
    ("search", "GET /search?q=…"),
    ("create", "POST /entries"),
]
TARGETS = [
    ("list", "p95", 15.0, "list p95 ≤ 15 ms"),
    ("search", "p95", 50.0, "search p95 ≤ 50 ms"),
    ("create", "rps", 300.0, "create ≥ 300 requests/s"),
]


# --- the load generator (second process) ---------------------------------------------------------


class Conn:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        """Send one request, read the whole response; reconnects once if the server closed."""
        for attempt in (0, 1):
            if self.writer is None:
                await self.open()
            assert self.reader is not None and self.writer is not None
            try:
                self.writer.write(raw)
                head = await self.reader.readuntil(b"\r\n\r\n")
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:
                    raise
                continue
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            if "content-length" in headers:
                body = await self.reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    chunk = await self.reader.readexactly(size + 2)
                    if size == 0:
                        break
                    parts.append(chunk[:-2])
                body = b"".join(parts)
            else:
                body = await self.reader.read()
                self.close()
            if headers.get("connection", "").lower() == "close":
                self.close()
            return status, body
        raise ConnectionError("unreachable")


def _raw_request(method: str, path: str, host: str, key: str | None, body: bytes | None = None) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}",
        "Accept: application/json",
        "X-Forwarded-Proto: https",  # as from the TLS-terminating proxy of a production deployment
        "User-Agent: memory-steward-bench",
    ]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [float(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _proc_cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the given live processes, in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / tick


def _pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, int(-(-p * len(sorted_values) // 1)) - 1))
    return sorted_values[k]


async def _run_scenario(plan: dict[str, Any], sc: dict[str, Any]) -> dict[str, Any]:
    host, ports = plan["host"], plan["ports"]
    hostname = f"{host}:{ports[0]}"
    key = plan["key"] if sc.get("auth", True) else None
    if sc["method"] == "POST":
        requests_ = [_raw_request("POST", sc["path"], hostname, key, b.encode()) for b in sc["bodies"]]
    else:
        requests_ = [_raw_request("GET", p, hostname, key) for p in sc["paths"]]
    conc = plan["concurrency"]
    conns = [Conn(host, ports[i % len(ports)]) for i in range(conc)]  # round-robin over the servers
    for c in conns:
        await c.open()
    state = {"i": 0}
    want_json = sc["name"] in ("search", "list")

    async def phase(max_requests: int, seconds: float) -> dict[str, Any]:
        lat: list[float] = []
        statuses: Counter[int] = Counter()
        errors: list[str] = []
        counts: list[tuple[float, int]] = []
        deadline = time.perf_counter() + seconds
        issued = 0

        async def worker(conn: Conn) -> None:
            nonlocal issued
            while issued < max_requests and time.perf_counter() < deadline:
                issued += 1
                i = state["i"]
                state["i"] += 1
                raw = requests_[i % len(requests_)]
                t0 = time.perf_counter()
                try:
                    status, body = await conn.request(raw)
                except Exception as exc:  # a dead connection is an error, not a crash
                    statuses[-1] += 1
                    if len(errors) < 3:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    conn.close()
                    continue
                dt = time.perf_counter() - t0
                lat.append(dt)
                statuses[status] += 1
                if not 200 <= status < 300:
                    if len(errors) < 3:
                        errors.append(f"{status}: {body[:300].decode('utf-8', 'replace')}")
                elif want_json:
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        counts.append((dt, int(json.loads(body)["count"])))

        server_pids = [pid for root in plan.get("server_pids", []) for pid in _descendants(root)]
        srv0 = _proc_cpu_seconds(server_pids)
        cpu0, wall_cpu0 = _cpu_times()
        ru0 = os.times()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed = time.perf_counter() - t0
        cpu1, wall_cpu1 = _cpu_times()
        ru1 = os.times()
        srv1 = _proc_cpu_seconds(server_pids)
        lat.sort()
        n = len(lat)
        n_err = sum(v for k, v in statuses.items() if not 200 <= k < 300)
        return {
            "requests": n + statuses.get(-1, 0),
            "errors": n_err,
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "error_samples": errors,
            "elapsed": elapsed,
            "rps": n / elapsed if elapsed > 0 else 0.0,
            "mean_ms": 1000 * statistics.fmean(lat) if lat else float("nan"),
            "p50_ms": 1000 * _pct(lat, 0.50),
            "p95_ms": 1000 * _pct(lat, 0.95),
            "p99_ms": 1000 * _pct(lat, 0.99),
            "max_ms": 1000 * lat[-1] if lat else float("nan"),
            "machine_cpu_pct": 100.0
            * (cpu1 - cpu0)
            / max(1.0, wall_cpu1 - wall_cpu0)
            * (os.cpu_count() or 1),
            "driver_cpu_pct": 100.0 * ((ru1.user - ru0.user) + (ru1.system - ru0.system)) / elapsed,
            "server_cpu_ms_per_request": 1000.0 * (srv1 - srv0) / max(1, n),
            "server_cpu_pct": 100.0 * (srv1 - srv0) / elapsed,
            "counts": counts,
        }

    warm = await phase(plan["warmup_requests"], plan["warmup_seconds"])
    result = await phase(plan["requests"], plan["duration"])
    for c in conns:
        c.close()
    result["warmup_requests"] = warm["requests"]
    result["warmup_errors"] = warm["errors"]
    result["name"] = sc["name"]
    return result


def drive(plan_path: Path) -> int:
    """The load generator: runs the plan's scenarios one after the other, prints JSON results."""
    plan = json.loads(plan_path.read_text())
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        pass
    if plan.get("create_bodies"):
        from datagen import TextGen

        gen = TextGen(seed=plan["seed"] + 1000)
        link_ids = plan["link_ids"]
        n = plan["requests"] + plan["warmup_requests"] + 10
        bodies = [json.dumps(gen.api_body(link_ids)) for _ in range(n)]
        for sc in plan["scenarios"]:
            if sc["name"] == "create":
                sc["bodies"] = bodies
    results = []
    for sc in plan["scenarios"]:
        print(f"[drive] {sc['name']} ...", file=sys.stderr, flush=True)
        res = asyncio.run(_run_scenario(plan, sc))
        print(
            f"[drive] {sc['name']}: {res['requests']} requests, {res['errors']} errors, {res['rps']:.0f}/s, "
            f"p50 {res['p50_ms']:.1f} p95 {res['p95_ms']:.1f} p99 {res['p99_ms']:.1f} ms",
            file=sys.stderr,
            flush=True,
        )
        results.append(res)
    Path(plan["results"]).write_text(json.dumps(results))
    return 0


# --- orchestration (first process) -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loadavg() -> tuple[float, float, float]:
    return os.getloadavg()


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def server_env(args: argparse.Namespace, extra: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": args.database_url,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DJANGO_DEBUG": "0",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
            "API_RATE_LIMIT_PER_MINUTE": "0",
            "LOG_LEVEL": "WARNING",
        }
    )
    env.pop("REDIS_URL", None)
    for item in extra:
        k, _, v = item.partition("=")
        env[k] = v
    return env


def wait_health(port: int, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> float:
    url = f"http://127.0.0.1:{port}{API}/health"
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            req = urllib.request.Request(url, headers={"X-Forwarded-Proto": "https"})
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not healthy after {timeout} s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server's own process group (uvicorn's supervisor and its workers)."""
    if proc.poll() is not None:
        return
    pgid = os.getpgid(proc.pid)
    os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        proc.wait()


APP = ["config.asgi:application"]


def serve_and_drive(
    args: argparse.Namespace,
    env: dict[str, str],
    raw_key: str,
    ids: list[int],
    queries: list[str],
    tmp: Path,
) -> dict[str, Any]:
    """Start the server, drive every scenario from a second process, stop the server."""
    # One uvicorn process per port, the driver spreading its connections over them as a load
    # balancer would. With `--workers N` on one port, which worker accepts a keep-alive
    # connection is a race: 8 connections landed 6/2 on two workers in every trial, and a
    # run then measured one core's worth of server.
    ports = [free_port() for _ in range(args.workers)]
    cmds = [
        [
            sys.executable,
            "-m",
            "uvicorn",
            *APP,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
            "--loop",
            "uvloop",
            "--http",
            "httptools",
        ]
        for port in ports
    ]
    cmd = cmds[0]
    procs: list[subprocess.Popen[bytes]] = []
    server_log = tmp / f"server-{ports[0]}.log"
    log(f"starting {len(cmds)} server processes: {shlex.join(cmd[1:])} (ports {', '.join(map(str, ports))})")
    with server_log.open("wb") as out:
        for c in cmds:
            procs.append(
                subprocess.Popen(
                    c, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
    try:
        ready = max(wait_health(port, proc) for port, proc in zip(ports, procs, strict=True))
        log(f"servers healthy after {ready:.1f} s")
        runs = []
        for conc in args.concurrency_levels:
            plan = {
                "host": "127.0.0.1",
                "ports": ports,
                "server_pids": [proc.pid for proc in procs],
                "key": raw_key,
                "concurrency": conc,
                "duration": args.duration,
                "requests": args.requests,
                "warmup_seconds": args.warmup_seconds,
                "warmup_requests": args.warmup_requests,
                "seed": args.seed + conc,
                "create_bodies": True,
                "link_ids": ids[:2000],
                "results": str(tmp / f"results-{ports[0]}-{conc}.json"),
                "scenarios": [
                    {"name": "health", "method": "GET", "paths": [f"{API}/health"], "auth": False},
                    {"name": "list", "method": "GET", "paths": [f"{API}/entries?sort=importance&limit=20"]},
                    {"name": "get", "method": "GET", "paths": [f"{API}/entries/{i}" for i in ids]},
                    {
                        "name": "search",
                        "method": "GET",
                        "paths": [f"{API}/search?q={urllib.parse.quote(q)}" for q in queries],
                    },
                    {"name": "create", "method": "POST", "path": f"{API}/entries"},
                ],
            }
            if args.only:
                wanted = set(args.only.split(","))
                plan["scenarios"] = [sc for sc in plan["scenarios"] if sc["name"] in wanted]
            plan_path = tmp / f"plan-{ports[0]}-{conc}.json"
            plan_path.write_text(json.dumps(plan))
            log(
                f"driving load from a second process: concurrency {conc}, "
                f"≤ {args.requests} requests and ≤ {args.duration:g} s per scenario"
            )
            load_before = loadavg()
            subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--drive", str(plan_path)], check=True
            )
            runs.append(
                {
                    "concurrency": conc,
                    "results": json.loads(Path(plan["results"]).read_text()),
                    "load_before": load_before,
                    "load_after": loadavg(),
                }
            )
    finally:
        for proc in procs:
            stop_server(proc)
    return {"cmd": cmd, "runs": runs, "server_tail": server_log.read_text(errors="replace")[-2000:]}


def wait_quiet(max_seconds: float, threshold: float) -> tuple[float, tuple[float, float, float]]:
    """Wait (at most max_seconds) until the 1-minute load average is below threshold."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_seconds and loadavg()[0] >= threshold:
        time.sleep(5)
    return time.perf_counter() - t0, loadavg()


def run(args: argparse.Namespace) -> int:
    load_start = loadavg()
    started = datetime.now(UTC)
    loop_seconds = python_loop_seconds()
    log(f"python yardstick: 10M-step loop in {loop_seconds:.2f} s CPU")
    env = server_env(args, args.server_env)
    # This process uses the same settings as the server (the diagnostics time its code paths).
    for k in (
        "DATABASE_URL",
        "DJANGO_SETTINGS_MODULE",
        "DJANGO_DEBUG",
        "SECRET_KEY",
        "ALLOWED_HOSTS",
        "API_RATE_LIMIT_PER_MINUTE",
        "LOG_LEVEL",
        *(e.partition("=")[0] for e in args.server_env),
    ):
        os.environ[k] = env[k]
    os.environ.pop("REDIS_URL", None)
    log(f"load average {fmt_load(load_start)}; migrating")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )

    import django

    django.setup()
    import datagen
    from django.db import connection

    from memory import accounts
    from memory.models import Workspace

    gen = datagen.ensure(args.entries, seed=args.seed, regenerate=args.regenerate)
    ws = Workspace.objects.get(pk=gen.workspace_id)
    _key, raw_key = accounts.api_key_create(
        workspace=ws, name=f"bench {started:%Y-%m-%d %H:%M}", role="agent"
    )
    with connection.cursor() as c:
        c.execute(
            "SELECT id FROM memory_entry TABLESAMPLE SYSTEM (%s) WHERE workspace_id = %s AND is_latest "
            "AND status IN ('active', 'stale') LIMIT 5000",
            [min(100.0, max(0.5, 100.0 * 20000 / max(1, args.entries))), ws.pk],
        )
        ids = [r[0] for r in c.fetchall()]
        facts = db_facts(c, ws.pk)
    random.Random(args.seed).shuffle(ids)
    tg = datagen.TextGen(seed=args.seed + 7)
    queries = [tg.query() for _ in range(2000)]
    connection.close()

    waited = None
    if args.wait_quiet:
        log(
            f"waiting up to {args.wait_quiet:g} s for the 1-min load average to drop below "
            f"{args.quiet_load:g}"
        )
        waited = wait_quiet(args.wait_quiet, args.quiet_load)
        log(f"waited {waited[0]:.0f} s; load average {fmt_load(waited[1])}")

    tmp = Path(tempfile.mkdtemp(prefix="bench-api-"))
    passes = [("", args.server_env, serve_and_drive(args, env, raw_key, ids, queries, tmp))]
    if args.compare_env:
        cenv = server_env(args, [*args.server_env, *args.compare_env])
        passes.append(
            (
                " ".join(args.compare_env),
                [*args.server_env, *args.compare_env],
                serve_and_drive(args, cenv, raw_key, ids, queries, tmp),
            )
        )
    load_end = loadavg()

    diagnosis = None
    if not args.no_diagnose:
        log("diagnostics (in-process): queries per request, connection cost, profile, EXPLAIN ANALYZE")
        diagnosis = diagnose(ws, raw_key, ids, queries)
    finished = datetime.now(UTC)

    report = render(
        args=args,
        started=started,
        finished=finished,
        gen=gen,
        facts=facts,
        env=env,
        passes=passes,
        load_start=load_start,
        load_end=load_end,
        loop_seconds=loop_seconds,
        waited=waited,
        diagnosis=diagnosis,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_file() and ANALYSIS_MARK in (old := out.read_text()):
        report = report.rstrip("\n") + "\n\n" + old[old.index(ANALYSIS_MARK) :]
    out.write_text(report)
    for label, _extra, p in passes:
        for run_ in p["runs"]:
            print(f"\n{label or 'settings as deployed (README)'}, concurrency {run_['concurrency']}:")
            print(table(run_["results"]))
            print()
            for line in target_lines(run_["results"], run_["concurrency"], os.cpu_count() or 1):
                print(line)
    if passes:
        print("\nVerdict (settings as deployed):")
        for line in verdict_lines(passes[0][2]["runs"], os.cpu_count() or 1):
            print(line)
    print(f"\nload average start {fmt_load(load_start)}, end {fmt_load(load_end)}; report: {out}")
    return 0


def db_facts(c: Any, ws_id: int) -> dict[str, Any]:
    from django.db import connection

    facts: dict[str, Any] = {"vendor": connection.vendor}
    if connection.vendor != "postgresql":
        return facts
    c.execute("SHOW server_version")
    facts["version"] = c.fetchone()[0]
    for name in ("shared_buffers", "work_mem", "effective_cache_size", "random_page_cost", "max_connections"):
        c.execute(f"SHOW {name}")
        facts[name] = c.fetchone()[0]
    c.execute("SELECT count(*) FROM memory_entry")
    facts["table_rows"] = c.fetchone()[0]
    c.execute(
        "SELECT status, count(*) FROM memory_entry WHERE workspace_id = %s AND is_latest GROUP BY status "
        "ORDER BY status",
        [ws_id],
    )
    facts["statuses"] = dict(c.fetchall())
    c.execute(
        "SELECT pg_size_pretty(pg_table_size('memory_entry')), "
        "pg_size_pretty(pg_indexes_size('memory_entry')), "
        "pg_size_pretty(pg_relation_size('memory_entry_search')), "
        "pg_size_pretty(pg_relation_size('entry_by_importance'))"
    )
    facts["table_size"], facts["indexes_size"], facts["gin_size"], facts["importance_index_size"] = (
        c.fetchone()
    )
    return facts


# --- diagnostics (in-process) ------------------------------------------------------------------


def diagnose(ws: Any, key: str, ids: list[int], queries: list[str]) -> dict[str, Any]:
    import datagen
    from django.db import connection, connections
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    out: dict[str, Any] = {}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    body = json.dumps(datagen.TextGen(seed=99).api_body())

    def call(name: str, i: int) -> Any:
        if name == "health":
            return client.get(f"{API}/health", secure=True)
        if name == "list":
            return client.get(f"{API}/entries", {"sort": "importance", "limit": "20"}, secure=True)
        if name == "get":
            return client.get(f"{API}/entries/{ids[i % len(ids)]}", secure=True)
        if name == "search":
            return client.get(f"{API}/search", {"q": queries[i % len(queries)]}, secure=True)
        b = json.loads(body)
        b["content"] = f"{b['content']} (diagnostic write {i} {time.time()})"
        return client.post(f"{API}/entries", json.dumps(b), content_type="application/json", secure=True)

    # Connection cost per request: Django hands the connection back to the pool after every
    # request and takes one again for the next.
    times = []
    for _ in range(30):
        connection.close()
        t = time.perf_counter()
        connection.ensure_connection()
        with connection.cursor() as c:
            c.execute("SELECT 1")
        times.append(1000 * (time.perf_counter() - t))
    out["connect_ms"] = statistics.median(times)

    # Wall time of a few stages, by wrapping the functions that do them (this process only).
    from django.db.backends.base.base import BaseDatabaseWrapper
    from ninja.operation import Operation

    from memory import new_entries
    from memory.auth import BearerKey

    stage_ms: dict[str, float] = {}

    def timed(owner: Any, attr: str, stage: str) -> tuple[Any, str, Any]:
        original = getattr(owner, attr)

        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                stage_ms[stage] = stage_ms.get(stage, 0.0) + 1000 * (time.perf_counter() - t)

        setattr(owner, attr, wrapper)
        return owner, attr, original

    patches = [
        timed(BaseDatabaseWrapper, "connect", "connect"),
        timed(BearerKey, "authenticate", "auth"),
        timed(Operation, "_result_to_response", "serialize"),
        timed(new_entries, "rescore_written", "rescore"),
    ]
    sql_each: list[tuple[str, float]] = []

    def sql_timer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        t = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            sql_each.append((sql, 1000 * (time.perf_counter() - t)))

    per: dict[str, Any] = {}
    for name, _label in SCENARIOS:
        for i in range(5):  # warm caches
            call(name, i)
        totals, sqls, nq, cpus = [], [], [], []
        stages: dict[str, list[float]] = {}
        slow: dict[str, list[float]] = {}
        for i in range(40):
            if name != "health":  # health's SELECT 1 measures the floor on a warm connection
                connection.close()
            stage_ms.clear()
            sql_each.clear()
            t, c0 = time.perf_counter(), time.process_time()
            with (
                CaptureQueriesContext(connections["default"]) as ctx,  # opens the connection
                connection.execute_wrapper(sql_timer),
            ):
                resp = call(name, i + 5)
            total = 1000 * (time.perf_counter() - t)
            cpus.append(1000 * (time.process_time() - c0))
            if resp.status_code >= 300:
                per[name] = {"error": f"{resp.status_code} {resp.content[:200]!r}"}
                break
            for k in ("connect", "auth", "serialize", "rescore"):
                stages.setdefault(k, []).append(stage_ms.get(k, 0.0))
            totals.append(total)
            nq.append(len(ctx.captured_queries))
            sqls.append(sum(ms for _, ms in sql_each))
            for sql, ms in sql_each:
                slow.setdefault(_shape(sql), []).append(ms)
        else:
            top = sorted(
                ((statistics.fmean(v), len(v) / len(totals), k) for k, v in slow.items()), reverse=True
            )
            per[name] = {
                "total_ms": statistics.median(totals),
                "cpu_ms": statistics.median(cpus),
                "sql_ms": statistics.median(sqls),
                "queries": statistics.median(nq),
                "stages": {k: statistics.fmean(v) for k, v in stages.items()},
                "top": [(round(ms, 2), round(times_per, 2), sql[:300]) for ms, times_per, sql in top[:6]],
            }
    out["endpoints"] = per
    for owner, attr, original in patches:
        setattr(owner, attr, original)

    import cProfile
    import io
    import pstats

    profiles = {}
    for name in ("list", "get", "create"):
        prof = cProfile.Profile()
        prof.enable()
        for i in range(20):
            connection.close()  # as in the server: a new connection per request
            call(name, 100 + i)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("cumulative").print_stats(PROFILE_FILTER, 28)
        text = buf.getvalue()
        profiles[name] = text[text.find("   ncalls") :].rstrip() if "   ncalls" in text else text
    out["profiles"] = profiles

    # EXPLAIN ANALYZE of the list page and its count, and of the search SQL.
    from memory import search as search_mod
    from memory import search_query, selectors

    qs = selectors.entry_list(ws, sort="importance")
    plans: dict[str, str] = {}
    with connection.cursor() as c:
        page_sql, page_params = qs[:20].query.sql_with_params()
        plans["list page (ORDER BY importance LIMIT 20)"] = _explain(c, page_sql, page_params)
        count_sql, count_params = qs.order_by().values("pk").query.sql_with_params()
        plans["list count (SELECT count(*) …)"] = _explain(
            c, f"SELECT count(*) FROM ({count_sql}) s", count_params
        )
        by_count = []
        for q in queries[:200]:
            parsed = search_query.parse_query(q)
            if not parsed.groups:
                continue
            c.execute(
                "SELECT count(*) FROM memory_entry WHERE search_vector @@ "
                "websearch_to_tsquery('english', %s) "
                "AND workspace_id = %s AND is_latest AND status IN ('active', 'stale')",
                [parsed.websearch(), ws.pk],
            )
            by_count.append((c.fetchone()[0], q))
        by_count.sort()
        if by_count:
            for label, (cnt, q) in (
                ("median", by_count[len(by_count) // 2]),
                ("p95", by_count[min(len(by_count) - 1, int(0.95 * len(by_count)))]),
            ):
                # The statement search() ran last for this query (the ranking: broad or exact),
                # as it sent it (values inlined), explained again.
                with CaptureQueriesContext(connection) as ran:
                    result = search_mod.search(ws, q, limit=20)
                path = (
                    f"broad: its {result.ranked} most important matches ranked"
                    if (result.ranked or 0) < result.count or not result.count_exact
                    else "every match ranked"
                )
                plans[f"search, a query with {label} match count: q={q!r} ({cnt:,} matches; {path})"] = (
                    _explain(c, ran.captured_queries[-1]["sql"], None)
                )
            out["search_match_counts"] = [cnt for cnt, _ in by_count]
    out["plans"] = plans

    # The shipped search() alone, one query at a time, split by whether the query was broad.
    broad = f"broad (the {search_mod.RANK_CAP} most important ranked)"
    sql_times: dict[str, list[float]] = {"all queries": [], "exact ranking": [], broad: []}
    per_query: list[tuple[float, str, int, int, bool]] = []
    for q in [q for q in queries[:SEARCH_DIAGNOSE_QUERIES] if search_query.parse_query(q).groups]:
        t = time.perf_counter()
        result = search_mod.search(ws, q, limit=20)
        ms = 1000 * (time.perf_counter() - t)
        sql_times["all queries"].append(ms)
        is_broad = (result.ranked or 0) < result.count or not result.count_exact
        sql_times[broad if is_broad else "exact ranking"].append(ms)
        per_query.append((ms, q, result.count, result.ranked or 0, is_broad))
    out["search_sql"] = {k: sorted(v) for k, v in sql_times.items() if v}
    out["search_slowest"] = sorted(per_query, reverse=True)[:10]
    # The two ways to rank, per unit of work (least-squares lines, so that a query's fixed cost
    # is not counted per unit): an exact query per match ranked, a broad one per entry walked
    # (expected RANK_CAP x visible / matches: the matches are spread over the walk).
    visible = search_mod._visible(ws.pk, ["active", "stale"])
    exact = [(n, ms) for ms, _, n, _, b in per_query if not b and n >= 500]
    walked = [(search_mod.RANK_CAP * visible / n, ms) for ms, _, n, _, b in per_query if b and n]
    try:  # a line needs two distinct x values at least
        rank = statistics.linear_regression(*zip(*exact, strict=True))
        walk = statistics.linear_regression(*zip(*walked, strict=True))
    except (statistics.StatisticsError, TypeError, ValueError):
        rank = walk = None
    if rank and walk:
        out["search_costs"] = {
            "exact": (rank.intercept, 1000 * rank.slope, len(exact)),
            "walk": (walk.intercept, 1000 * walk.slope, len(walked)),
            "visible": visible,
            "break_even": math.sqrt(search_mod.RANK_CAP * visible * max(walk.slope, 0) / rank.slope)
            if rank.slope > 0
            else float("nan"),
            "threshold": search_mod.broad_threshold(visible),
            "walk_ratio": rank.slope / walk.slope if walk.slope > 0 else float("nan"),
            "walk_ratio_assumed": search_mod.WALK_RATIO,
        }
    connection.close()
    return out


SEARCH_DIAGNOSE_QUERIES = 400


PROFILE_FILTER = (
    r"\((create_entry|list_entries|get_entry|entry_create|entry_detail|_page|_rescore|refresh_scores|"
    r"importance_expr|retention_expr|record_event|tags_for_names|_check_contradictions|refresh_from_db|"
    r"authenticate|_result_to_response|_run_authentication|execute_sql|as_sql|wait|connect|"
    r"ensure_connection|validate_python|count|prefetch_related_objects|resolve_tags|importance_breakdown)\)"
)


def _shape(sql: str) -> str:
    import re

    sql = re.sub(r'"s\d+_x\d+"', "?", sql)  # savepoint names
    sql = re.sub(r"'[^']*'", "?", sql)
    sql = re.sub(r"\b\d+(\.\d+)?\b", "?", sql)
    sql = re.sub(r"\(\s*\?(\s*,\s*\?)+\s*\)", "(…)", sql)
    return " ".join(sql.split())


def _explain(c: Any, sql: str, params: Any) -> str:
    c.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
    return "\n".join(r[0] for r in c.fetchall())


# --- report ------------------------------------------------------------------------------------


def fmt_load(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


def table(results: list[dict[str, Any]]) -> str:
    labels = dict(SCENARIOS)
    lines = [
        "| scenario | requests | errors | req/s | mean ms | p50 ms | p95 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {labels[r['name']]} | {r['requests']:,} | {r['errors']} | {r['rps']:,.0f} | "
            f"{r['mean_ms']:.1f} | "
            f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} |"
        )
    return "\n".join(lines)


def _passes(r: dict[str, Any], metric: str, value: float) -> bool:
    """A scenario's result meets a target: p95 at most ``value`` ms, or at least ``value``
    requests/s; with no errors either way."""
    got_ok = r["p95_ms"] <= value if metric == "p95" else r["rps"] >= value
    return got_ok and r["errors"] == 0


def target_lines(results: list[dict[str, Any]], concurrency: int, cores: int) -> list[str]:
    """The targets at one concurrency. A p95 target is judged where requests do not queue for
    the CPUs (concurrency ≤ cores); above that the line says what the queue adds instead."""
    by = {r["name"]: r for r in results}
    out = []
    for name, metric, value, label in TARGETS:
        r = by.get(name)
        if r is None:
            out.append(f"- {label}: not run")
            continue
        if metric == "p95" and concurrency > cores:
            queue_ms = 1000.0 * concurrency / r["rps"] if r["rps"] else float("nan")
            out.append(
                f"- {label}: p95 {r['p95_ms']:.1f} ms, {r['errors']} errors — not judged here: "
                f"{concurrency} requests in flight on {cores} CPUs queue (mean latency ≈ "
                f"concurrency / throughput = {queue_ms:.1f} ms); latency targets are judged at "
                f"concurrency ≤ {cores}"
            )
        elif metric == "p95":
            got, ok = r["p95_ms"], _passes(r, metric, value)
            out.append(f"- {label}: p95 {got:.1f} ms, {r['errors']} errors → **{'PASS' if ok else 'FAIL'}**")
        else:
            got, ok = r["rps"], _passes(r, metric, value)
            out.append(
                f"- {label}: {got:,.0f} requests/s, {r['errors']} errors → **{'PASS' if ok else 'FAIL'}**"
            )
    return out


def verdict_lines(runs: list[dict[str, Any]], cores: int) -> list[str]:
    """One verdict per target over the concurrency levels run: a p95 target at the highest
    concurrency that does not exceed the cores (the worst latency without a queue for the
    CPUs), a throughput target at the level that reached the most."""
    out = []
    judged = [r for r in runs if r["concurrency"] <= cores]
    for name, metric, value, label in TARGETS:
        if metric == "p95":
            if not judged:
                out.append(f"- {label}: not judged (no run at concurrency ≤ {cores})")
                continue
            run_ = max(judged, key=lambda r: r["concurrency"])
            r = next((x for x in run_["results"] if x["name"] == name), None)
            if r is None:
                out.append(f"- {label}: not run")
                continue
            ok = _passes(r, metric, value)
            out.append(
                f"- {label}: p95 {r['p95_ms']:.1f} ms at concurrency {run_['concurrency']} → "
                f"**{'PASS' if ok else 'FAIL'}**"
            )
        else:
            found = [
                (x["rps"], run_["concurrency"], x)
                for run_ in runs
                for x in run_["results"]
                if x["name"] == name
            ]
            if not found:
                out.append(f"- {label}: not run")
                continue
            rps, conc, best = max(found, key=lambda f: f[0])
            out.append(
                f"- {label}: {rps:,.0f} requests/s at concurrency {conc} (the most of "
                f"{', '.join(str(c) for _, c, _ in found)}) → "
                f"**{'PASS' if _passes(best, metric, value) else 'FAIL'}**"
            )
    return out


def details_table(results: list[dict[str, Any]], cores: int) -> list[str]:
    labels = dict(SCENARIOS)
    L = [
        "| scenario | server CPU ms / request | server workers CPU | machine CPU busy | driver CPU "
        "| statuses |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        L.append(
            f"| {labels[r['name']]} | {r.get('server_cpu_ms_per_request', float('nan')):.2f} | "
            f"{r.get('server_cpu_pct', float('nan')):.0f} % | {r['machine_cpu_pct']:.0f} % of "
            f"{cores * 100} % | "
            f"{r['driver_cpu_pct']:.0f} % | {', '.join(f'{k}: {v}' for k, v in r['statuses'].items())} |"
        )
    for r in results:
        if r["error_samples"]:
            L.append(
                f"\nErrors of {labels[r['name']]}: " + "; ".join(f"`{e[:200]}`" for e in r["error_samples"])
            )
    return L


def search_buckets(results: list[dict[str, Any]]) -> list[str]:
    srch = next((r for r in results if r["name"] == "search"), None)
    if not srch or not srch["counts"]:
        return []
    from memory.search import RANK_CAP

    L = [
        "",
        "Search latency by how many entries matched the query (by the response's count: exact, or "
        "PostgreSQL's estimate for a broad query, which ranks only its "
        f"{RANK_CAP} most important matches):",
        "",
        "| matches | requests | p50 ms | p95 ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    buckets = [(0, 100), (100, 1_000), (1_000, 10_000), (10_000, 100_000), (100_000, 10**12)]
    for lo, hi in buckets:
        xs = sorted(dt for dt, cnt in srch["counts"] if lo <= cnt < hi)
        if xs:
            label = f"{lo:,}–{hi - 1:,}" if hi < 10**12 else f"≥ {lo:,}"
            L.append(f"| {label} | {len(xs):,} | {1000 * _pct(xs, 0.5):.1f} | {1000 * _pct(xs, 0.95):.1f} |")
    cnts = sorted(cnt for _, cnt in srch["counts"])
    L.append(
        "\nMatch counts of the sent queries (as the responses report them): "
        f"median {_pct(cnts, 0.5):,}, p95 {_pct(cnts, 0.95):,}, max {cnts[-1]:,} "
        "(1–3 words from the generator's vocabulary, Zipf-weighted, or an error name)."
    )
    return L


def render(**kw: Any) -> str:
    args, gen, facts, passes = kw["args"], kw["gen"], kw["facts"], kw["passes"]
    cores = os.cpu_count() or 1
    ls, le = kw["load_start"], kw["load_end"]
    env = kw["env"]
    shown_env = [
        f"{k}={'<random>' if k == 'SECRET_KEY' else env[k]}"
        for k in (
            "DATABASE_URL",
            "DJANGO_DEBUG",
            "SECRET_KEY",
            "ALLOWED_HOSTS",
            "API_RATE_LIMIT_PER_MINUTE",
            "LOG_LEVEL",
        )
    ]
    shown_env += list(args.server_env)
    cmd = ".venv/bin/python " + shlex.join(passes[0][2]["cmd"][1:])
    conn_age = (
        "as set above"
        if any(e.startswith("DB_CONN_MAX_AGE=") for e in args.server_env)
        else "unset: each request takes a connection from the psycopg pool and hands it back "
        "(the settings default)"
    )
    repro = ".venv/bin/python bench/api.py " + shlex.join(
        [
            "--database-url",
            args.database_url,
            "--entries",
            str(args.entries),
            "--duration",
            f"{args.duration:g}",
            "--requests",
            str(args.requests),
            "--concurrency",
            str(args.concurrency),
            "--workers",
            str(args.workers),
        ]
        + [x for e in args.server_env for x in ("--server-env", e)]
        + [x for e in args.compare_env for x in ("--compare-env", e)]
        + (
            ["--wait-quiet", f"{args.wait_quiet:g}", "--quiet-load", f"{args.quiet_load:g}"]
            if args.wait_quiet
            else []
        )
        + (["--out", str(args.out)] if Path(args.out).resolve() != DEFAULT_OUT.resolve() else [])
    )
    if gen.reused:
        gen_line = (
            "reused: generated earlier by `bench/datagen.py`"
            + (f" in **{gen.seconds:.0f} s**" if gen.seconds else "")
            + " (`--regenerate` rebuilds it)"
        )
    else:
        gen_line = (
            f"generated in **{gen.seconds:.0f} s** ("
            + ", ".join(f"{k} {v:.0f} s" for k, v in gen.phases.items())
            + ")"
        )
    loads = [ls, le] + [r["load_before"] for _, _, p in passes for r in p["runs"]]
    busy = max(x[0] for x in loads) > 0.5 * cores
    L: list[str] = []
    L += [
        "# API benchmark",
        "",
        f"Written by `bench/api.py` on {kw['started']:%Y-%m-%d %H:%M} UTC "
        f"(the run took {(kw['finished'] - kw['started']).total_seconds() / 60:.1f} min).",
        "",
        "## Setup",
        "",
        f"- machine: {cpu_model()}, {cores} logical CPUs, {ram_gib():.0f} GiB RAM; {platform.platform()}; "
        f"Python {platform.python_version()}; yardstick (`bench/machine.py`: a 10,000,000-step "
        f"Python loop, best of 3, before the load) {kw['loop_seconds']:.2f} s of CPU — compare it "
        "before comparing two reports' numbers",
        f"- database: PostgreSQL {facts.get('version', '?')} on the same machine (loopback TCP), "
        f"server settings shared_buffers {facts.get('shared_buffers')}, work_mem "
        f"{facts.get('work_mem')}, effective_cache_size {facts.get('effective_cache_size')}"
        + (" (PostgreSQL's defaults)" if facts.get("shared_buffers") == "128MB" else ""),
        f"- data: **{gen.entries:,} entries** in workspace `{gen.slug}`, {gen_line}; latest "
        "versions by status: "
        + ", ".join(f"{k} {v:,}" for k, v in facts.get("statuses", {}).items())
        + f". memory_entry holds {facts.get('table_rows', 0):,} rows in all (table "
        f"{facts.get('table_size')}, "
        f"its indexes {facts.get('indexes_size')}, of which the GIN {facts.get('gin_size')})",
        f"- server: {args.workers} processes, each `{cmd}` with a port of its own (each its own process "
        "group); the load generator spreads its connections over them round-robin",
        f"- server environment: `{' '.join(shown_env)}`; no `REDIS_URL`; `DB_CONN_MAX_AGE` {conn_age}",
        f"- load: a second process (`bench/api.py --drive`: asyncio + uvloop, raw HTTP/1.1) over "
        f"**{' and '.join(map(str, args.concurrency_levels))} keep-alive connections**; per "
        f"scenario a warm-up (≤ {args.warmup_requests} requests, "
        f"≤ {args.warmup_seconds:g} s, not counted), then ≤ {args.requests:,} requests and ≤ "
        f"{args.duration:g} s, "
        "whichever comes first. Any non-2xx answer counts as an error. The driver shares the "
        f"{cores} CPUs with "
        f"the server and PostgreSQL.",
        f"- load average (1/5/15 min): at start {fmt_load(ls)}, at end {fmt_load(le)}"
        + "".join(
            f"; before the load{(' of ' + label) if label else ''} at concurrency {r['concurrency']} "
            f"{fmt_load(r['load_before'])}"
            for label, _, p in passes
            for r in p["runs"]
        )
        + (
            f" — **other work was running on the machine (1-min load above {0.5 * cores:g}): the numbers are "
            f"pessimistic**"
            if busy
            else " (no other significant load)"
        ),
    ]
    if kw.get("waited"):
        L.append(f"- waited {kw['waited'][0]:.0f} s for the load average to drop below {args.quiet_load:g}")
    if passes:
        L += [
            "",
            "## Verdict",
            "",
            "Settings as deployed. A p95 target is judged at the highest concurrency that does not "
            f"exceed the {cores} CPUs: beyond it requests wait for each other (Little's law: mean "
            "latency ≈ concurrency / throughput), and p95 measures that queue, shown below for each "
            "level. The throughput target is judged at the level that reached the most.",
            "",
            *verdict_lines(passes[0][2]["runs"], cores),
        ]
    for i, (label, extra, p) in enumerate(passes):
        title = "Results" if i == 0 else f"Results with {label}"
        L += ["", f"## {title}", ""]
        if i == 0 and len(passes) > 1:
            L += ["Settings as deployed by the README (the same server, only the environment above).", ""]
        if i > 0:
            pcmd = ".venv/bin/python " + shlex.join(p["cmd"][1:])
            L += [
                f"The same scenarios and data; server `{pcmd}`"
                + (f", environment plus `{' '.join(extra)}`" if extra else "")
                + ".",
                "",
            ]
        for run_ in p["runs"]:
            res = run_["results"]
            if len(p["runs"]) > 1 or len(args.concurrency_levels) > 1:
                L += [f"### Concurrency {run_['concurrency']}", ""]
            L += [
                table(res),
                "",
                "Latencies are client-side (request written → response fully read), in milliseconds.",
                "",
                "Targets:",
                "",
                *target_lines(res, run_["concurrency"], cores),
                "",
            ]
            L += details_table(res, cores)
            L += search_buckets(res)
            L.append("")
    d = kw["diagnosis"]
    if d:
        L += render_diagnosis(d)
    L += [
        "",
        "## Reproduce",
        "",
        "```sh",
        "createdb -h 127.0.0.1 -U postgres bench_api   # once",
        repro,
        "```",
        "",
    ]
    return "\n".join(L)


def render_diagnosis(d: dict[str, Any]) -> list[str]:
    L = [
        "",
        "## Where the time goes (in-process, one request at a time)",
        "",
        "Django test client in the benchmark process with the server's settings, 40 requests per "
        "endpoint after "
        "5 warm-ups; wall and CPU are medians, the stage columns means. SQL time is the wall time of the "
        "statements (Django execute wrapper; psycopg receives the whole result in execute); Python "
        "CPU is this process's CPU time; each request takes its database connection from the pool and "
        "hands it back, as the server does. The stages are the wall "
        "time inside the database connect (a pool checkout), the bearer-key authentication (the first "
        "query of the request), the response serialisation "
        "(django-ninja + pydantic) and the write's score refresh (`new_entries.rescore_written`). "
        f"Taking a connection from the pool (Django's connect + a first query) costs "
        f"**{d['connect_ms']:.1f} ms** (median of 30), once per request that touches the database.",
        "",
        "| endpoint | wall ms | Python CPU ms | SQL ms | SQL statements | connect ms | auth ms "
        "| serialize ms | score refresh ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, label in SCENARIOS:
        e = d["endpoints"].get(name)
        if not e:
            continue
        if "error" in e:
            L.append(f"| {label} | error: {e['error']} | | | | | | | |")
            continue
        st = e["stages"]
        L.append(
            f"| {label} | {e['total_ms']:.1f} | {e['cpu_ms']:.1f} | {e['sql_ms']:.1f} | {e['queries']:g} | "
            f"{st['connect']:.1f} | {st['auth']:.1f} | {st['serialize']:.1f} | {st['rescore']:.1f} |"
        )
    for name, label in SCENARIOS:
        e = d["endpoints"].get(name)
        if not e or "error" in e or not e["top"]:
            continue
        L += [
            "",
            f"<details><summary>{label}: statements by mean time (ms, times per request, SQL)</summary>",
            "",
            "```",
        ]
        L += [f"{ms:8.2f} ms ×{per:g}  {sql}" for ms, per, sql in e["top"]]
        L += ["```", "</details>"]
    for name, text in d.get("profiles", {}).items():
        L += [
            "",
            f"<details><summary>cProfile of {dict(SCENARIOS)[name]} (20 requests, by cumulative "
            "time)</summary>",
            "",
            "```",
            text,
            "```",
            "</details>",
        ]
    if d.get("search_sql"):
        L += [
            "",
            f"`memory.search.search()` alone, one query at a time (the first {SEARCH_DIAGNOSE_QUERIES} "
            "queries of the "
            "benchmark's mix, limit 20, in ms; 'broad' are the queries that ranked only their most "
            "important matches, found by walking the importance index):",
            "",
            "| variant | queries | p50 | p90 | p95 | p99 | max |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for label, xs in d["search_sql"].items():
            L.append(
                f"| {label} | {len(xs)} | {_pct(xs, 0.5):.1f} | {_pct(xs, 0.9):.1f} | {_pct(xs, 0.95):.1f} | "
                f"{_pct(xs, 0.99):.1f} | {xs[-1]:.1f} |"
            )
    if d.get("search_slowest"):
        L += [
            "",
            "The slowest of them:",
            "",
            "| ms | query | matches | ranked | how |",
            "| ---: | --- | ---: | ---: | --- |",
        ]
        for ms, q, n, ranked, is_broad in d["search_slowest"]:
            L.append(f"| {ms:.1f} | `{q}` | {n:,} | {ranked:,} | {'broad' if is_broad else 'exact'} |")
    if c := d.get("search_costs"):
        (ea, eb, en), (wa, wb, wn) = c["exact"], c["walk"]
        L += [
            "",
            f"Per unit of work (least-squares lines over those queries): exact ranking {ea:.1f} ms + "
            f"{eb:.2f} µs per match ({en} exact queries with ≥ 500 matches); the broad walk "
            f"{wa:.1f} ms + {wb:.2f} µs per entry walked ({wn} broad queries; entries walked "
            f"estimated as RANK_CAP × {c['visible']:,} visible / matches). A match ranked costs "
            f"{c['walk_ratio']:.1f} entries walked (`WALK_RATIO` assumes {c['walk_ratio_assumed']}); the "
            f"two ways cost the same at sqrt(RANK_CAP × visible × walk / rank) ≈ "
            f"{c['break_even']:,.0f} matches, and `broad_threshold` is {c['threshold']:,}.",
        ]
    for label, plan in d.get("plans", {}).items():
        L += [
            "",
            f"<details><summary>EXPLAIN ANALYZE — {label}</summary>",
            "",
            "```",
            plan,
            "```",
            "</details>",
        ]
    return L


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)  # the load-generator process
    parser.add_argument("--database-url", default=DEFAULT_DB)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per scenario (default 20)")
    parser.add_argument("--requests", type=int, default=5000, help="requests per scenario (default 5000)")
    parser.add_argument(
        "--concurrency",
        default="2,8",
        help="keep-alive connections of the load generator; a comma-separated list runs each (default 2,8)",
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="uvicorn server processes, one port each (default 2)"
    )
    parser.add_argument("--warmup-seconds", type=float, default=2.0)
    parser.add_argument("--warmup-requests", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--regenerate", action="store_true", help="regenerate the data even if present")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the server (e.g. DB_CONN_MAX_AGE=60)",
    )
    parser.add_argument(
        "--compare-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run every scenario a second time with this extra server environment",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before the load, wait up to SECONDS for the load average to drop",
    )
    parser.add_argument(
        "--quiet-load", type=float, default=1.0, help="threshold of --wait-quiet (default 1.0)"
    )
    parser.add_argument("--only", help="comma-separated scenarios to run (health,list,get,search,create)")
    parser.add_argument("--no-diagnose", action="store_true", help="skip the in-process diagnostics")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="markdown report to write")
    args = parser.parse_args()
    args.concurrency_levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    if args.drive:
        return drive(args.drive)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
