"""Django work in a separate process, for the run-safety tests (tests/test_run_safety.py) and
the fork-safety tests (tests/test_processes.py).

The test process imports the small functions at the top to build environments and start
processes; the subprocess runs this file as a script against the database named by
``DATABASE_URL`` (a real file or server database, never pytest's in-memory one)::

    python tests/helpers_subprocess.py seed --workspace W --entries N --now ISO [--seed S] [--review-mode M]
    python tests/helpers_subprocess.py run --workspace W --now ISO --batch-size 5 [--force] [--dry-run]
    python tests/helpers_subprocess.py fork --children N --queries Q [--close-first]
    python tests/helpers_subprocess.py scheduled --workspace W --kind K [--statement-delay S]
    python tests/helpers_subprocess.py enqueue --workspace W --kind K [--statement-delay S]
    python tests/helpers_subprocess.py dump --workspace W
    python tests/helpers_subprocess.py hosted-seed --workspaces N --entries E --big B --now ISO
    python tests/helpers_subprocess.py tick --every S

``seed`` creates a workspace whose content is a pure function of (entries, now, seed), so two
workspaces seeded alike are identical copies. Like every new workspace it proposes
unless ``--review-mode apply`` is asked for: a test that expects runs to change entries says
so. ``run`` calls run_maintenance with a small batch size (the management commands take none),
so one run commits many batches and a kill lands between two of them; it prints the result
object as JSON. ``fork`` uses the database, forks
N children the way django-q2 forks its workers (``--close-first``: after
``connections.close_all()``, as q2 does), and has every process run Q queries, the same
statement each time (so that psycopg prepares it); it prints each process's PostgreSQL
backend pids and the errors met. ``scheduled`` runs the scheduled-run task as a django-q2
worker does (SIGTERM ignored until the task takes it); ``enqueue`` puts that task, slowed by
``--statement-delay``, on the cluster's queue (``slow_scheduled_run``). ``dump`` prints every
column of every row a backup holds (``dump_workspace``), to compare two databases.
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

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


def postgres_database(name: str, *, template: str | None = None) -> tuple[str, Callable[[], None]]:
    """Create database ``name`` on the suite's PostgreSQL server (a copy of ``template`` when
    given); its URL and a dropper."""
    import psycopg
    from django.db import connection
    from psycopg import sql

    conf = connection.settings_dict
    params = {
        "host": conf["HOST"] or None,
        "port": conf["PORT"] or None,
        "user": conf["USER"] or None,
        "password": conf["PASSWORD"] or None,
    }
    params = {k: v for k, v in params.items() if v}
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
        admin.execute(create)

    def drop() -> None:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    auth = conf["USER"] + (f":{conf['PASSWORD']}" if conf["PASSWORD"] else "") + "@" if conf["USER"] else ""
    host = conf["HOST"] or "localhost"
    port = f":{conf['PORT']}" if conf["PORT"] else ""
    return f"postgres://{auth}{host}{port}/{name}", drop


# This test process's migrated templates: a SQLite file, a PostgreSQL database's name.
_TEMPLATES: dict[str, str] = {}


def migrated_sqlite(path: Path) -> str:
    """A migrated SQLite file at ``path`` that other processes can reach; its URL. A copy of
    one file this test process migrated once: ``manage.py migrate`` costs several seconds of
    CPU, and a dozen modules each needed a database of their own."""
    import atexit
    import shutil
    import sqlite3
    import tempfile

    if "sqlite" not in _TEMPLATES:
        folder = Path(tempfile.mkdtemp(prefix="ms-template-"))
        template = folder / "db.sqlite3"
        atexit.register(shutil.rmtree, folder, True)
        env = subprocess_env(f"sqlite:///{template}", folder / "backups")
        manage(["migrate", "--noinput", "-v", "0"], env, timeout=300)
        _TEMPLATES["sqlite"] = str(template)
    path.parent.mkdir(parents=True, exist_ok=True)
    source, copy = sqlite3.connect(_TEMPLATES["sqlite"]), sqlite3.connect(path)
    try:
        source.backup(copy)
    finally:
        source.close()
        copy.close()
    return f"sqlite:///{path}"


def migrated_postgres(name: str) -> tuple[str, Callable[[], None]]:
    """A migrated database ``name`` on the suite's PostgreSQL server; its URL and a dropper. A
    copy (``CREATE DATABASE … TEMPLATE``) of one database this test process migrated once."""
    import atexit
    import shutil
    import tempfile

    if "postgresql" not in _TEMPLATES:
        template = f"ms_template_{os.getpid()}_{random.getrandbits(32):08x}"
        url, drop = postgres_database(template)
        atexit.register(drop)
        folder = Path(tempfile.mkdtemp(prefix="ms-template-"))
        atexit.register(shutil.rmtree, folder, True)
        manage(["migrate", "--noinput", "-v", "0"], subprocess_env(url, folder), timeout=300)
        _TEMPLATES["postgresql"] = template
    return postgres_database(name, template=_TEMPLATES["postgresql"])


def migrated_database(name: str, folder: Path) -> tuple[str, Callable[[], None] | None]:
    """A migrated database of the suite's kind other processes can reach (pytest's own is not
    shared): on PostgreSQL database ``name`` on the suite's server, with its dropper; else
    ``folder``/db.sqlite3, with None."""
    from django.db import connection

    if connection.vendor == "postgresql":
        return migrated_postgres(name)
    return migrated_sqlite(folder / "db.sqlite3"), None


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


def descendants(pid: int) -> list[int]:
    """The pids of every living descendant of ``pid`` (children, their children, ...), read
    from /proc: what would be left behind if ``pid`` went away now."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after it.
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] != "Z":  # a zombie has exited already
            children.setdefault(int(fields[1]), []).append(int(text.split(" ", 1)[0]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    for each in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, 9)


def alive(pids: Sequence[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has exited: not counted)."""
    left = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            left.append(pid)
    return left


def stop_tree(proc: subprocess.Popen[Any], signum: int, *, group: bool, timeout: float = 60) -> list[int]:
    """Send ``signum`` to the process (or its process group), wait for it, and return what is
    left of the tree it had; whatever is left is then killed."""
    tree = [proc.pid, *descendants(proc.pid)]
    try:
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        proc.wait(timeout=timeout)
        time.sleep(0.5)  # an orphan would show by now
        return alive(tree)
    finally:
        kill_tree(proc.pid)
        for pid in alive(tree):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def wait_for(what: str, check: Callable[[], Any], *, timeout: float = 60) -> Any:
    """``check()``'s first truthy value, polled every 0.1 s; the test fails after ``timeout``."""
    import pytest

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"gave up waiting for {what}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def database_alias(alias: str, url: str) -> Iterator[None]:
    """``url`` registered as Django database ``alias`` of this (the test) process while the
    block runs, closed after it."""
    import dj_database_url
    from django.db import DEFAULT_DB_ALIAS, connections

    cfg = dj_database_url.parse(url)
    if cfg["ENGINE"].endswith("sqlite3"):
        cfg["OPTIONS"] = {"timeout": 20}
    connections.settings[alias] = connections.configure_settings(
        {DEFAULT_DB_ALIAS: dict(connections.settings[DEFAULT_DB_ALIAS]), alias: cfg}
    )[alias]
    try:
        yield
        # A browser test earlier on this worker leaves Playwright's event loop registered as
        # running in this thread (its sync API), and Django then refuses a plain close.
        with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
            connections[alias].close()
    finally:
        connections.settings.pop(alias, None)


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
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # a hung helper must not outlive the test, nor its children
        proc.communicate()
        raise
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
        # Every record names the same fields: bulk_insert.insert_rows takes its defaults from
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


def _seed(slug: str, entries: int, now: datetime, seed: int, review_mode: str | None) -> dict[str, Any]:
    from memory import accounts, journal_import
    from memory.policy_model import MaintenancePolicy

    workspace = accounts.workspace_create(slug=slug, review_mode=review_mode)
    policy = MaintenancePolicy.objects.get(workspace=workspace)
    for name, value in SEEDED_POLICY.items():
        setattr(policy, name, value)
    policy.save()
    counts = journal_import.import_lines(
        workspace=workspace, lines=journal_lines(entries, now, seed), now=now
    )
    return {"workspace": slug, "created": counts.created, "invalid": counts.invalid}


def _run(
    slug: str, now: datetime, batch_size: int, force: bool, kind: str, dry_run: bool, statement_delay: float
) -> dict[str, Any]:
    from django.db import connection

    from maintenance.run_start import run_maintenance
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


def _queries(n: int) -> tuple[list[int], list[str]]:
    """Run n queries; the backend pids they ran on and the errors they met."""
    from django.db import connection

    from memory.models import Workspace

    pids: set[int] = set()
    errors: list[str] = []
    for _ in range(n):
        try:
            Workspace.objects.filter(slug="no-such-workspace").count()
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids.add(cursor.fetchone()[0])
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()  # back to the pool, as at the end of a request or task
    return sorted(pids), errors


def _child(conn: Any, n: int) -> None:
    conn.send(_queries(n))
    conn.close()


def _fork(children: int, queries: int, close_first: bool) -> dict[str, Any]:
    import multiprocessing

    from django.db import connection, connections

    with connection.cursor() as cursor:  # the parent has used the database (the pool is open)
        cursor.execute("SELECT 1")
    if close_first:
        connections.close_all()
    context = multiprocessing.get_context("fork")
    pipes, procs = [], []
    for _ in range(children):
        ours, theirs = context.Pipe()
        proc = context.Process(target=_child, args=(theirs, queries))
        proc.start()
        pipes.append(ours)
        procs.append(proc)
    parent = _queries(queries)  # at the same time as the children
    results = [pipe.recv() for pipe in pipes]
    for proc in procs:
        proc.join(30)
    after = _queries(1)  # the parent's connections still work once the children are gone
    return {
        "parent": parent[0],
        "children": [pids for pids, _ in results],
        "errors": parent[1] + [e for _, errs in results for e in errs] + after[1],
        "exit_codes": [proc.exitcode for proc in procs],
    }


def slow_scheduled_run(workspace_id: int, kind: str, statement_delay: float) -> Any:
    """maintenance.tasks.run_scheduled, each SQL statement followed by a pause: a run long
    enough for a stop to land in the middle of it. A django-q2 task (``enqueue``)."""
    from django.db import connection

    from maintenance import tasks

    def slowly(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        time.sleep(statement_delay)
        return result

    with connection.execute_wrapper(slowly):
        return tasks.run_scheduled(workspace_id, kind)


def _scheduled(slug: str, kind: str, statement_delay: float) -> Any:
    import signal

    from memory.models import Workspace

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as in a worker of maintenance's qcluster
    return slow_scheduled_run(Workspace.objects.get(slug=slug).pk, kind, statement_delay)


def _enqueue(slug: str, kind: str, statement_delay: float) -> str:
    from django_q.tasks import async_task

    from memory.models import Workspace

    workspace = Workspace.objects.get(slug=slug)
    return str(async_task("tests.helpers_subprocess.slow_scheduled_run", workspace.pk, kind, statement_delay))


def _hosted_seed(count: int, entries: int, big: int, now: datetime) -> dict[str, Any]:
    """``count`` workspaces hosted-00… for tests/test_hosted.py, each seeded like ``seed`` (the
    first with ``big`` entries: its runs last long enough to overlap), half of them in apply
    mode, with the shortest intervals a policy takes (decay every 60 s, full every hour) and an
    operator key each; and a member of hosted-01 logged in (a session), for the websocket."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    from memory import accounts, journal_import
    from memory.policy_model import MaintenancePolicy

    keys: dict[str, str] = {}
    for i in range(count):
        slug = f"hosted-{i:02d}"
        workspace = accounts.workspace_create(slug=slug, review_mode="apply" if i % 2 == 0 else "propose")
        policy = MaintenancePolicy.objects.get(workspace=workspace)
        shortest = {"decay_interval_seconds": 60, "maintenance_interval_hours": 1}
        for name, value in {**SEEDED_POLICY, **shortest}.items():
            setattr(policy, name, value)
        policy.save()
        lines = journal_lines(big if i == 0 else entries, now, seed=i)
        journal_import.import_lines(workspace=workspace, lines=lines, now=now)
        keys[slug] = accounts.api_key_create(workspace=workspace, name="hosted test", role="operator")[1]
    user = get_user_model().objects.create_user("watcher", password=None)
    accounts.membership_set(workspace=accounts.workspace_get("hosted-01"), user=user, role="viewer")
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return {"keys": keys, "session": session.session_key}


def _tick(every: float) -> int:
    """Put maintenance's dispatcher on the cluster's queue every ``every`` seconds until
    SIGTERM: django-q2's scheduler does the same every two minutes (and looks at its schedules
    every 30 s only), too slow for a test. The number of dispatches enqueued."""
    import signal

    from django_q.tasks import async_task

    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    done = 0
    while not stopping:
        async_task("maintenance.tasks.dispatch_due_maintenance", task_name="dispatch (test tick)")
        done += 1
        deadline = time.monotonic() + every
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.05)
    return done


def _api_key(slug: str, role: str) -> dict[str, Any]:
    from memory import accounts
    from memory.models import Workspace

    workspace = Workspace.objects.get(slug=slug)
    return {"key": accounts.api_key_create(workspace=workspace, name=f"{role} key", role=role)[1]}


def dump_workspace(slug: str) -> dict[str, Any]:
    """Every column of every row of each kind a backup holds (but the workspace id), rows by
    id, values as JSON has them: what must be the same in any database after a restore."""
    from maintenance import backups
    from memory.models import Workspace

    workspace = Workspace.objects.get(slug=slug)
    out: dict[str, Any] = {"workspace": [workspace.slug, workspace.name, workspace.created_at]}
    for kind, queryset in backups._querysets(workspace):
        out[kind.name] = list(queryset.order_by("pk").values(*kind.columns))
    return json.loads(json.dumps(out, default=backups._default))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="helpers_subprocess")
    sub = parser.add_subparsers(dest="command", required=True)
    seed = sub.add_parser("seed")
    seed.add_argument("--workspace", required=True)
    seed.add_argument("--entries", type=int, required=True)
    seed.add_argument("--now", type=datetime.fromisoformat, required=True)
    seed.add_argument("--seed", type=int, default=0)
    seed.add_argument("--review-mode", choices=["propose", "apply"], default=None)
    run = sub.add_parser("run")
    run.add_argument("--workspace", required=True)
    run.add_argument("--now", type=datetime.fromisoformat, required=True)
    run.add_argument("--batch-size", type=int, default=500)
    run.add_argument("--kind", default="full")
    run.add_argument("--force", action="store_true")
    run.add_argument("--dry-run", action="store_true")
    run.add_argument("--statement-delay", type=float, default=0.0, help="seconds after each SQL statement")
    fork = sub.add_parser("fork")
    fork.add_argument("--children", type=int, default=2)
    fork.add_argument("--queries", type=int, default=20)
    fork.add_argument("--close-first", action="store_true")
    for name in ("scheduled", "enqueue"):
        one = sub.add_parser(name)
        one.add_argument("--workspace", required=True)
        one.add_argument("--kind", default="full")
        one.add_argument("--statement-delay", type=float, default=0.0)
    hosted = sub.add_parser("hosted-seed")
    hosted.add_argument("--workspaces", type=int, default=20)
    hosted.add_argument("--entries", type=int, default=40)
    hosted.add_argument("--big", type=int, default=1500)
    hosted.add_argument("--now", type=datetime.fromisoformat, required=True)
    tick = sub.add_parser("tick")
    tick.add_argument("--every", type=float, default=2.0)
    api_key = sub.add_parser("api-key")
    api_key.add_argument("--workspace", required=True)
    api_key.add_argument("--role", required=True)
    dump = sub.add_parser("dump")
    dump.add_argument("--workspace", required=True)
    args = parser.parse_args(argv)

    _setup_django()
    if args.command == "seed":
        result = _seed(args.workspace, args.entries, args.now, args.seed, args.review_mode)
    elif args.command == "fork":
        result = _fork(args.children, args.queries, args.close_first)
    elif args.command == "scheduled":
        result = _scheduled(args.workspace, args.kind, args.statement_delay)
    elif args.command == "enqueue":
        result = _enqueue(args.workspace, args.kind, args.statement_delay)
    elif args.command == "hosted-seed":
        result = _hosted_seed(args.workspaces, args.entries, args.big, args.now)
    elif args.command == "tick":
        result = _tick(args.every)
    elif args.command == "api-key":
        result = _api_key(args.workspace, args.role)
    elif args.command == "dump":
        result = dump_workspace(args.workspace)
    else:
        options = (args.batch_size, args.force, args.kind, args.dry_run, args.statement_delay)
        result = _run(args.workspace, args.now, *options)
    print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
