"""The maintenance endpoints: runs and their roles, history, revert, tombstones,
backups, stats and policy."""

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api.maintenance_schemas import CountsOut
from api.policy_schemas import PolicyIn, PolicyOut
from maintenance.lease import acquire, new_holder
from maintenance.models import Backup, MaintenanceRun
from maintenance.run_results import COUNT_KEYS, rows_done
from memory import accounts, entry_changes, new_entries, relationships
from memory.models import ApiKey, Entry, Tombstone
from memory.policy import LIMITS
from memory.policy_model import MaintenancePolicy
from tests.helpers_runs import finish_queued

pytestmark = pytest.mark.django_db

CSRF = "a" * 32  # any 32-character alphanumeric secret is a valid CSRF cookie and token


@pytest.fixture(autouse=True)
def _backups(settings, tmp_path):
    settings.BACKUP_DIR = tmp_path


@pytest.fixture
def key(workspace):
    """key(role) → the raw secret of a new key of that role in the workspace."""

    def make(role: str, ws=None) -> str:
        return accounts.api_key_create(workspace=ws or workspace, name=f"{role} key", role=role)[1]

    return make


def call(method: str, path: str, key: str | None = None, body=None, client: Client | None = None, **extra):
    client = client or Client()
    if key:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    kwargs = {}
    if body is not None:
        kwargs = {"data": json.dumps(body), "content_type": "application/json"}
    return getattr(client, method.lower())(f"/api/v1{path}", **kwargs, **extra)


def member_client(workspace, role: str) -> tuple[Client, dict]:
    """A logged-in member's browser: its client and the headers it sends (workspace, CSRF)."""
    user = get_user_model().objects.create_user(username=f"{role}-{workspace.slug}", password="x")
    accounts.membership_set(workspace=workspace, user=user, role=role)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.cookies["csrftoken"] = CSRF
    return client, {"HTTP_X_WORKSPACE": workspace.slug, "HTTP_X_CSRFTOKEN": CSRF}


def applied(path: str, key: str, body=None) -> dict:
    """A real run through the API: queued (202), done by the worker, read back; its result."""
    return finish_queued(call("POST", path, key, {} if body is None else body), key)["result"]


def make(workspace, *, age_days: float = 0.0, **fields) -> Entry:
    now = timezone.now()
    entry = new_entries.entry_create(
        workspace=workspace,
        content=fields.pop("content", f"memory {Entry.objects.count()} about caching and retries"),
        created_at=now - timedelta(days=age_days),
        now=now - timedelta(days=age_days),
        tags=fields.pop("tags", None),
    )
    if fields:
        Entry.objects.filter(pk=entry.pk).update(**fields)
    entry.refresh_from_db()
    return entry


def status(entry: Entry) -> str:
    return Entry.objects.get(pk=entry.pk).status


def cold(workspace) -> Entry:
    """An episodic entry old enough for the decay pass to tombstone it (retention < 0.2)."""
    return make(workspace, age_days=200)


# --- POST /maintenance/run ------------------------------------------------------------------


def test_an_agent_run_defaults_to_a_dry_run_that_changes_nothing(workspace, key):
    entry = cold(workspace)
    agent = key("agent")
    response = call("POST", "/maintenance/run", agent, {})
    assert response.status_code == 200
    result = response.json()
    assert result["dry_run"] is True
    assert result["status"] == "succeeded"
    assert result["counts"]["evicted"] == 1
    assert result["affected"]["tombstoned"] == [entry.pk]
    assert status(entry) == "active"
    run = MaintenanceRun.objects.get(pk=result["run_id"])
    assert run.result == result
    assert (run.kind, run.trigger, run.dry_run) == ("full", "api", True)
    assert run.actor == accounts.actor_for_key(ApiKey.objects.get(role="agent"))


def test_a_run_without_a_body_is_a_run_with_the_defaults(workspace, key):
    response = Client().post(
        "/api/v1/maintenance/run",
        data=b"",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key('agent')}",
    )
    assert response.status_code == 200
    assert response.json()["dry_run"] is True


def test_an_agent_may_not_apply_a_run(workspace, key):
    entry = cold(workspace)
    response = call("POST", "/maintenance/run", key("agent"), {"dry_run": False})
    assert response.status_code == 403
    assert "operator" in response.json()["detail"]
    assert not MaintenanceRun.objects.exists()
    assert status(entry) == "active"


def test_an_operator_run_applies_by_default_after_a_backup(workspace, key, tmp_path):
    entry = cold(workspace)
    operator = key("operator")
    response = call("POST", "/maintenance/run", operator, {})
    assert response.status_code == 202
    queued = response.json()
    assert (queued["kind"], queued["dry_run"], queued["status"]) == ("full", False, "queued")
    # Queued, not worked in the request: nothing changed yet, and the run says so.
    assert status(entry) == "active"
    assert queued["url"] == f"/api/v1/maintenance/runs/{queued['run_id']}"
    waiting = call("GET", f"/maintenance/runs/{queued['run_id']}", operator).json()
    assert (waiting["status"], waiting["result"], waiting["progress"]) == ("queued", {}, {})
    run = finish_queued(response, operator)
    result = run["result"]
    assert (result["dry_run"], result["status"]) == (False, "succeeded")
    assert status(entry) == "tombstoned"
    assert result["backup_file"].startswith("pre-prune-backup-")
    assert list(tmp_path.rglob(result["backup_file"]))
    assert MaintenanceRun.objects.get(pk=result["run_id"]).result == result
    assert run["progress"]["phase"] == "done"
    assert run["progress"]["rows_done"] == rows_done(result["counts"])


def test_an_operator_may_ask_for_a_dry_run(workspace, key):
    entry = cold(workspace)
    result = call("POST", "/maintenance/run", key("operator"), {"dry_run": True}).json()
    assert result["dry_run"] is True
    assert status(entry) == "active"


def test_the_run_result_has_every_count_of_the_spec(workspace, key):
    result = call("POST", "/maintenance/run", key("admin"), {"dry_run": True}).json()
    assert list(result["counts"]) == list(COUNT_KEYS)
    assert list(CountsOut.model_fields) == list(COUNT_KEYS)


@pytest.mark.parametrize(
    "body",
    [{"dry_run": "false"}, {"dry_run": 0}, {"force": "yes"}, {"dry_run": True, "kind": "prune"}, []],
    ids=["string-bool", "int-bool", "string-force", "unknown-key", "not-an-object"],
)
def test_run_bodies_must_be_exact(workspace, key, body):
    response = call("POST", "/maintenance/run", key("operator"), body)
    assert response.status_code == 422
    assert not MaintenanceRun.objects.exists()


def test_a_malformed_body_is_a_400(workspace, key):
    response = Client().post(
        "/api/v1/maintenance/run",
        data="{",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key('operator')}",
    )
    assert response.status_code == 400
    assert "detail" in response.json()


def test_a_viewer_session_cannot_run_even_a_dry_run(workspace):
    client, headers = member_client(workspace, "viewer")
    response = call("POST", "/maintenance/run", body={"dry_run": True}, client=client, **headers)
    assert response.status_code == 403
    assert not MaintenanceRun.objects.exists()


def test_an_operator_session_runs_with_csrf_and_not_without(workspace):
    client, headers = member_client(workspace, "operator")
    response = call("POST", "/maintenance/run", body={}, client=client, **headers)
    assert response.status_code == 202
    assert response.json()["dry_run"] is False
    assert finish_queued(response, client=client, **headers)["status"] == "succeeded"
    assert MaintenanceRun.objects.get().actor.startswith("user:")
    no_csrf = {"HTTP_X_WORKSPACE": workspace.slug}
    response = call("POST", "/maintenance/run", body={}, client=client, **no_csrf)
    assert response.status_code in (401, 403)
    assert MaintenanceRun.objects.count() == 1


@pytest.mark.parametrize("path", ["/maintenance/run", "/maintenance/prune", "/maintenance/sweep-decay"])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry", "real"])
def test_a_run_refused_by_the_lease_answers_409_naming_the_running_run(workspace, key, path, dry_run):
    running = MaintenanceRun.objects.create(
        workspace=workspace, kind="full", trigger="schedule", status="running", started_at=timezone.now()
    )
    assert acquire(workspace, holder=new_holder(), now=timezone.now(), run=running)
    response = call("POST", path, key("operator"), {"dry_run": dry_run})
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["running_run_id"] == running.pk
    assert f"run {running.pk}" in body["detail"]
    skipped = MaintenanceRun.objects.get(pk=body["run_id"])  # the refused run is still recorded
    assert (skipped.status, skipped.dry_run) == ("skipped", dry_run)
    assert MaintenanceRun.objects.get(pk=running.pk).status == "running"


def test_a_lease_held_by_no_run_is_refused_too(workspace, key):
    # A holder without a run row (the lease taken by hand, or its run finished meanwhile).
    assert acquire(workspace, holder=new_holder(), now=timezone.now())
    response = call("POST", "/maintenance/run", key("agent"), {})
    assert response.status_code == 409
    body = response.json()
    assert body["running_run_id"] is None
    assert MaintenanceRun.objects.get(pk=body["run_id"]).status == "skipped"


def test_the_circuit_breaker_blocks_a_mass_deletion_unless_forced(workspace, key):
    entries = [cold(workspace) for _ in range(21)]
    operator = key("operator")
    blocked = applied("/maintenance/run", operator)
    assert blocked["status"] == "blocked"
    assert blocked["counts"]["evicted"] == 21
    assert all(status(e) == "active" for e in entries)
    forced = applied("/maintenance/run", operator, {"force": True})
    assert forced["status"] == "succeeded"
    assert all(status(e) == "tombstoned" for e in entries)
    assert MaintenanceRun.objects.get(pk=forced["run_id"]).forced


# --- POST /maintenance/prune ------------------------------------------------------------------


def test_prune_takes_the_callers_parameters_and_answers_in_the_prune_shape(workspace, key):
    old = make(workspace, age_days=40, importance=0.01)
    kept = make(workspace, age_days=40, importance=0.01, tags=["keep"])
    young = make(workspace, age_days=5, importance=0.01)
    body = {"prune_older_than_days": 30, "importance_threshold": 1.0, "exclude_tags": ["keep"]}
    response = call("POST", "/maintenance/prune", key("agent"), body)
    assert response.status_code == 200
    result = response.json()
    assert list(result) == [
        "success",
        "archived_count",
        "pruned_count",
        "hard_deleted_count",
        "backup_file",
        "dry_run",
        "run_id",
        "status",
    ]
    assert (result["success"], result["dry_run"], result["pruned_count"]) == (True, True, 1)
    run = MaintenanceRun.objects.get(pk=result["run_id"])
    assert (run.kind, run.params["prune_older_than_days"], run.params["exclude_tags"]) == (
        "prune",
        30,
        ["keep"],
    )
    assert [status(e) for e in (old, kept, young)] == ["active"] * 3
    operator = key("operator")
    response = call("POST", "/maintenance/prune", operator, body)
    assert response.status_code == 202
    assert list(response.json()) == ["run_id", "kind", "dry_run", "status", "url"]
    done = finish_queued(response, operator)
    assert (done["kind"], done["dry_run"], done["result"]["counts"]["pruned"]) == ("prune", False, 1)
    assert done["backup_file"]
    assert (done["params"]["prune_older_than_days"], done["params"]["exclude_tags"]) == (30, ["keep"])
    assert [status(e) for e in (old, kept, young)] == ["tombstoned", "active", "active"]


def test_prune_parameters_left_out_come_from_the_policy(workspace, key):
    MaintenancePolicy.objects.filter(workspace=workspace).update(prune_older_than_days=77)
    result = call("POST", "/maintenance/prune", key("agent"), {"importance_threshold": 0.5}).json()
    params = MaintenanceRun.objects.get(pk=result["run_id"]).params
    assert (params["prune_older_than_days"], params["importance_threshold"]) == (77, 0.5)


@pytest.mark.parametrize(
    "body",
    [
        {"importance_threshold": 1.5},
        {"importance_threshold": -0.1},
        {"prune_older_than_days": -1},
        {"prune_older_than_days": LIMITS["prune_older_than_days"].high + 1},
        {"archive_older_than_days": "30"},
        {"hard_delete_older_than_days": 2.5},
        {"exclude_tags": "keep"},
        {"exclude_tags": [1]},
        {"stale_after_days": 10},
    ],
    ids=lambda body: json.dumps(body),
)
def test_prune_parameters_outside_the_policy_ranges_are_refused(workspace, key, body):
    response = call("POST", "/maintenance/prune", key("operator"), body)
    assert response.status_code == 422
    assert not MaintenanceRun.objects.exists()


def test_an_agent_may_not_apply_a_prune(workspace, key):
    response = call("POST", "/maintenance/prune", key("agent"), {"dry_run": False})
    assert response.status_code == 403


# --- POST /maintenance/sweep-decay ------------------------------------------------------------


def test_the_decay_sweep_answers_in_the_decay_shape(workspace, key):
    entry = cold(workspace)
    expiring = make(workspace, expires_at=timezone.now() - timedelta(hours=1))
    response = call("POST", "/maintenance/sweep-decay", key("agent"), {})
    assert response.status_code == 200
    result = response.json()
    assert list(result) == [
        "dry_run",
        "candidates_evaluated",
        "evicted",
        "expired",
        "hard_deleted",
        "run_id",
        "status",
    ]
    assert result["dry_run"] is True
    assert [e["id"] for e in result["evicted"]] == [entry.pk]
    assert set(result["evicted"][0]) == {"id", "retention", "age_days", "access_count"}
    assert result["evicted"][0]["age_days"] == pytest.approx(200, abs=0.01)
    assert [e["id"] for e in result["expired"]] == [expiring.pk]
    assert MaintenanceRun.objects.get(pk=result["run_id"]).kind == "decay"
    assert status(entry) == "active"
    operator = key("operator")
    done = finish_queued(call("POST", "/maintenance/sweep-decay", operator, {}), operator)
    assert (done["kind"], done["dry_run"]) == ("decay", False)
    assert [e["id"] for e in done["result"]["sweep"]["evicted"]] == [entry.pk]
    assert (status(entry), status(expiring)) == ("tombstoned", "tombstoned")


def test_an_agent_may_not_apply_a_decay_sweep(workspace, key):
    assert call("POST", "/maintenance/sweep-decay", key("agent"), {"dry_run": False}).status_code == 403


# --- GET /maintenance/runs, /maintenance/runs/{id} ----------------------------------------------


def add_runs(workspace, n: int, **fields) -> list[MaintenanceRun]:
    start = timezone.now() - timedelta(days=1)
    return MaintenanceRun.objects.bulk_create(
        MaintenanceRun(
            workspace=workspace,
            kind=fields.get("kind", "full"),
            trigger="cli",
            status=fields.get("status", "succeeded"),
            started_at=start + timedelta(minutes=i),
            counts={"scored": i},
        )
        for i in range(n)
    )


def test_the_run_history_is_paginated_newest_first_with_counts(workspace, key):
    runs = add_runs(workspace, 7)
    response = call("GET", "/maintenance/runs?limit=3&offset=1", key("agent"))
    assert response.status_code == 200
    data = response.json()
    assert (data["count"], data["limit"], data["offset"]) == (7, 3, 1)
    assert [r["id"] for r in data["items"]] == [runs[5].pk, runs[4].pk, runs[3].pk]
    assert data["items"][0]["counts"] == {"scored": 5}
    assert "affected" not in data["items"][0]
    assert call("GET", "/maintenance/runs?offset=100", key("agent")).json()["items"] == []


def test_the_run_history_filters_by_kind_and_status(workspace, key):
    add_runs(workspace, 2, kind="decay")
    add_runs(workspace, 3, kind="full", status="failed")
    add_runs(workspace, 1, kind="full")
    agent = key("agent")
    assert call("GET", "/maintenance/runs?kind=decay", agent).json()["count"] == 2
    assert call("GET", "/maintenance/runs?kind=full&status=failed", agent).json()["count"] == 3
    assert call("GET", "/maintenance/runs?kind=nope", agent).status_code == 422


@pytest.mark.parametrize("query", ["limit=0", "limit=501", "offset=-1", "limit=abc"])
def test_list_bounds_are_enforced(workspace, key, query):
    for path in ("/maintenance/runs", "/tombstones", "/backups"):
        assert call("GET", f"{path}?{query}", key("agent")).status_code == 422


def queries_for(path: str, key: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = call("GET", path, key)
    assert response.status_code == 200, response.content
    return len(ctx.captured_queries)


def test_every_list_takes_as_many_queries_for_50_items_as_for_5(workspace, key, other_workspace):
    add_runs(workspace, 50)
    for i in range(50):
        entry_changes.entry_tombstone(workspace=workspace, entry_id=make(workspace).pk)
        Backup.objects.create(workspace=workspace, file_name=f"manual-backup-{i}.jsonl.gz", reason="manual")
    agent = key("agent")
    call("GET", "/stats", agent)  # the key's first use writes last_used_at; later ones don't
    for path in ("/maintenance/runs", "/tombstones", "/backups"):
        small, large = queries_for(f"{path}?limit=5", agent), queries_for(f"{path}?limit=50", agent)
        assert small == large, path
        data = call("GET", f"{path}?limit=50", agent).json()
        assert (data["count"], len(data["items"])) == (50, 50)


def test_a_run_shows_its_result_parameters_and_times(workspace, key):
    result = call("POST", "/maintenance/run", key("operator"), {"dry_run": True}).json()
    response = call("GET", f"/maintenance/runs/{result['run_id']}", key("agent"))
    assert response.status_code == 200
    run = response.json()
    stored = MaintenanceRun.objects.get(pk=result["run_id"])
    assert run["result"] == stored.result == result
    assert run["params"] == stored.params
    assert run["params"]["importance_threshold"] == 0.15
    assert (run["trigger"], run["error"], run["status"]) == ("api", "", "succeeded")
    assert run["started_at"] and run["finished_at"]
    assert run["affected"] == stored.affected


def test_runs_of_another_workspace_are_not_found(workspace, other_workspace, key):
    foreign = add_runs(other_workspace, 1)[0]
    agent, operator = key("agent"), key("operator")
    assert call("GET", f"/maintenance/runs/{foreign.pk}", agent).status_code == 404
    assert call("POST", f"/maintenance/runs/{foreign.pk}/revert", operator).status_code == 404
    assert call("GET", "/maintenance/runs", agent).json()["count"] == 0
    assert call("GET", "/maintenance/runs/999999", agent).status_code == 404
    assert call("GET", "/maintenance/runs/0", agent).status_code == 422


# --- POST /maintenance/runs/{id}/revert --------------------------------------------------------


def test_an_operator_reverts_what_a_run_did(workspace, key):
    entry = cold(workspace)
    operator = key("operator")
    result = applied("/maintenance/run", operator)
    assert status(entry) == "tombstoned"
    assert call("POST", f"/maintenance/runs/{result['run_id']}/revert", key("agent")).status_code == 403
    response = call("POST", f"/maintenance/runs/{result['run_id']}/revert", operator)
    assert response.status_code == 200
    assert response.json() == {
        "run_id": result["run_id"],
        "reverted": [entry.pk],
        "skipped": [],
        "links_restored": 0,
        "summaries_archived": [],
    }
    # Back where the run found it: it was stale before it was tombstoned (marking stale removes
    # nothing, so a run revert leaves it).
    assert status(entry) == "stale"
    assert Tombstone.objects.get(entry=entry).restored_at is not None


# --- GET /tombstones ---------------------------------------------------------------------------


def test_tombstones_are_open_ones_with_their_countdown_unless_asked(workspace, key):
    MaintenancePolicy.objects.filter(workspace=workspace).update(tombstone_grace_days=10)
    open_one, restored, purged = make(workspace), make(workspace), make(workspace)
    for entry in (open_one, restored, purged):
        entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, reason="api", actor="key:x")
    entry_changes.entry_restore(workspace=workspace, entry_id=restored.pk)
    Tombstone.objects.filter(entry=purged).update(purged_at=timezone.now())
    viewer_client, headers = member_client(workspace, "viewer")
    response = call("GET", "/tombstones", client=viewer_client, **headers)
    assert response.status_code == 200
    data = response.json()
    assert data["count"] == 1
    item = data["items"][0]
    assert (item["entry_id"], item["lineage_id"], item["reason"], item["actor"]) == (
        open_one.pk,
        open_one.lineage_id or open_one.pk,
        "api",
        "key:x",
    )
    assert (item["previous_status"], item["run_id"], item["restored_at"]) == ("active", None, None)
    assert 10 * 86400 - 60 < item["seconds_until_purge"] <= 10 * 86400
    agent = key("agent")
    both = call("GET", "/tombstones?include_restored=true&include_purged=true", agent).json()
    assert both["count"] == 3
    by_entry = {t["entry_id"]: t for t in both["items"]}
    assert by_entry[restored.pk]["seconds_until_purge"] is None
    assert by_entry[purged.pk]["purged_at"] is not None
    assert call("GET", "/tombstones?reason=decay", agent).json()["count"] == 0
    assert call("GET", "/tombstones?reason=bogus", agent).status_code == 422


def test_tombstones_filter_by_run(workspace, key):
    entry = cold(workspace)
    result = applied("/maintenance/run", key("operator"))
    agent = key("agent")
    data = call("GET", f"/tombstones?run_id={result['run_id']}", agent).json()
    assert [t["entry_id"] for t in data["items"]] == [entry.pk]
    assert data["items"][0]["reason"] == "decay"
    assert call("GET", f"/tombstones?run_id={result['run_id'] + 1}", agent).json()["count"] == 0


# --- GET /backups ------------------------------------------------------------------------------


def test_backups_list_the_pre_prune_backup_of_a_run(workspace, key):
    cold(workspace)
    result = applied("/maintenance/run", key("operator"))
    client, headers = member_client(workspace, "viewer")
    data = call("GET", "/backups", client=client, **headers).json()
    assert data["count"] == 1
    backup = data["items"][0]
    assert (backup["file_name"], backup["reason"], backup["run_id"]) == (
        result["backup_file"],
        "pre-prune",
        result["run_id"],
    )
    assert backup["size_bytes"] > 0 and len(backup["sha256"]) == 64
    assert backup["entry_count"] == 1


# --- GET /stats --------------------------------------------------------------------------------


def test_stats_count_the_workspace_only(workspace, other_workspace, key):
    a = make(workspace, tags=["x", "y"])
    b = make(workspace)
    c = make(workspace)
    relationships.relationship_create(workspace=workspace, from_id=a.pk, to_id=b.pk)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=c.pk)
    make(other_workspace, tags=["z"])
    call("POST", "/maintenance/sweep-decay", key("operator"), {"dry_run": True})
    response = call("GET", "/stats", key("agent"))
    assert response.status_code == 200
    stats = response.json()
    assert stats["workspace"] == "acme"
    assert stats["entries"] == {
        "staged": 0,
        "active": 2,
        "stale": 0,
        "archived": 0,
        "tombstoned": 1,
        "total": 3,
    }
    assert (stats["tags"], stats["links"], stats["open_tombstones"], stats["open_disputes"]) == (
        2,
        {"active": 1, "pruned": 0},
        1,
        0,
    )
    assert stats["anchors"] == {"valid": 0, "stale": 0, "invalidated": 0}
    assert stats["last_runs"]["decay"]["status"] == "succeeded"
    assert stats["last_runs"]["decay"]["finished_at"]
    assert stats["last_runs"]["full"] is None
    assert stats["policy"]["tombstone_grace_days"] == 180


def test_stats_take_a_constant_number_of_queries(workspace, key):
    agent = key("agent")
    call("GET", "/stats", agent)
    few = queries_for("/stats", agent)
    for i in range(20):
        make(workspace, tags=[f"t{i}"])
    add_runs(workspace, 5, kind="decay")
    add_runs(workspace, 5, kind="prune")
    assert queries_for("/stats", agent) == few


# --- GET/PUT /policy ---------------------------------------------------------------------------


def test_everyone_reads_the_effective_policy(workspace, key):
    client, headers = member_client(workspace, "viewer")
    response = call("GET", "/policy", client=client, **headers)
    assert response.status_code == 200
    policy = response.json()
    assert set(policy) == {*LIMITS, "review_mode", "exclude_tags", "residue_patterns", "updated_at"}
    assert {name: policy[name] for name in LIMITS} == {name: limit.default for name, limit in LIMITS.items()}
    assert policy["review_mode"] == "apply"  # the fixture's workspace; a new one proposes (below)


def test_a_new_workspace_proposes_and_holds_until_released(propose_workspace, key):
    policy = call("GET", "/policy", key("agent", propose_workspace)).json()
    assert (policy["review_mode"], policy["operator_hold_days"]) == ("propose", 0)


def test_the_policy_schemas_have_every_setting_with_its_type():
    for schema in (PolicyIn, PolicyOut):
        fields = schema.model_fields
        assert set(fields) - {"updated_at"} == {*LIMITS, "review_mode", "exclude_tags", "residue_patterns"}
        for name, limit in LIMITS.items():
            assert ("int" if limit.integer else "float") in str(fields[name].annotation), name


def test_an_admin_switches_the_review_mode_and_sets_the_hold_days(workspace, key):
    admin = key("admin")
    policy = call("PUT", "/policy", admin, {"review_mode": "propose", "operator_hold_days": 30}).json()
    assert (policy["review_mode"], policy["operator_hold_days"]) == ("propose", 30)
    row = MaintenancePolicy.objects.get(workspace=workspace)
    assert (row.review_mode, row.operator_hold_days) == ("propose", 30)
    # Clamped like every numeric setting; the mode is left alone when not sent.
    policy = call("PUT", "/policy", admin, {"operator_hold_days": 10**6}).json()
    assert (policy["review_mode"], policy["operator_hold_days"]) == ("propose", 3650)
    assert call("PUT", "/policy", admin, {"review_mode": "apply"}).json()["review_mode"] == "apply"


@pytest.mark.parametrize("mode", ["auto", "", "PROPOSE", 1, True, ["apply"]])
def test_an_unknown_review_mode_is_refused(workspace, key, mode):
    response = call("PUT", "/policy", key("admin"), {"review_mode": mode, "backups_keep": 9})
    assert response.status_code == 422, response.content
    assert "review_mode" in json.dumps(response.json()["detail"])
    row = MaintenancePolicy.objects.get(workspace=workspace)
    assert (row.review_mode, row.backups_keep) == ("apply", 5)


def test_a_hand_edited_policy_reads_clamped(workspace, key):
    MaintenancePolicy.objects.filter(workspace=workspace).update(cold_threshold=9.0)
    assert call("GET", "/policy", key("agent")).json()["cold_threshold"] == 1.0


def test_only_admins_change_the_policy(workspace, key):
    for role in ("agent", "operator"):
        response = call("PUT", "/policy", key(role), {"cold_threshold": 0.3})
        assert response.status_code == 403
    client, headers = member_client(workspace, "operator")
    assert call("PUT", "/policy", body={"cold_threshold": 0.3}, client=client, **headers).status_code == 403
    assert MaintenancePolicy.objects.get(workspace=workspace).cold_threshold == 0.2


def test_an_admin_changes_some_settings_and_the_rest_stay(workspace, key):
    MaintenancePolicy.objects.filter(workspace=workspace).update(stale_after_days=30)
    body = {
        "cold_threshold": 0.3,
        "importance_threshold": 7,
        "tombstone_grace_days": 10**12,
        "stale_after_days": None,
        "exclude_tags": [" keep ", "keep", "pinned", ""],
    }
    response = call("PUT", "/policy", key("admin"), body)
    assert response.status_code == 200
    policy = response.json()
    assert (policy["cold_threshold"], policy["importance_threshold"], policy["tombstone_grace_days"]) == (
        0.3,
        1.0,
        3650,
    )
    assert policy["stale_after_days"] == 30  # null leaves a setting as it is
    assert policy["exclude_tags"] == ["keep", "pinned"]
    row = MaintenancePolicy.objects.get(workspace=workspace)
    assert (row.cold_threshold, row.importance_threshold, row.exclude_tags) == (0.3, 1.0, ["keep", "pinned"])
    # The next run reads it.
    result = call("POST", "/maintenance/run", key("agent"), {}).json()
    assert MaintenanceRun.objects.get(pk=result["run_id"]).params["cold_threshold"] == 0.3


@pytest.mark.parametrize(
    "body",
    [
        {"cold_threshold": "0.3"},
        {"stale_after_days": 3.5},
        {"stale_after_days": True},
        {"nope": 1},
        {"run": {}},
    ],
    ids=lambda body: json.dumps(body),
)
def test_policy_updates_of_the_wrong_type_or_unknown_settings_are_refused(workspace, key, body):
    response = call("PUT", "/policy", key("admin"), body)
    assert response.status_code == 422
    assert MaintenancePolicy.objects.get(workspace=workspace).cold_threshold == 0.2


def test_a_policy_update_creates_the_row_of_a_workspace_without_one(workspace, key):
    MaintenancePolicy.objects.filter(workspace=workspace).delete()
    assert call("GET", "/policy", key("agent")).json()["updated_at"] is None
    policy = call("PUT", "/policy", key("admin"), {"backups_keep": 3}).json()
    assert policy["backups_keep"] == 3
    assert MaintenancePolicy.objects.get(workspace=workspace).backups_keep == 3


@pytest.mark.parametrize("kind", ["hygiene", "contradictions", "consolidate"])
def test_a_quality_pass_runs_alone_after_scoring(workspace, key, kind):
    make(workspace, age_days=1)
    response = call("POST", "/maintenance/run", key("agent"), {"kind": kind})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["kind"], body["dry_run"], body["status"]) == (kind, True, "succeeded")
    assert body["counts"]["scored"] == 1
    assert MaintenanceRun.objects.get(pk=body["run_id"]).kind == kind


@pytest.mark.parametrize("kind", ["prune", "decay", "everything", 3, None])
def test_the_run_endpoint_refuses_other_kinds(workspace, key, kind):
    response = call("POST", "/maintenance/run", key("operator"), {"kind": kind})
    assert response.status_code == 422
    assert not MaintenanceRun.objects.exists()


def test_an_admin_sets_the_hygiene_residue_patterns_and_bad_ones_change_nothing(workspace, key):
    admin = key("admin")
    assert call("GET", "/policy", admin).json()["residue_patterns"] == []
    response = call(
        "PUT", "/policy", admin, {"residue_patterns": [" sprint \\d+ notes ", "<source-path>", ""]}
    )
    assert response.status_code == 200, response.content
    assert response.json()["residue_patterns"] == ["sprint \\d+ notes", "<source-path>"]
    for bad in (["(unclosed"], "just a string", [3], ["x" * 201], ["p"] * 51, ["nul\u0000"]):
        refused = call("PUT", "/policy", admin, {"residue_patterns": bad, "backups_keep": 9})
        assert refused.status_code == 422, bad
        assert "residue_patterns" in json.dumps(refused.json()["detail"])
    stored = MaintenancePolicy.objects.get(workspace=workspace)
    assert stored.residue_patterns == ["sprint \\d+ notes", "<source-path>"]
    assert stored.backups_keep == 5  # no partial write
    assert call("PUT", "/policy", admin, {"residue_patterns": []}).json()["residue_patterns"] == []


@pytest.mark.parametrize("path", ["/maintenance/prune", "/policy"])
def test_a_nul_character_in_exclude_tags_is_refused_not_a_server_error(workspace, key, path):
    # Found by the schema fuzz on PostgreSQL, which cannot store NUL in the run's parameters.
    method = "PUT" if path == "/policy" else "POST"
    body = {"exclude_tags": ["ok", "z\u0000z"]}
    if path != "/policy":
        body["dry_run"] = True
    response = call(method, path, key("admin"), body)
    assert response.status_code == 422, response.content
    assert not MaintenanceRun.objects.exists()
    assert MaintenancePolicy.objects.get(workspace=workspace).exclude_tags == []
