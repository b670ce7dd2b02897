"""Clean stops: ``manage.py qcluster``, ``manage.py serve`` and ``make run`` stop on
SIGTERM and SIGINT, sent to the process or to its whole process group as a service manager or
a terminal does, with no process left; a maintenance run in hand is abandoned cleanly (its
lease released, its row ``failed``). Real process trees on a real database: a SQLite file, or
a throwaway PostgreSQL database when the suite runs there (the hosted settings, with the pool).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from maintenance.models import MaintenanceLease, MaintenanceRun
from tests.helpers_subprocess import (
    ROOT,
    database_alias,
    free_port,
    helper,
    kill_tree,
    migrated_database,
    start_helper,
    stop_tree,
    subprocess_env,
    wait_for,
)

ALIAS = "stops"
DELAY = "0.05"  # seconds after each SQL statement of a slowed run: it lasts far beyond a stop
WAIT = 60  # seconds any wait below may take before the test gives up (never reached when right)


@pytest.fixture(scope="module")
def stops_db(tmp_path_factory, django_db_blocker) -> Iterator[dict[str, str]]:
    """A migrated database other processes can reach, with one seeded workspace, registered
    here as ALIAS; the environment of the processes under test."""
    folder = tmp_path_factory.mktemp("stops")
    url, drop = migrated_database(f"ms_stops_{uuid.uuid4().hex[:12]}", folder)
    env = subprocess_env(url, folder / "backups")
    env.update(Q_WORKERS="2", LOG_LEVEL="INFO")
    # A browser test earlier on the same xdist worker leaves Playwright's event loop registered
    # in this thread, and Django then refuses this module's plain ORM reads as "async" (seen in
    # CI on PostgreSQL); nothing here runs in an event loop.
    unsafe = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
    try:
        helper(
            [
                "seed",
                "--workspace",
                "w",
                "--entries",
                "300",
                "--now",
                "2026-06-01T00:00:00+00:00",
                "--review-mode",
                "apply",
            ],
            env,
        )
        with database_alias(ALIAS, url), django_db_blocker.unblock():
            yield env
    finally:
        if unsafe is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = unsafe
        if drop is not None:
            drop()


def running_run() -> MaintenanceRun | None:
    """The run in progress once it holds its workspace's lease (what a stop must give back)."""
    run = MaintenanceRun.objects.using(ALIAS).filter(status="running").first()
    if run is None:
        return None
    held = MaintenanceLease.objects.using(ALIAS).filter(workspace_id=run.workspace_id, run_id=run.pk)
    return run if held.exclude(holder="").exists() else None


def assert_abandoned(run: MaintenanceRun) -> None:
    run = MaintenanceRun.objects.using(ALIAS).get(pk=run.pk)
    assert run.status == "failed", run.error
    assert run.error.startswith("interrupted: the worker was stopped"), run.error
    assert not MaintenanceLease.objects.using(ALIAS).filter(workspace_id=run.workspace_id).exclude(holder="")


def start(args: list[str], env: dict[str, str], log: Path, **popen) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child writes through its own copy of the file
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, **popen)


def cluster_running(log: Path) -> bool:
    text = log.read_text(errors="replace")
    return "Q Cluster" in text and "running." in text


SIGNALS = pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])


def test_a_run_told_to_stop_is_marked_failed_and_releases_its_lease(stops_db):
    proc = start_helper(["scheduled", "--workspace", "w", "--statement-delay", DELAY], stops_db)
    try:
        run = wait_for("the run to start", running_run)
        time.sleep(0.5)  # into its batches
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        kill_tree(proc.pid)
    assert proc.returncode == 0, err  # the worker exits, quietly, once the run is abandoned
    assert out == ""  # it never came back from the task
    assert "Traceback" not in err
    assert_abandoned(run)


@pytest.mark.parametrize(
    "signum, group",
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True), (signal.SIGINT, True)],
    ids=["SIGTERM", "SIGINT", "SIGTERM-to-group", "SIGINT-to-group"],
)
def test_qcluster_stops_abandoning_the_run_in_hand_and_leaves_no_process(stops_db, tmp_path, signum, group):
    log = tmp_path / "qcluster.log"
    proc = start([sys.executable, "manage.py", "qcluster"], stops_db, log, start_new_session=True)
    wait_for("the cluster", lambda: cluster_running(log))
    helper(["enqueue", "--workspace", "w", "--statement-delay", DELAY], stops_db)
    run = wait_for("a worker to start the run", running_run)
    time.sleep(0.5)
    assert stop_tree(proc, signum, group=group, timeout=WAIT) == []
    output = log.read_text(errors="replace")
    assert "has stopped" in output
    assert "Traceback" not in output
    assert_abandoned(run)  # the worker gave the run up itself: not killed before it could


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@SIGNALS
def test_serve_stops_its_server_and_cluster_and_leaves_no_process(stops_db, tmp_path, signum):
    port = free_port()
    log = tmp_path / "serve.log"
    proc = start([sys.executable, "manage.py", "serve", "--port", str(port)], stops_db, log)
    wait_for("the server", lambda: _healthy(port))
    wait_for("the cluster", lambda: cluster_running(log))
    assert stop_tree(proc, signum, group=False, timeout=WAIT) == []
    assert proc.returncode == -signum  # it died of the signal, after its cleanup
    output = log.read_text(errors="replace")
    assert "has stopped" in output  # the cluster's own clean stop, not a kill
    assert "Traceback" not in output


@SIGNALS
def test_make_run_stopped_as_a_process_group_leaves_no_process(stops_db, tmp_path, signum):
    # A service manager (or a terminal's Ctrl-C) signals every process of the group at once.
    port = free_port()
    log = tmp_path / "make-run.log"
    env = {k: v for k, v in stops_db.items() if not k.startswith("MAKE")} | {"PORT": str(port)}
    proc = start(["make", "run"], env, log, start_new_session=True)
    wait_for("the server", lambda: _healthy(port))
    wait_for("the cluster", lambda: cluster_running(log))
    assert stop_tree(proc, signum, group=True, timeout=WAIT) == []
    output = log.read_text(errors="replace")
    assert "has stopped" in output
    assert "Traceback" not in output


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a query in flight on PostgreSQL's wire")
@pytest.mark.django_db(transaction=True)
def test_a_stop_that_lands_mid_query_leaves_the_connection_usable():
    """SIGTERM arriving while psycopg waits for the server: the query is cancelled on the way
    out, so the lease's release and the run's failed row can still be written on the same
    connection (it was left "another command is already in progress" before)."""
    import threading

    from maintenance.tasks import WorkerStopping, stop_on_sigterm

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("only the main thread takes signals")
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    started = time.monotonic()
    with pytest.raises(WorkerStopping), stop_on_sigterm():
        timer.start()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(20)")
    assert time.monotonic() - started < 10  # cancelled, not waited out
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


@pytest.mark.django_db
def test_an_abandoned_run_lets_go_of_its_half_read_cursor_before_the_worker_exits(workspace, monkeypatch):
    """What a run's frames hold when the stop lands (a chunked read in its middle) is released
    while the connection is open: kept alive by the exception until the worker's exit, after
    its connections were closed, the cursor's cleanup printed a traceback to the log."""
    import weakref

    from maintenance import tasks
    from memory import new_entries

    for i in range(3):
        new_entries.entry_create(workspace=workspace, content=f"note {i} about the pool sockets")
    held = []

    def stopped_mid_read(**kwargs):
        rows = workspace.entries.all().iterator(chunk_size=1)
        next(rows)
        held.append(weakref.ref(rows))
        raise tasks.WorkerStopping("the worker was stopped (SIGTERM)")

    monkeypatch.setattr(tasks, "run_maintenance", stopped_mid_read)
    with pytest.raises(SystemExit) as exited:
        tasks.run_scheduled(workspace.pk, "full")
    assert exited.value.__context__ is not None  # the stop, with its traceback, is still alive
    assert held[0]() is None  # but the half-read cursor is gone
