"""Queued runs in tests: execute the tasks the API and the console put in django-q2's queue
(the ORM broker's ``OrmQ`` rows), as a worker does, in this process. What a real worker does with
them is proven against a real ``qcluster`` (tests/test_queued_runs.py)."""

from __future__ import annotations

import json
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.test import Client
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from maintenance.tasks import QUEUED_TASK, run_queued


def queued_tasks() -> list[dict[str, Any]]:
    """The queued-run tasks waiting in the broker, oldest first."""
    found = []
    for row in OrmQ.objects.order_by("pk"):
        task = SignedPackage.loads(row.payload)
        if isinstance(task, dict) and task.get("func") == QUEUED_TASK:
            found.append({"row": row.pk, **task})
    return found


def work_queued_runs() -> list[int]:
    """Take every queued-run task off the queue and execute it, as a worker would; return the
    run ids it named."""
    ids = []
    for task in queued_tasks():
        OrmQ.objects.filter(pk=task["row"]).delete()
        (run_id,) = task["args"]
        run_queued(run_id)
        ids.append(run_id)
    return ids


def finish_queued(response: Any, key: str | None = None, client: Client | None = None, **extra: Any) -> dict:
    """A POST that queued a run (202 with run id, status queued, url): let the worker do the
    run, then read it back from its url. Returns the run detail (``result`` is its result
    object)."""
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "queued"
    assert body["url"] == f"/api/v1/maintenance/runs/{body['run_id']}"
    assert body["run_id"] in work_queued_runs()
    client = client or Client()
    if key:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    detail = client.get(body["url"], **extra)
    assert detail.status_code == 200, detail.content
    run = detail.json()
    assert run["status"] not in ("queued", "running")
    assert run["result"]["run_id"] == body["run_id"]
    return run


def post_run(path: str, key: str, body: dict | None = None) -> Any:
    """POST a run to the API with a key (no client state)."""
    return Client().post(
        f"/api/v1{path}",
        data=json.dumps(body or {}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )


def read_aside(sql: str, params: list[Any]) -> Any:
    """The first column of the first row of ``sql``, read through a connection of its own: what
    other processes see while a plan runs (on PostgreSQL its own connection sees the same
    after a commit; on SQLite the plan's connection reads its private copy of the database)."""
    side = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with side.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()[0]
    finally:
        side.close()
