"""Benchmark the MCP endpoint's tools next to their JSON API twins, in the same run, on
PostgreSQL holding N generated entries.

    .venv/bin/python bench/mcp.py [--database-url postgres://postgres@127.0.0.1:5432/bench_mcp]
        [--entries 1000000] [--requests 300] [--rounds 5] [--concurrency 2] [--workers 2]
        [--out bench/reports/mcp.md] [--regenerate]

1. ``manage.py migrate``, then ``bench/datagen.py`` makes sure workspace ``bench-<N>`` holds N
   generated entries (reused when it already does; what an earlier run stored is removed
   first), and an agent API key is made.
2. W uvicorn processes (``python -m uvicorn config.asgi:application --loop uvloop --http
   httptools --no-access-log``, the lifespan on by default: the MCP session manager runs in it)
   on ports of their own, the load spread round-robin, with ``DJANGO_DEBUG=0`` and
   ``API_RATE_LIMIT_PER_MINUTE=0`` as in bench/api.py.
3. A second process (``bench/mcp.py --drive PLAN``) sends raw HTTP/1.1 over keep-alive loopback
   connections at a fixed concurrency: for each pair, the JSON API request and the MCP
   ``tools/call`` (hand-written JSON-RPC of the 2026-07-28 protocol, as the SDK's client sends
   it: no session, one POST per call) with the same arguments —

   | pair | JSON API | MCP tool |
   |---|---|---|
   | search | ``GET /search?q=Q&limit=10`` | ``memory_search {"query": Q, "limit": 10}`` |
   | recent | ``GET /entries?sort=recent&limit=20`` | ``memory_recent {"limit": 20}`` |
   | store | ``POST /entries`` (datagen's agent writes, a fifth link) | ``memory_store`` (alike) |

   The six scenarios run in R interleaved rounds (API, MCP, API, MCP, ...), so a machine that
   slows down meanwhile (it is shared) weighs on both sides alike; every answer is checked (a
   non-2xx, or an MCP ``isError``, counts as an error). Percentiles are over all rounds.

The report gives the date, the machine (bench/machine.py), the load average at start and end,
PostgreSQL's version, N, p50/p95/p99 and requests/s per scenario, each round's p95, and the
target: each MCP tool's p95 within 1.5x of its JSON API twin's at concurrency 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from machine import cpu_model, python_loop_seconds, ram_gib  # bench/machine.py

from api import (  # bench/api.py: the same server settings and raw HTTP/1.1 client
    Conn,
    _descendants,
    _pct,
    _proc_cpu_seconds,
    fmt_load,
    free_port,
    loadavg,
    log,
    server_env,
    stop_server,
    wait_health,
)

ROOT = Path(__file__).resolve().parent.parent
# The project first (bench/maintenance.py would shadow its ``maintenance`` package), bench/ last.
sys.path[:] = [
    str(ROOT),
    *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"),
    str(ROOT / "bench"),
]

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/bench_mcp"
DEFAULT_OUT = ROOT / "bench" / "reports" / "mcp.md"
# Everything from this line on in an existing report (a hand-written analysis) is kept on rewrite.
ANALYSIS_MARK = "<!-- analysis: kept when bench/mcp.py rewrites this report -->"
PROTOCOL = "2026-07-28"
UVICORN = [
    *(sys.executable, "-m", "uvicorn", "config.asgi:application"),
    *("--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"),
]
RATIO_TARGET = 1.5
PAIRS = [
    ("search", "GET /search?q=…&limit=10", "memory_search"),
    ("recent", "GET /entries?sort=recent&limit=20", "memory_recent"),
    ("store", "POST /entries", "memory_store"),
]
META = {
    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
    "io.modelcontextprotocol/clientInfo": {"name": "memory-steward-bench", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


# --- the load generator (second process) ---------------------------------------------------------


def _head(method: str, path: str, host: str, key: str, extra: list[str], body: bytes | None) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}",
        "X-Forwarded-Proto: https",  # as from the TLS-terminating proxy of a production deployment
        "User-Agent: memory-steward-bench",
        f"Authorization: Bearer {key}",
        *extra,
    ]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def mcp_call(host: str, key: str, tool: str, arguments: dict[str, Any], call_id: int) -> bytes:
    body = {
        "jsonrpc": "2.0",
        "id": call_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": META},
    }
    extra = [
        "Accept: application/json, text/event-stream",
        f"MCP-Protocol-Version: {PROTOCOL}",
        "Mcp-Method: tools/call",
        f"Mcp-Name: {tool}",
    ]
    return _head("POST", "/mcp", host, key, extra, json.dumps(body).encode())


def requests_for(plan: dict[str, Any], name: str, side: str) -> list[bytes]:
    host, key = f"127.0.0.1:{plan['ports'][0]}", plan["key"]
    accept = ["Accept: application/json"]
    n = plan["requests"] + 20
    if name == "search":
        queries = plan["queries"]
        if side == "api":
            return [
                _head("GET", f"/api/v1/search?q={urllib.parse.quote(q)}&limit=10", host, key, accept, None)
                for q in queries[:n]
            ]
        return [
            mcp_call(host, key, "memory_search", {"query": q, "limit": 10}, i)
            for i, q in enumerate(queries[:n])
        ]
    if name == "recent":
        if side == "api":
            return [_head("GET", "/api/v1/entries?sort=recent&limit=20", host, key, accept, None)]
        return [mcp_call(host, key, "memory_recent", {"limit": 20}, i) for i in range(n)]
    bodies = plan["bodies"][side]
    if side == "api":
        return [_head("POST", "/api/v1/entries", host, key, accept, json.dumps(b).encode()) for b in bodies]
    return [mcp_call(host, key, "memory_store", b, i) for i, b in enumerate(bodies)]


def _failed(side: str, status: int, body: bytes) -> str | None:
    if not 200 <= status < 300:
        return f"{status}: {body[:200].decode('utf-8', 'replace')}"
    if side == "mcp":
        answer = json.loads(body)
        result = answer.get("result") or {}
        if "error" in answer or result.get("isError"):
            return json.dumps(answer)[:300]
    return None


async def run_scenario(plan: dict[str, Any], name: str, side: str, raw: list[bytes]) -> dict[str, Any]:
    ports, conc = plan["ports"], plan["concurrency"]
    conns = [Conn("127.0.0.1", ports[i % len(ports)]) for i in range(conc)]
    for c in conns:
        await c.open()
    lat: list[float] = []
    errors: list[str] = []
    state = {"issued": 0}
    total = plan["requests"]

    async def worker(conn: Conn) -> None:
        while state["issued"] < total:
            i = state["issued"]
            state["issued"] += 1
            t0 = time.perf_counter()
            status, body = await conn.request(raw[i % len(raw)])
            lat.append(time.perf_counter() - t0)
            problem = _failed(side, status, body)
            if problem is not None:
                errors.append(problem)

    server_pids = [pid for root in plan["server_pids"] for pid in _descendants(root)]
    cpu0 = _proc_cpu_seconds(server_pids)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - t0
    cpu1 = _proc_cpu_seconds(server_pids)
    for c in conns:
        c.close()
    return {
        "name": name,
        "side": side,
        "latencies": lat,
        "errors": len(errors),
        "error_samples": errors[:3],
        "elapsed": elapsed,
        "server_cpu_ms": 1000.0 * (cpu1 - cpu0),
    }


def drive(plan_path: Path) -> int:
    plan = json.loads(plan_path.read_text())
    import uvloop

    uvloop.install()
    rounds: list[list[dict[str, Any]]] = []
    for r in range(plan["rounds"] + 1):  # round 0 warms up and is not counted
        done = []
        for name, _api, _tool in PAIRS:
            for side in ("api", "mcp"):
                raw = requests_for(plan, name, side)
                offset = (r * plan["requests"]) % max(1, len(raw))
                raw = raw[offset:] + raw[:offset]  # each round other queries and bodies
                res = asyncio.run(run_scenario(plan, name, side, raw))
                lat = sorted(res["latencies"])
                print(
                    f"[drive] round {r} {name} {side}: p50 {1000 * _pct(lat, 0.5):.1f} "
                    f"p95 {1000 * _pct(lat, 0.95):.1f} ms, {res['errors']} errors",
                    file=sys.stderr,
                    flush=True,
                )
                done.append(res)
        if r:
            rounds.append(done)
    Path(plan["results"]).write_text(json.dumps(rounds))
    return 0


# --- orchestration (first process) -----------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    load_start = loadavg()
    started = datetime.now(UTC)
    loop_seconds = python_loop_seconds()
    log(f"python yardstick: 10M-step loop in {loop_seconds:.2f} s CPU; load {fmt_load(load_start)}")
    env = server_env(args, [])
    for k in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "DJANGO_DEBUG", "SECRET_KEY", "ALLOWED_HOSTS"):
        os.environ[k] = env[k]
    os.environ.pop("REDIS_URL", None)
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
        workspace=ws, name=f"bench mcp {started:%Y-%m-%d %H:%M}", role="agent"
    )
    with connection.cursor() as c:
        c.execute(
            "SELECT id FROM memory_entry TABLESAMPLE SYSTEM (%s) WHERE workspace_id = %s AND is_latest "
            "AND status IN ('active', 'stale') LIMIT 2000",
            [min(100.0, max(0.5, 100.0 * 20000 / max(1, args.entries))), ws.pk],
        )
        link_ids = [r[0] for r in c.fetchall()]
        c.execute("SELECT version()")
        pg_version = c.fetchone()[0].split(",")[0]
    connection.close()
    tg = datagen.TextGen(seed=args.seed + 7)
    n = args.requests * (args.rounds + 1) + 20
    queries = [tg.query() for _ in range(n)]
    bodies = datagen.TextGen(seed=args.seed + 1000)
    api_bodies = [bodies.api_body(link_ids) for _ in range(n)]
    mcp_bodies = [bodies.api_body(link_ids) for _ in range(n)]

    tmp = Path(tempfile.mkdtemp(prefix="bench-mcp-"))
    ports = [free_port() for _ in range(args.workers)]
    cmds = [[*UVICORN[:4], "--port", str(p), *UVICORN[4:]] for p in ports]
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
        for cmd in cmds
    ]
    try:
        for port, proc in zip(ports, procs, strict=True):
            wait_health(port, proc)
        plan = {
            "ports": ports,
            "key": raw_key,
            "concurrency": args.concurrency,
            "requests": args.requests,
            "rounds": args.rounds,
            "queries": queries,
            "bodies": {"api": api_bodies, "mcp": mcp_bodies},
            "server_pids": [p.pid for p in procs],
            "results": str(tmp / "results.json"),
        }
        (tmp / "plan.json").write_text(json.dumps(plan))
        log(f"{len(PAIRS) * 2} scenarios x {args.rounds} rounds (+1 warm-up), concurrency {args.concurrency}")
        subprocess.run([sys.executable, __file__, "--drive", str(tmp / "plan.json")], cwd=ROOT, check=True)
        rounds = json.loads((tmp / "results.json").read_text())
    finally:
        for proc in procs:
            stop_server(proc)
    load_end = loadavg()
    report = render(
        args=args,
        started=started,
        finished=datetime.now(UTC),
        entries=gen,
        pg_version=pg_version,
        rounds=rounds,
        load_start=load_start,
        load_end=load_end,
        loop_seconds=loop_seconds,
        server_cmd=".venv/bin/python " + shlex.join(cmds[0][1:]),
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_file() and ANALYSIS_MARK in (old := out.read_text()):
        report = report.rstrip("\n") + "\n\n" + old[old.index(ANALYSIS_MARK) :]
    out.write_text(report)
    print(report)
    return 0


def summarise(rounds: list[list[dict[str, Any]]]) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for done in rounds:
        for res in done:
            row = found.setdefault(
                (res["name"], res["side"]),
                {"lat": [], "errors": 0, "elapsed": 0.0, "cpu_ms": 0.0, "round_p95": [], "samples": []},
            )
            row["lat"] += res["latencies"]
            row["errors"] += res["errors"]
            row["elapsed"] += res["elapsed"]
            row["cpu_ms"] += res["server_cpu_ms"]
            row["round_p95"].append(1000 * _pct(sorted(res["latencies"]), 0.95))
            row["samples"] += res["error_samples"]
    for row in found.values():
        lat = sorted(row["lat"])
        row.update(
            n=len(lat),
            p50=1000 * _pct(lat, 0.5),
            p95=1000 * _pct(lat, 0.95),
            p99=1000 * _pct(lat, 0.99),
            mean=1000 * statistics.fmean(lat),
            rps=len(lat) / row["elapsed"],
            cpu_per_request=row["cpu_ms"] / max(1, len(lat)),
        )
    return found


def render(**kw: Any) -> str:
    args, rows = kw["args"], summarise(kw["rounds"])
    ls, le = kw["load_start"], kw["load_end"]
    lines = [
        "# MCP tools next to their JSON API twins",
        "",
        f"Measured {kw['started']:%Y-%m-%d %H:%M}–{kw['finished']:%H:%M} UTC by `bench/mcp.py` on "
        f"{platform.node()}: {os.cpu_count()} × {cpu_model()}, {ram_gib():.1f} GiB RAM, Linux "
        f"{platform.release()}, Python {platform.python_version()}, {kw['pg_version']}; yardstick "
        f"(bench/machine.py, a 10M-step Python loop) {kw['loop_seconds']:.2f} s CPU.",
        "",
        f"**The machine is shared**: other engineers were running test suites on the same {os.cpu_count()} "
        f"cores during the run (load average {fmt_load(ls)} at start, {fmt_load(le)} at the end). "
        "Absolute numbers are therefore high and noisy; the API and MCP scenarios were interleaved "
        "round by round so that the comparison (the ratio) is fair, but a single round's numbers "
        "swing with whatever else ran then.",
        "",
        f"Data: workspace `{kw['entries'].slug}` with **{args.entries:,} generated entries** "
        "(`bench/datagen.py`), on PostgreSQL. Server: "
        f"{args.workers} × `{kw['server_cmd']}` (one port each, the load round-robin), `DJANGO_DEBUG=0`, "
        "`API_RATE_LIMIT_PER_MINUTE=0`. Load: a second process, raw HTTP/1.1 keep-alive loopback "
        f"connections, concurrency {args.concurrency}, {args.requests} requests per scenario and "
        f"round, {args.rounds} counted rounds after one warm-up round. MCP requests are hand-written "
        "`tools/call` POSTs of the 2026-07-28 protocol (what the SDK's client sends per call; no "
        "session, no handshake per call).",
        "",
        "| pair | side | requests | errors | req/s | p50 ms | p95 ms | p99 ms | server CPU ms/req "
        "| p95 per round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for name, api_label, tool in PAIRS:
        for side, label in (("api", api_label), ("mcp", tool)):
            r = rows[(name, side)]
            per_round = ", ".join(f"{v:.1f}" for v in r["round_p95"])
            lines.append(
                f"| {name} | {label} | {r['n']} | {r['errors']} | {r['rps']:.0f} | {r['p50']:.1f} | "
                f"{r['p95']:.1f} | {r['p99']:.1f} | {r['cpu_per_request']:.1f} | {per_round} |"
            )
        ratio = rows[(name, "mcp")]["p95"] / rows[(name, "api")]["p95"]
        ok = ratio <= RATIO_TARGET and not rows[(name, "mcp")]["errors"] and not rows[(name, "api")]["errors"]
        verdicts.append(
            f"- {tool}: p95 {rows[(name, 'mcp')]['p95']:.1f} ms vs {rows[(name, 'api')]['p95']:.1f} ms "
            f"= **{ratio:.2f}×** (target ≤ {RATIO_TARGET}×): **{'PASS' if ok else 'FAIL'}**"
        )
    lines += [
        "",
        f"Target: each MCP tool's p95 within {RATIO_TARGET}× of its JSON API twin's at concurrency "
        f"{args.concurrency}.",
        "",
        *verdicts,
        "",
    ]
    samples = [s for r in rows.values() for s in r["samples"]]
    if samples:
        lines += ["Error samples:", "", *(f"    {s}" for s in samples[:6]), ""]
    lines += [
        "Reproduce: `.venv/bin/python bench/mcp.py "
        + shlex.join(
            [
                "--database-url",
                args.database_url,
                "--entries",
                str(args.entries),
                "--requests",
                str(args.requests),
                "--rounds",
                str(args.rounds),
                "--concurrency",
                str(args.concurrency),
                "--workers",
                str(args.workers),
            ]
        )
        + "`",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=300, help="per scenario and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    if args.drive:
        return drive(args.drive)
    random.seed(args.seed)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
