"""Many workspaces, many workers: one round of scheduled maintenance drained by 1 and by 2
qcluster workers (issue 16, item 6).

    .venv/bin/python bench/workers.py [--database-url postgres://postgres@127.0.0.1:5432/bench_workers]
        [--workspaces 200] [--entries 5000] [--workers 1,2] [--review-mode apply]
        [--out bench/reports/workers.md]

PostgreSQL only (runs of different workspaces in parallel need a database with more than one
writer). The database named by ``--database-url`` is the template: it is migrated and filled
once with ``--workspaces`` workspaces of ``--entries`` generated entries each
(``bench/datagen.py ensure_many``; reused when it already holds them). Each workspace's policy
gets the review mode asked for, a decay interval of a day and a full run every day, so exactly
one round of each kind is due during the measurement (with the default 10-minute decay
interval a slow drain would legitimately start a second round).

Then, for each worker count, a fresh copy of the template (``CREATE DATABASE … TEMPLATE``) and
a real ``manage.py qcluster`` with ``Q_WORKERS`` workers on it. The benchmark calls the
dispatcher once (every workspace is due for a full run: it enqueues one task each) and,
while the cluster drains them, calls it again every ``--dispatch-every`` seconds as the
cluster's own two-minute schedule does (which runs too), so a dispatcher that enqueued a run
twice would show. It waits until no task is queued and no run is queued or running, then
stops the cluster (SIGTERM) and reads the run rows:

* every due run happened once: one full run per workspace that ran (succeeded, proposed or
  blocked); a workspace due for a full run gets no decay sweep beside it (the full run does
  the decay passes itself), so a sweep in this round would be the same work twice;
* none twice: no workspace with two full runs or two decay sweeps that ran; no failed run;
* the time from the first dispatch to the last run's end, per worker count, and the ratio of
  the two (the target: about half with two workers), with the most runs that overlapped.

The report's section for these sizes is replaced by the next run of the same sizes.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from machine import cpu_model, python_loop_seconds, ram_gib  # bench/machine.py

ROOT = Path(__file__).resolve().parent.parent
# The project first (bench/maintenance.py would shadow its ``maintenance`` package), bench/ last.
sys.path[:] = [
    str(ROOT),
    *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"),
    str(ROOT / "bench"),
]

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/bench_workers"
DEFAULT_OUT = ROOT / "bench" / "reports" / "workers.md"
PYTHON = sys.executable
RAN = ("succeeded", "proposed", "blocked")


def log(msg: str) -> None:
    print(f"[workers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def admin_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(with_database(url, "postgres"), autocommit=True)


def create_database(url: str, name: str, template: str | None = None) -> None:
    from psycopg import sql

    with admin_connect(url) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if template:
            admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        else:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(url: str, name: str) -> None:
    from psycopg import sql

    with admin_connect(url) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def database_exists(url: str, name: str) -> bool:
    with admin_connect(url) as admin:
        return admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DJANGO_DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "bench-workers-" + "x" * 40)
    import django

    django.setup()


def prepare_template(args: argparse.Namespace) -> dict[str, Any]:
    """Migrate and fill the template database; the workspaces' policies as asked."""
    import datagen
    from django.core.management import call_command
    from django.db import connections

    from memory.models import Entry
    from memory.policy_model import MaintenancePolicy

    name = urlsplit(args.database_url).path.lstrip("/")
    if not database_exists(args.database_url, name):
        create_database(args.database_url, name)
    call_command("migrate", verbosity=0, interactive=False)
    t = time.perf_counter()
    ids = datagen.ensure_many(args.workspaces, args.entries, seed=args.seed, progress=log)
    generated = time.perf_counter() - t
    MaintenancePolicy.objects.filter(workspace_id__in=ids).update(
        review_mode=args.review_mode, decay_interval_seconds=86400, maintenance_interval_hours=24
    )
    entries = Entry.objects.filter(workspace_id__in=ids, is_latest=True).count()
    others = Entry.objects.exclude(workspace_id__in=ids).count()
    for conn in connections.all():  # a pool keeps its connections open: close it as well
        conn.close()
        if getattr(conn, "pool", None) is not None:
            conn.close_pool()
    return {"workspace_ids": ids, "entries": entries, "other_entries": others, "generated_s": generated}


def _rows(url: str, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params or []).fetchall()


def start_cluster(url: str, workers: int, backups: Path, log_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "Q_WORKERS": str(workers),
        "DJANGO_DEBUG": "0",
        "BACKUP_DIR": str(backups),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)
    out = log_path.open("wb")
    return subprocess.Popen(
        [PYTHON, str(ROOT / "manage.py"), "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def dispatch(url: str) -> int:
    """One call of the dispatcher on database ``url`` in a child process (the bench process
    holds no Django connection to the run's database); how many tasks it enqueued."""
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "0"}
    env.pop("REDIS_URL", None)
    code = (
        "import django, json; django.setup(); "
        "from maintenance.tasks import dispatch_due_maintenance; "
        "print(json.dumps(len(dispatch_due_maintenance()['enqueued'])))"
    )
    done = subprocess.run(
        [PYTHON, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return int(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, workers: int, template: str) -> dict[str, Any]:
    name = f"{template}_w{workers}"
    log(f"{workers} worker(s): copying the template into {name}")
    t = time.perf_counter()
    create_database(args.database_url, name, template=template)
    copy_s = time.perf_counter() - t
    url = with_database(args.database_url, name)
    work = Path(tempfile.mkdtemp(prefix=f"bench-workers-{workers}-"))
    cluster = start_cluster(url, workers, work / "backups", work / "qcluster.log")
    load_before = os.getloadavg()
    try:
        time.sleep(3)  # the cluster's processes start
        started = datetime.now(UTC)
        t0 = time.perf_counter()
        enqueued = [dispatch(url)]
        log(f"{workers} worker(s): the dispatcher enqueued {enqueued[0]} tasks")
        last_dispatch = time.perf_counter()
        while True:
            if cluster.poll() is not None:
                raise SystemExit(f"the cluster exited ({cluster.returncode}); see {work / 'qcluster.log'}")
            (queued,) = _rows(url, "SELECT count(*) FROM django_q_ormq")[0]
            (active,) = _rows(
                url, "SELECT count(*) FROM maintenance_maintenancerun WHERE status IN ('queued', 'running')"
            )[0]
            elapsed = time.perf_counter() - t0
            if queued == 0 and active == 0 and elapsed > 5:
                break
            if elapsed > args.timeout:
                raise SystemExit(f"not drained after {args.timeout} s ({queued} tasks, {active} runs)")
            if time.perf_counter() - last_dispatch >= args.dispatch_every:
                enqueued.append(dispatch(url))
                last_dispatch = time.perf_counter()
                log(f"{workers} worker(s): {queued} tasks queued, {active} runs active, {elapsed:.0f} s")
            time.sleep(1)
    finally:
        os.killpg(cluster.pid, signal.SIGTERM)
        try:
            cluster.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()
    load_after = os.getloadavg()
    rows = _rows(
        url,
        "SELECT workspace_id, kind, status, started_at, finished_at, error FROM maintenance_maintenancerun "
        "WHERE NOT dry_run AND started_at >= %s ORDER BY started_at",
        [started],
    )
    result = check(rows, args.workspaces)
    ended = max(r[4] for r in rows if r[4] is not None)
    result.update(
        workers=workers,
        wall_s=(ended - started).total_seconds(),
        copy_s=copy_s,
        enqueued=enqueued,
        load=(load_before[0], load_after[0]),
        log=str(work / "qcluster.log"),
    )
    if not args.keep:
        drop_database(args.database_url, name)
    log(
        f"{workers} worker(s): drained in {result['wall_s']:.1f} s; full ran {result['full_ran']}, "
        f"decay ran {result['decay_ran']} / skipped {result['decay_skipped']}, failed {result['failed']}, "
        f"duplicates {result['duplicates']}"
    )
    return result


def check(rows: list[tuple[Any, ...]], workspaces: int) -> dict[str, Any]:
    """What the run rows say: each due run once, none twice."""
    from collections import Counter

    ran: Counter[tuple[int, str]] = Counter()
    skipped: Counter[tuple[int, str]] = Counter()
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    seconds: dict[str, list[float]] = {"full": [], "decay": []}
    for ws, kind, status, started, finished, error in rows:
        statuses[f"{kind} {status}"] += 1
        if status in RAN:
            ran[(ws, kind)] += 1
            if finished is not None:
                seconds.setdefault(kind, []).append((finished - started).total_seconds())
        elif status == "skipped":
            skipped[(ws, kind)] += 1
        if status == "failed":
            errors[(error or "")[:120]] += 1
    spaces = {ws for ws, *_ in rows}
    full_ran = sum(1 for (ws, kind), n in ran.items() if kind == "full")
    decay_ran = sum(1 for (ws, kind), n in ran.items() if kind == "decay")
    decay_skipped = sum(1 for (ws, kind), n in skipped.items() if kind == "decay" and (ws, kind) not in ran)
    duplicates = sorted(f"{ws}:{kind}×{n}" for (ws, kind), n in ran.items() if n > 1)
    events = sorted(
        [(r[3], 1) for r in rows if r[2] in RAN] + [(r[4], -1) for r in rows if r[2] in RAN and r[4]]
    )
    overlap = peak = 0
    for _, step in events:
        overlap += step
        peak = max(peak, overlap)
    return {
        "workspaces_seen": len(spaces),
        "full_ran": full_ran,
        "decay_ran": decay_ran,
        "decay_skipped": decay_skipped,
        "full_missing": workspaces - full_ran,
        "failed": statuses.get("full failed", 0) + statuses.get("decay failed", 0),
        "errors": dict(errors),
        "duplicates": duplicates,
        "statuses": dict(statuses),
        "peak_overlap": peak,
        "full_mean_s": sum(seconds["full"]) / len(seconds["full"]) if seconds["full"] else 0.0,
        "decay_mean_s": sum(seconds["decay"]) / len(seconds["decay"]) if seconds["decay"] else 0.0,
    }


def report(args: argparse.Namespace, prep: dict[str, Any], results: list[dict[str, Any]], span: str) -> str:
    import psycopg

    with psycopg.connect(args.database_url) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
    base = results[0]["wall_s"]
    lines = [
        f"<!-- workers:{args.workspaces}x{args.entries} -->",
        f"## {args.workspaces} workspaces × {args.entries:,} entries, PostgreSQL",
        "",
        f"Measured {span} with `.venv/bin/python bench/workers.py {shlex.join(sys.argv[1:])}`"
        f" (PostgreSQL {version}).",
        "",
        f"- machine: {cpu_model()}, {os.cpu_count()} CPUs, {ram_gib():.1f} GiB RAM; Python "
        f"{platform.python_version()}; yardstick (10M-step Python loop, bench/machine.py) "
        f"{python_loop_seconds():.2f} s CPU",
        f"- data: {prep['entries']:,} latest entries in {args.workspaces} workspaces (the datagen mix, "
        f"a seed per workspace), review mode `{args.review_mode}`, decay interval a day, full run "
        f"daily: one round of each due",
        "- wall: from the first dispatch to the end of the last run; the dispatcher was called "
        f"again every {args.dispatch_every} s meanwhile (and by the cluster's own schedule)",
        "",
        "| workers | wall s | vs 1 worker | full runs ran | decay sweeps ran / skipped ¹ | failed |"
        " twice | most runs at once | mean full run s | tasks enqueued per dispatch | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['workers']} | {r['wall_s']:.1f} | {r['wall_s'] / base:.2f}× | {r['full_ran']} / "
            f"{args.workspaces} | {r['decay_ran']} / {r['decay_skipped']} | {r['failed']} | "
            f"{len(r['duplicates'])} | {r['peak_overlap']} | {r['full_mean_s']:.2f} | "
            f"{_enqueued(r['enqueued'])} | {r['load'][0]:.2f} → {r['load'][1]:.2f} |"
        )
    lines += [
        "",
        "¹ a workspace due for a full run gets the full run alone (it does the decay passes itself), "
        "so no sweep is due in this round: any here would be a second run of the same work; skipped: "
        "turned away by the workspace's lease.",
    ]
    for r in results:
        if r["errors"] or r["duplicates"] or r["full_missing"]:
            lines.append(
                f"- {r['workers']} worker(s): missing full runs {r['full_missing']}, twice "
                f"{r['duplicates'][:10]}, errors {r['errors']}"
            )
    lines += ["", f"<!-- /workers:{args.workspaces}x{args.entries} -->"]
    return "\n".join(lines)


def _enqueued(counts: list[int]) -> str:
    first, rest = counts[0], counts[1:]
    if not rest:
        return f"{first:,}"
    return f"{first:,}, then {sum(rest):,} in {len(rest)} more"


HEADER = """# Many workspaces, many workers

Written by `bench/workers.py` (issue 16, item 6): one round of scheduled maintenance over many
workspaces drained by one and by two qcluster workers on PostgreSQL. One section per size; a
run replaces the section of its size and keeps the others.
"""


def write_report(path: Path, section: str, marker: str) -> None:
    text = path.read_text() if path.exists() else HEADER
    start, end = f"<!-- workers:{marker} -->", f"<!-- /workers:{marker} -->"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DB, help="the template database (PostgreSQL)")
    parser.add_argument("--workspaces", type=int, default=200)
    parser.add_argument("--entries", type=int, default=5000, help="generated entries per workspace")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--review-mode", choices=("apply", "propose"), default="apply")
    parser.add_argument("--dispatch-every", type=int, default=20, help="seconds between extra dispatches")
    parser.add_argument("--timeout", type=int, default=7200, help="seconds a drain may take")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep each worker count's database copy")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    if not args.database_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("bench/workers.py needs PostgreSQL (--database-url postgres://...)")
    begun = datetime.now(UTC)
    setup_django(args.database_url)
    prep = prepare_template(args)
    log(f"template ready: {prep['entries']:,} entries in {args.workspaces} workspaces")
    template = urlsplit(args.database_url).path.lstrip("/")
    results = [measure(args, int(w), template) for w in args.workers.split(",")]
    span = f"{begun:%Y-%m-%d %H:%M} – {datetime.now(UTC):%H:%M} UTC"
    section = report(args, prep, results, span)
    write_report(Path(args.out), section, f"{args.workspaces}x{args.entries}")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
