"""Runs out of the request: a real run (and a dry run of a large workspace) is recorded
``queued``, handed to django-q2 and answered 202; the worker works it, recording its progress
once per pass; the run row keeps a bounded sample of the affected ids, the complete lists are
the run's LifecycleEvents, paged by the API and the run page.

The in-process tests execute the queued task as a worker does (tests/helpers_runs.py); the last
test starts a real server with its real qcluster on a database of their own and follows a run
from its 202 to its end through the API."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from console import live
from maintenance import run_results, runs
from maintenance.lease import acquire, new_holder
from maintenance.models import MaintenanceRun
from maintenance.revert import revert_run
from maintenance.run_results import rows_done
from maintenance.run_start import run_maintenance
from maintenance.runs import steps
from maintenance.tasks import dispatch_due_maintenance, run_queued
from memory import accounts, new_entries
from memory.models import Entry, LifecycleEvent, LiveMessage
from tests.helpers_runs import finish_queued, post_run, queued_tasks, work_queued_runs
from tests.helpers_subprocess import (
    ROOT,
    free_port,
    helper,
    kill_tree,
    migrated_database,
    stop_tree,
    subprocess_env,
    wait_for,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _backups(settings, tmp_path):
    settings.BACKUP_DIR = tmp_path


@pytest.fixture
def key(workspace) -> Callable[[str], str]:
    def make(role: str) -> str:
        return accounts.api_key_create(workspace=workspace, name=f"{role} key", role=role)[1]

    return make


def cold(workspace, n: int = 1) -> list[Entry]:
    """Episodic entries old enough for the decay pass to tombstone them."""
    then = timezone.now() - timedelta(days=200)
    return [
        new_entries.entry_create(
            workspace=workspace, content=f"cold memory {i} about retries", created_at=then, now=then
        )
        for i in range(n)
    ]


def get(path: str, key: str) -> Any:
    return Client().get(f"/api/v1{path}", HTTP_AUTHORIZATION=f"Bearer {key}")


def test_a_real_run_is_queued_with_its_task_and_answers_202(workspace, key):
    (entry,) = cold(workspace)
    operator = key("operator")
    response = post_run("/maintenance/run", operator, {"dry_run": False})
    assert response.status_code == 202
    body = response.json()
    run = MaintenanceRun.objects.get(pk=body["run_id"])
    assert (run.status, run.trigger, run.dry_run, run.kind) == ("queued", "api", False, "full")
    assert [t["args"] for t in queued_tasks()] == [(run.pk,)]
    assert Entry.objects.get(pk=entry.pk).status == "active"  # nothing done in the request
    listed = get("/maintenance/runs?status=queued", operator).json()
    assert [r["id"] for r in listed["items"]] == [run.pk]
    done = finish_queued(response, operator)
    assert done["status"] == "succeeded"
    assert done["result"]["affected"]["tombstoned"] == [entry.pk]
    assert Entry.objects.get(pk=entry.pk).status == "tombstoned"


def test_a_task_delivered_twice_runs_once(workspace, key):
    cold(workspace)
    response = post_run("/maintenance/sweep-decay", key("operator"), {"dry_run": False})
    (task,) = queued_tasks()
    run_id = response.json()["run_id"]
    first = run_queued(run_id)
    assert first is not None and first["status"] == "succeeded"
    assert run_queued(run_id) is None  # the redelivered task finds the run no longer queued
    assert MaintenanceRun.objects.count() == 1
    assert LifecycleEvent.objects.filter(run_id=run_id).count() == 1
    assert task["args"] == (run_id,)


def test_an_idempotent_retry_gets_the_same_202_and_queues_nothing_more(workspace, key):
    operator = key("operator")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {operator}", "HTTP_IDEMPOTENCY_KEY": "run-once"}
    send = lambda: Client().post(  # noqa: E731
        "/api/v1/maintenance/run", data=json.dumps({}), content_type="application/json", **headers
    )
    first, again = send(), send()
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert MaintenanceRun.objects.count() == 1
    assert len(queued_tasks()) == 1


def test_a_second_run_while_one_waits_in_the_queue_is_refused_naming_it(workspace, key):
    operator = key("operator")
    first = post_run("/maintenance/run", operator, {"dry_run": False}).json()
    second = post_run("/maintenance/prune", operator, {"dry_run": False})
    assert second.status_code == 409
    body = second.json()
    assert body["running_run_id"] == first["run_id"]
    assert f"waits in the queue (run {first['run_id']})" in body["detail"]
    refused = MaintenanceRun.objects.get(pk=body["run_id"])
    assert (refused.status, refused.kind) == ("skipped", "prune")
    assert [t["args"] for t in queued_tasks()] == [(first["run_id"],)]  # nothing more queued
    work_queued_runs()
    # Once it ran, the next one is queued again.
    assert post_run("/maintenance/run", operator, {"dry_run": False}).status_code == 202


def test_a_run_that_meets_the_lease_when_the_worker_starts_it_ends_skipped(workspace, key):
    operator = key("operator")
    response = post_run("/maintenance/run", operator, {"dry_run": False})
    assert response.status_code == 202
    holder = MaintenanceRun.objects.create(workspace=workspace, kind="decay", trigger="schedule")
    assert acquire(workspace, holder=new_holder(), now=timezone.now(), run=holder)
    done = finish_queued(response, operator)
    assert done["status"] == "skipped"
    assert "lease" in done["error"]


def test_a_large_workspace_dry_run_is_queued_too_and_a_small_one_answers_inline(workspace, key, settings):
    cold(workspace, 3)
    agent = key("agent")
    settings.MAINTENANCE_INLINE_DRY_RUN_MAX_ENTRIES = 3
    inline = post_run("/maintenance/run", agent, {})
    assert inline.status_code == 200
    assert inline.json()["counts"]["evicted"] == 3
    settings.MAINTENANCE_INLINE_DRY_RUN_MAX_ENTRIES = 2
    queued = post_run("/maintenance/run", agent, {})
    assert queued.status_code == 202
    assert queued.json()["dry_run"] is True
    done = finish_queued(queued, agent)
    assert (done["status"], done["dry_run"]) == ("succeeded", True)
    assert done["result"]["counts"] == inline.json()["counts"]
    assert Entry.objects.filter(status="active").count() == 3


def test_a_queued_run_no_worker_starts_is_given_up_visibly(workspace, key):
    operator = key("operator")
    response = post_run("/maintenance/run", operator, {"dry_run": False})
    run_id = response.json()["run_id"]
    assert get(f"/maintenance/runs/{run_id}", operator).json()["status"] == "queued"
    MaintenanceRun.objects.filter(pk=run_id).update(started_at=timezone.now() - timedelta(hours=3))
    dispatch_due_maintenance()  # every two minutes on the schedule
    run = get(f"/maintenance/runs/{run_id}", operator).json()
    assert run["status"] == "failed"
    assert "never started" in run["error"]
    assert run_queued(run_id) is None  # its task, should it come after all, does nothing


def test_a_task_delivered_after_the_give_up_time_applies_nothing(workspace, key):
    """The worker was down for hours: its waiting task comes before any dispatcher pass has
    given the run up; it gives it up itself instead of applying an hours-old request."""
    cold(workspace)
    operator = key("operator")
    response = post_run("/maintenance/sweep-decay", operator, {"dry_run": False})
    run_id = response.json()["run_id"]
    MaintenanceRun.objects.filter(pk=run_id).update(started_at=timezone.now() - timedelta(hours=3))
    assert run_queued(run_id) is None
    run = get(f"/maintenance/runs/{run_id}", operator).json()
    assert run["status"] == "failed" and "never started" in run["error"]
    assert not LifecycleEvent.objects.filter(run_id=run_id).exists()
    assert Entry.objects.filter(workspace=workspace, status="tombstoned").count() == 0


def test_the_dispatcher_does_not_add_a_full_run_beside_a_queued_one(workspace, key):
    post_run("/maintenance/run", key("operator"), {"dry_run": False})
    enqueued = dispatch_due_maintenance()["enqueued"]
    assert {"workspace": "acme", "kind": "full"} not in enqueued


def test_progress_is_recorded_once_per_pass_and_ends_done(workspace, key, monkeypatch):
    cold(workspace, 2)
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(live, "run_progress", lambda run: seen.append(dict(run.progress)))
    result = run_maintenance(workspace=workspace, kind="decay")
    keys = [key for key, _ in steps("decay")]
    assert [p["pass"] for p in seen] == keys + keys  # the plan's passes, then the apply's
    assert [p["phase"] for p in seen] == ["plan"] * len(keys) + ["apply"] * len(keys)
    assert all(p["steps"] == len(keys) for p in seen)
    applied = seen[len(keys) :]
    assert [p["step"] for p in applied] == list(range(1, len(keys) + 1))
    done_rows = [p["rows_done"] for p in applied]
    assert done_rows == sorted(done_rows) and done_rows[-1] > 0
    progress = MaintenanceRun.objects.get(pk=result["run_id"]).progress
    assert progress["phase"] == "done"
    counted = [v for v in result["counts"].values() if isinstance(v, int)]  # reclaimed_rows is by kind
    assert progress["rows_done"] == sum(counted) + sum(result["counts"]["reclaimed_rows"].values())
    assert progress["elapsed_s"] >= 0


def test_the_row_keeps_a_bounded_sample_and_the_api_pages_every_affected_id(workspace, key, monkeypatch):
    monkeypatch.setattr(run_results, "AFFECTED_KEPT", 2)
    entries = sorted(e.pk for e in cold(workspace, 5))
    agent = key("agent")
    dry = run_maintenance(workspace=workspace, kind="decay", dry_run=True)
    real = run_maintenance(workspace=workspace, kind="decay")
    assert real["affected"]["tombstoned"] == entries  # the caller gets every id
    row = MaintenanceRun.objects.get(pk=real["run_id"])
    assert row.affected["tombstoned"] == entries[:2]
    assert row.result["affected"]["tombstoned"] == entries[:2]
    assert [e["id"] for e in row.result["sweep"]["evicted"]] == entries[:2]
    assert row.affected_total["tombstoned"] == 5
    detail = get(f"/maintenance/runs/{real['run_id']}", agent).json()
    assert detail["affected"]["tombstoned"] == entries[:2]
    assert detail["affected_total"]["tombstoned"] == 5
    pages = [
        get(f"/maintenance/runs/{real['run_id']}/affected?action=tombstoned&limit=2&offset={o}", agent).json()
        for o in (0, 2, 4, 6)
    ]
    assert [p["count"] for p in pages] == [5] * 4
    assert all(p["complete"] for p in pages)
    assert [i for p in pages for i in p["items"]] == entries
    assert pages[-1]["items"] == []
    # A dry run changed nothing: its record is all there is, and says it is partial.
    dry_page = get(f"/maintenance/runs/{dry['run_id']}/affected?action=tombstoned", agent).json()
    assert (dry_page["count"], dry_page["items"], dry_page["complete"]) == (5, entries[:2], False)
    bad = get(f"/maintenance/runs/{real['run_id']}/affected?action=everything", agent)
    assert bad.status_code == 422


def test_a_run_recorded_before_the_sample_is_paged_and_reverted_from_its_events(workspace, key):
    entries = sorted(e.pk for e in cold(workspace, 3))
    real = run_maintenance(workspace=workspace, kind="decay")
    # As rows were recorded before: every id on the row, no totals (or, cleared, nothing).
    MaintenanceRun.objects.filter(pk=real["run_id"]).update(affected={}, affected_total={}, result={})
    agent = key("agent")
    page = get(f"/maintenance/runs/{real['run_id']}/affected?action=tombstoned", agent).json()
    assert (page["count"], page["items"]) == (3, entries)
    reverted = revert_run(workspace, real["run_id"], actor="op")
    assert reverted["reverted"] == entries
    assert set(Entry.objects.filter(pk__in=entries).values_list("status", flat=True)) == {"active"}


def test_the_run_page_lists_a_real_runs_entries_from_its_events(workspace, monkeypatch):
    from django.contrib.auth import get_user_model

    monkeypatch.setattr(run_results, "AFFECTED_KEPT", 1)
    entries = sorted(e.pk for e in cold(workspace, 3))
    real = run_maintenance(workspace=workspace, kind="decay")
    user = get_user_model().objects.create_user(username="viewer", password="x")
    accounts.membership_set(workspace=workspace, user=user, role="viewer")
    client = Client()
    client.force_login(user)
    html = client.get(f"/console/acme/runs/{real['run_id']}/").content.decode()
    for pk in entries:
        assert f"/console/acme/entries/{pk}/" in html
    assert 'id="run-progress-' in html and 'data-ended="1"' in html


def test_a_queued_run_page_says_it_is_queued(workspace, key):
    from django.contrib.auth import get_user_model

    response = post_run("/maintenance/run", key("operator"), {"dry_run": False})
    user = get_user_model().objects.create_user(username="viewer", password="x")
    accounts.membership_set(workspace=workspace, user=user, role="viewer")
    client = Client()
    client.force_login(user)
    html = client.get(f"/console/acme/runs/{response.json()['run_id']}/").content.decode()
    assert "Queued" in html and "waiting for a worker" in html
    assert 'data-ended="0"' in html


# --- a real server and its real qcluster ------------------------------------------------------------

WAIT = 120  # seconds a wait below may take before the test gives up (never reached when right)


@pytest.fixture(scope="module")
def worker_db(tmp_path_factory, django_db_blocker) -> Iterator[dict[str, str]]:
    """A migrated database of its own with one seeded workspace: the environment of the server."""
    folder = tmp_path_factory.mktemp("queued")
    url, drop = migrated_database(f"ms_queued_{uuid.uuid4().hex[:12]}", folder)
    env = subprocess_env(url, folder / "backups")
    env.update(Q_WORKERS="1", LOG_LEVEL="INFO")
    try:
        args = ["seed", "--workspace", "w", "--entries", "120", "--now", timezone.now().isoformat()]
        helper([*args, "--review-mode", "apply"], env)
        yield env
    finally:
        if drop is not None:
            drop()


def _http(method: str, url: str, key: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {key}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/api/v1/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def test_a_202_run_is_worked_by_the_real_qcluster_and_its_end_shows_in_the_api(worker_db, tmp_path):
    key = json.loads(helper(["api-key", "--workspace", "w", "--role", "operator"], worker_db))["key"]
    port = free_port()
    log = tmp_path / "serve.log"
    proc = subprocess_start([sys.executable, "manage.py", "serve", "--port", str(port)], worker_db, log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("the server", lambda: _healthy(base), timeout=WAIT)
        status, body = _http("POST", f"{base}/api/v1/maintenance/run", key, {"dry_run": False})
        assert status == 202, body
        assert body["status"] == "queued"
        seen: list[dict] = []

        def ended() -> dict | None:
            run = _http("GET", base + body["url"], key)[1]
            seen.append(run)
            return run if run["status"] not in ("queued", "running") else None

        run = wait_for("the worker to finish the run", ended, timeout=WAIT)
        assert run["status"] == "succeeded", run["error"]
        assert run["result"]["run_id"] == body["run_id"]
        assert run["result"]["counts"]["scored"] == 120
        assert run["progress"]["phase"] == "done"
        assert run["progress"]["steps"] == len(steps("full"))
        assert run["progress"]["rows_done"] == rows_done(run["result"]["counts"])
        assert run["started_at"] and run["finished_at"]
        assert {r["status"] for r in seen} <= {"queued", "running", "succeeded"}
    finally:
        stop_tree(proc, signal.SIGTERM, group=False, timeout=60)
        kill_tree(proc.pid)
    output = log.read_text(errors="replace")
    assert "Traceback" not in output


def subprocess_start(args: list[str], env: dict[str, str], log: Path) -> Any:
    with log.open("wb") as out:  # the child writes through its own copy of the file
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def test_the_mcp_preview_of_a_large_workspace_answers_the_queued_run_as_a_result(workspace, settings):
    """memory_maintenance_preview's run, through the tool's own function and out-schema (the
    MCP server's path to its result): queued, it is a result naming the run, not an error."""
    from django.test import RequestFactory

    from api import mcp_calls, mcp_tools
    from memory.auth import Principal

    cold(workspace, 3)
    request = RequestFactory().post("/mcp")
    request.principal = Principal(workspace=workspace, role="agent", actor="key:test")  # type: ignore[attr-defined]
    spec = next(t for t in mcp_tools.TOOLS if t.name == "memory_maintenance_preview")
    args = spec.args.model_validate({"kind": "decay", "top": 2})
    inline, _ = mcp_calls.dump(spec.out, spec.run(request, args), request)
    assert (inline["status"], inline["affected_counts"]["tombstoned"]) == ("succeeded", 3)
    assert inline["url"] is None
    settings.MAINTENANCE_INLINE_DRY_RUN_MAX_ENTRIES = 2
    queued, _ = mcp_calls.dump(spec.out, spec.run(request, args), request)
    assert (queued["status"], queued["dry_run"], queued["kind"]) == ("queued", True, "decay")
    assert queued["url"] == f"/api/v1/maintenance/runs/{queued['run_id']}"
    assert queued["counts"] is None and queued["affected_top"] is None
    assert "queued for the worker" in queued["note"]
    assert work_queued_runs() == [queued["run_id"]]
    assert MaintenanceRun.objects.get(pk=queued["run_id"]).counts["evicted"] == 3


@pytest.mark.django_db(transaction=True)
def test_the_plans_progress_is_written_from_a_side_connection(monkeypatch, settings, tmp_path):
    """The plan is one transaction, rolled back at its end: its progress is committed from a
    connection of its own, so others see which pass the plan is in (on SQLite too: the plan
    reads a copy of the database and leaves the write lock to others)."""
    from maintenance import passes
    from tests.helpers_runs import read_aside

    settings.BACKUP_DIR = tmp_path / "backups"
    ws = accounts.workspace_create(slug="long-plan", name="Long plan", review_mode="apply")
    cold(ws, 2)
    monkeypatch.setattr(runs, "ASIDE_EVERY", 0.0)
    seen: list[dict[str, Any]] = []
    original = passes.mark_stale

    def watched(ctx):
        if ctx.planning:
            sql = "SELECT progress FROM maintenance_maintenancerun WHERE id = %s"
            progress = read_aside(sql, [ctx.run.pk])
            seen.append(json.loads(progress) if isinstance(progress, str) else progress)
        return original(ctx)

    monkeypatch.setattr(passes, "mark_stale", watched)
    result = run_maintenance(workspace=ws, dry_run=True)
    assert result["status"] == "succeeded"
    keys = [key for key, _ in steps("full")]
    assert len(seen) == 1
    assert (seen[0]["phase"], seen[0]["pass"], seen[0]["step"]) == (
        "plan",
        "stale_marked",
        keys.index("stale_marked") + 1,
    )
    assert MaintenanceRun.objects.get(pk=result["run_id"]).progress["phase"] == "done"
    # The open run page was told too: the outbox row (the embedded layer) written beside the
    # progress survived the plan's rollback.
    told = [m.html for m in LiveMessage.objects.filter(workspace_id=ws.pk) if "planning, pass" in m.html]
    assert any('title="stale_marked">marked stale<' in html for html in told), told


def test_a_blocked_runs_affected_entries_are_the_ones_its_record_keeps(workspace, key):
    entries = sorted(e.pk for e in cold(workspace, 21))
    blocked = run_maintenance(workspace=workspace, kind="decay")
    assert blocked["status"] == "blocked"
    page = get(f"/maintenance/runs/{blocked['run_id']}/affected?action=tombstoned&limit=500", key("agent"))
    assert (page.json()["count"], page.json()["items"], page.json()["complete"]) == (21, entries, True)


# --- a broker that refuses the task ----------------------------------------------------------------


@pytest.fixture
def refusing_broker(monkeypatch) -> None:
    """django-q2 configured for a Redis broker at a port nothing listens on (Redis down): the
    task is sent after the run's row commits, and sending it fails."""
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", f"redis://127.0.0.1:{free_port()}/0")


@pytest.mark.django_db(transaction=True)  # the task is sent once the run's row has committed
def test_a_run_the_broker_refuses_fails_at_once_and_answers_503(workspace, key, refusing_broker):
    (entry,) = cold(workspace)
    response = post_run("/maintenance/run", key("operator"), {"dry_run": False})
    assert response.status_code == 503, response.content
    body = response.json()
    assert body["detail"] == "the task queue did not accept the run; the run was recorded as failed"
    run = MaintenanceRun.objects.get(pk=body["run_id"])
    assert run.status == "failed" and run.finished_at is not None
    assert run.error.startswith("the task queue did not accept the run: ") and "ConnectionError" in run.error
    assert Entry.objects.get(pk=entry.pk).status == "active"
    # Nothing waits for a worker, so the next request is not refused for a queued one.
    again = post_run("/maintenance/run", key("operator"), {"dry_run": False})
    assert again.status_code == 503 and again.json()["run_id"] != run.pk


@pytest.mark.django_db(transaction=True)
def test_run_now_the_broker_refuses_shows_the_failed_run(workspace, refusing_broker):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username="op", password="x")
    accounts.membership_set(workspace=workspace, user=user, role="operator")
    client = Client()
    client.force_login(user)
    response = client.post("/console/acme/run/", {"dry_run": "0"})
    assert response.status_code == 303, response.content
    run = MaintenanceRun.objects.get()
    assert response["Location"] == f"/console/acme/runs/{run.pk}/"
    assert run.status == "failed"
    html = client.get(response["Location"]).content.decode()
    assert "the task queue did not accept the run" in html
