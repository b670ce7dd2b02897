"""Run safety across real processes: the maintenance lease under two concurrent
``manage.py maintain`` processes, and runs killed with SIGKILL mid-way.

pytest-django's SQLite test database lives in memory, invisible to other processes, so these
tests make their own: a temporary SQLite file, or, when the suite runs on PostgreSQL, a
throwaway database on the same server; either is migrated by ``manage.py migrate`` in a
subprocess. The test process reads it through an extra connection alias.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import dj_database_url
import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Count
from django.utils import timezone

from maintenance.models import MaintenanceLease, MaintenanceRun
from memory.models import Entry, LifecycleEvent, Tombstone
from tests.helpers_subprocess import (
    helper,
    migrated_database,
    start_helper,
    start_manage,
    subprocess_env,
)

ALIAS = "run_safety"
# These tests check what runs change, so their workspaces apply; a new workspace proposes.
APPLY = ("--review-mode", "apply")
NOW = datetime(2026, 6, 1, tzinfo=UTC)
BATCH = 5
# Statuses in lifecycle order: an automatic event's entry is where the event left it or later.
ORDER = {"staged": 0, "active": 1, "stale": 2, "archived": 3, "tombstoned": 4, "purged": 5}
# The reasons of the transition passes in the order a run executes them.
PASS_ORDER = ("graduate", "staged_expiry", "stale", "archive", "prune", "decay", "ttl", "reclaim", "purge")
COUNT_OF = {
    "graduate": "staged_graduated",
    "staged_expiry": "staged_expired",
    "stale": "stale_marked",
    "archive": "archived",
    "prune": "pruned",
    "decay": "evicted",
    "ttl": "expired",
    "reclaim": "reclaimed",
    "purge": "hard_deleted",
}


# --- the database of this module ---------------------------------------------------------------


@pytest.fixture(scope="module")
def safety_db(tmp_path_factory, django_db_blocker) -> Iterator[dict[str, str]]:
    """A migrated database other processes can reach, registered here as ALIAS."""
    folder = tmp_path_factory.mktemp("run_safety")
    url, drop = migrated_database(f"ms_safety_{uuid.uuid4().hex[:12]}", folder)
    env = subprocess_env(url, folder / "backups")
    try:
        cfg = dj_database_url.parse(url)
        if cfg["ENGINE"].endswith("sqlite3"):
            cfg["OPTIONS"] = {"timeout": 20}
        connections.settings[ALIAS] = connections.configure_settings(
            {DEFAULT_DB_ALIAS: dict(connections.settings[DEFAULT_DB_ALIAS]), ALIAS: cfg}
        )[ALIAS]
        with django_db_blocker.unblock():
            yield env
            connections[ALIAS].close()
    finally:
        connections.settings.pop(ALIAS, None)
        if drop is not None:
            drop()


def _entries() -> Any:
    return Entry.objects.using(ALIAS)


def _wait_for(predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextmanager
def _reaped(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """The process, killed and waited for if it is still running when the block ends."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _runs(slug: str) -> list[MaintenanceRun]:
    return list(MaintenanceRun.objects.using(ALIAS).filter(workspace__slug=slug).order_by("pk"))


def _expire_lease(slug: str) -> None:
    """What 60 s without renewal does, without waiting for it."""
    MaintenanceLease.objects.using(ALIAS).filter(workspace__slug=slug).update(
        renewed_at=timezone.now() - timedelta(minutes=2)
    )


def _nothing_done_twice(slug: str) -> None:
    twice = (
        LifecycleEvent.objects.using(ALIAS)
        .filter(workspace__slug=slug, automatic=True)
        .values("entry_ref", "to_status")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
    )
    assert not twice.exists(), f"automatic changes applied twice: {list(twice[:5])}"
    tombstones = (
        Tombstone.objects.using(ALIAS)
        .filter(workspace__slug=slug)
        .values("entry_ref")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
    )
    assert not tombstones.exists(), f"entries tombstoned twice: {list(tombstones[:5])}"


def _nothing_half_applied(slug: str) -> None:
    """Every batch is all or nothing: a status change comes with its event (and Tombstone)."""
    entries = {
        e["pk"]: e for e in _entries().filter(workspace__slug=slug).values("pk", "status", "is_latest")
    }
    open_tombstones = Counter(
        Tombstone.objects.using(ALIAS)
        .filter(workspace__slug=slug, restored_at__isnull=True, purged_at__isnull=True)
        .values_list("entry_id", flat=True)
    )
    events = list(
        LifecycleEvent.objects.using(ALIAS)
        .filter(workspace__slug=slug)
        .order_by("created_at", "pk")
        .values("entry_ref", "entry_id", "to_status", "automatic")
    )
    last_event = {e["entry_ref"]: e for e in events}
    for pk, entry in entries.items():
        if entry["status"] == "tombstoned":
            assert open_tombstones[pk] == 1, (
                f"tombstoned entry {pk} has {open_tombstones[pk]} open tombstones"
            )
        else:
            assert open_tombstones[pk] == 0, f"{entry['status']} entry {pk} has an open tombstone"
        if entry["is_latest"]:
            assert last_event[pk]["to_status"] == entry["status"], (
                f"entry {pk} is {entry['status']} but its last event says {last_event[pk]['to_status']}"
            )
    purged = {e["entry_ref"] for e in events if e["to_status"] == "purged"}
    for event in events:
        if not event["automatic"]:
            continue
        if event["to_status"] == "purged":
            assert event["entry_ref"] not in entries, f"entry {event['entry_ref']} purged but still there"
            continue
        if event["entry_id"] is None:
            assert event["entry_ref"] in purged, f"entry {event['entry_ref']} vanished without a purge"
            continue
        entry = entries[event["entry_id"]]
        assert ORDER[entry["status"]] >= ORDER[event["to_status"]], (
            f"entry {event['entry_id']} is {entry['status']}, behind its automatic {event['to_status']} event"
        )


def _events_by_pass(run_id: int) -> Counter[str]:
    return Counter(
        LifecycleEvent.objects.using(ALIAS)
        .filter(run_id=run_id, automatic=True)
        .values_list("reason", flat=True)
    )


def _statuses(slug: str) -> dict[str, str]:
    return dict(_entries().filter(workspace__slug=slug, is_latest=True).values_list("external_id", "status"))


# --- (a) two processes, one lease ------------------------------------------------------------------


def test_two_concurrent_maintain_processes_do_the_work_once(safety_db):
    slug = "lease-race"
    # Relative to the real clock: `manage.py maintain` runs at the real now.
    now = timezone.now().replace(microsecond=0)
    helper(["seed", "--workspace", slug, "--entries", "3000", "--now", now.isoformat(), *APPLY], safety_db)
    args = ["maintain", "--workspace", slug, "--json"]

    with _reaped(start_manage(args, safety_db)) as first:
        # The second process starts once the first holds the lease (and is still working).
        _wait_for(
            lambda: (
                MaintenanceLease.objects.using(ALIAS).filter(workspace__slug=slug).exclude(holder="").exists()
            ),
            timeout=60,
            what="the first process to take the lease",
        )
        with _reaped(start_manage(args, safety_db)) as second:
            out_second, err_second = second.communicate(timeout=120)
        out_first, err_first = first.communicate(timeout=120)
    assert first.returncode == 0, err_first
    assert second.returncode == 0, err_second
    results = [json.loads(out_first), json.loads(out_second)]

    runs = {r.pk: r for r in _runs(slug)}
    other = runs[results[1]["run_id"]]
    assert results[0]["status"] == "succeeded"
    assert results[0]["counts"]["pruned"] > 100
    if results[1]["status"] == "skipped":
        assert "lease" in other.error
        assert not LifecycleEvent.objects.using(ALIAS).filter(run=other).exists()
    else:
        # On SQLite the second process may wait for the write lock until the first has let go
        # of the lease; it then runs after it and must find nothing left to do.
        assert results[1]["status"] == "succeeded"
        changed = {k: v for k, v in results[1]["counts"].items() if v and k not in ("scored", "orphans")}
        assert changed == {}, changed
    _nothing_done_twice(slug)
    _nothing_half_applied(slug)
    assert MaintenanceLease.objects.using(ALIAS).get(workspace__slug=slug).holder == ""


# --- (b) SIGKILL mid-run ---------------------------------------------------------------------------


def _run_args(slug: str) -> list[str]:
    return ["run", "--workspace", slug, "--now", NOW.isoformat(), "--batch-size", str(BATCH), "--force"]


def _kill_mid_run(slug: str, env: dict[str, str], reached: Callable[[int], bool], rng: random.Random) -> int:
    """Start a run, wait until ``reached(run_id)`` is true of what it committed, wait a little
    more, SIGKILL it. Returns the killed run's id."""
    before = {r.pk for r in _runs(slug)}
    # 5 ms after each statement: the run cannot finish within the random wait below.
    with _reaped(start_helper([*_run_args(slug), "--statement-delay", "0.005"], env)) as proc:
        run_id = _wait_for(
            lambda: next((r.pk for r in _runs(slug) if r.pk not in before), None),
            timeout=60,
            what="the run to start",
        )
        _wait_for(lambda: reached(run_id) or proc.poll() is not None, timeout=60, what="the run's progress")
        time.sleep(rng.uniform(0, 0.15))
        assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.communicate()[1]}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return run_id


def _has_event(to_status: str) -> Callable[[int], bool]:
    return lambda run_id: (
        LifecycleEvent.objects.using(ALIAS).filter(run_id=run_id, to_status=to_status).exists()
    )


def test_a_run_killed_at_any_point_leaves_no_half_applied_batch_and_the_next_run_finishes_it(safety_db):
    seed = int(os.environ.get("RUN_SAFETY_SEED", random.randrange(1_000_000)))
    rng = random.Random(seed)
    print(f"RUN_SAFETY_SEED={seed}")
    killed, reference = "killed", "reference"
    for slug in (killed, reference):
        helper(["seed", "--workspace", slug, "--entries", "400", "--now", NOW.isoformat(), *APPLY], safety_db)
    assert _statuses(killed) and _statuses(killed).keys() == _statuses(reference).keys()

    expected = json.loads(helper(_run_args(reference), safety_db))
    assert expected["status"] == "succeeded"
    counts = expected["counts"]
    assert counts["archived"] > 20 * BATCH and counts["pruned"] > 10 * BATCH, counts

    # Kill one run in each of the archive, prune and purge passes; each next run resumes.
    killed_runs = []
    for stage in ("archived", "tombstoned", "purged"):
        run_id = _kill_mid_run(killed, safety_db, _has_event(stage), rng)
        killed_runs.append(run_id)
        _nothing_half_applied(killed)
        _nothing_done_twice(killed)
        if stage == "archived":
            # Until the lease goes stale the workspace stays claimed by the dead run.
            assert json.loads(helper(_run_args(killed), safety_db))["status"] == "skipped"
        _expire_lease(killed)
        # Every batch of a pass but its last is full, so the pass the kill interrupted stopped
        # at a batch boundary, unless it had just finished: then nothing of it is left to do.
        done = _events_by_pass(run_id)
        interrupted = [p for p in PASS_ORDER if done[p]][-1]
        left = json.loads(helper([*_run_args(killed), "--dry-run"], safety_db))
        assert left["status"] == "succeeded", left
        assert done[interrupted] % BATCH == 0 or left["counts"][COUNT_OF[interrupted]] == 0, (
            interrupted,
            dict(done),
            left["counts"],
        )

    final = json.loads(helper(_run_args(killed), safety_db))
    assert final["status"] == "succeeded", final
    statuses = {run.pk: (run.status, run.error) for run in _runs(killed) if run.pk in killed_runs}
    # A kill can land after the run has recorded its end (its last pass was short, and the
    # process was still announcing the result): such a run stands as it recorded itself.
    # Every other killed run is marked failed by the next one. The archive stage has far
    # more batches than the delay before the kill, so at least that run is interrupted.
    assert statuses[killed_runs[0]][0] == "failed", statuses
    for status, error in statuses.values():
        assert status == "succeeded" or (status == "failed" and "interrupted" in error), statuses
    _nothing_half_applied(killed)
    _nothing_done_twice(killed)

    # The same end state as one uninterrupted run on an identical copy, every change made once.
    assert _statuses(killed) == _statuses(reference)
    for to_status, key in (("archived", "archived"), ("tombstoned", "pruned"), ("purged", "hard_deleted")):
        n = LifecycleEvent.objects.using(ALIAS).filter(
            workspace__slug=killed, automatic=True, to_status=to_status
        )
        assert n.count() == counts[key], (to_status, n.count(), counts)
    reasons = Counter(
        Tombstone.objects.using(ALIAS).filter(workspace__slug=killed).values_list("reason", "purged_at")
    )
    expected_reasons = Counter(
        Tombstone.objects.using(ALIAS).filter(workspace__slug=reference).values_list("reason", "purged_at")
    )
    assert reasons == expected_reasons


def test_a_process_finding_the_lease_held_records_a_skipped_run(safety_db):
    slug = "lease-held"
    now = timezone.now().replace(microsecond=0)
    helper(["seed", "--workspace", slug, "--entries", "50", "--now", now.isoformat(), *APPLY], safety_db)
    workspace_id = _entries().filter(workspace__slug=slug).values_list("workspace_id", flat=True).first()
    MaintenanceLease.objects.using(ALIAS).update_or_create(
        workspace_id=workspace_id, defaults={"holder": "another-machine", "renewed_at": timezone.now()}
    )
    args = ["maintain", "--workspace", slug, "--json"]
    with _reaped(start_manage(args, safety_db)) as blocked:
        out, err = blocked.communicate(timeout=120)
    assert blocked.returncode == 0, err
    result = json.loads(out)
    assert result["status"] == "skipped"
    assert not LifecycleEvent.objects.using(ALIAS).filter(run_id=result["run_id"]).exists()
    # the holder's lease is untouched; once it is released the next process runs
    assert MaintenanceLease.objects.using(ALIAS).get(workspace_id=workspace_id).holder == "another-machine"
    MaintenanceLease.objects.using(ALIAS).filter(workspace_id=workspace_id).update(holder="")
    with _reaped(start_manage(args, safety_db)) as free:
        out, err = free.communicate(timeout=120)
    assert json.loads(out)["status"] == "succeeded"


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's session state")
def test_a_session_left_mid_statement_by_a_stop_is_replaced_before_the_way_out():
    """A stop that lands while psycopg sends a statement leaves the session busy with it: the
    run's way out (its score table dropped, its lease released) gets a new session instead of
    failing with "another command is already in progress"."""
    from maintenance import runs
    from memory.models import Workspace

    connection.ensure_connection()
    connection.connection.pgconn.send_query(b"SELECT pg_sleep(0.2)")  # sent, never read
    stuck = connection.connection
    runs._usable_connection()
    assert stuck.closed
    assert Workspace.objects.count() >= 0  # a new session answers
    runs._usable_connection()  # an idle session is left as it is
    assert connection.connection is not None and not connection.connection.closed
