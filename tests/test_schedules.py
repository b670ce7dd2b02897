"""Schedules declared in code and the maintenance dispatcher."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.db.models.signals import post_migrate
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from maintenance import signals, tasks
from maintenance.models import MaintenanceRun, RunKind, RunStatus, RunTrigger
from maintenance.schedules import SCHEDULES, ScheduleSpec, sync_schedules
from memory import accounts, new_entries
from memory.models import Workspace
from memory.policy import PolicyValues
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db

DISPATCH = "maintenance.dispatch"
VERDICTS = "maintenance.hygiene_verdicts"


# --- helpers -------------------------------------------------------------------------------------


def queued():
    """(workspace id, kind) of every run_scheduled task in the ORM broker's queue, in order."""
    found = []
    for row in OrmQ.objects.order_by("pk"):
        task = SignedPackage.loads(row.payload)
        assert task["func"] == tasks.RUN_TASK
        assert task["group"] == "maintenance"
        found.append(tuple(task["args"]))
    return found


def kinds_enqueued(result, workspace):
    return sorted(item["kind"] for item in result["enqueued"] if item["workspace"] == workspace.slug)


def record_run(workspace, kind, *, started, finished=None, status=RunStatus.SUCCEEDED, dry_run=False):
    return MaintenanceRun.objects.create(
        workspace=workspace,
        kind=kind,
        trigger=RunTrigger.CLI,
        status=status,
        dry_run=dry_run,
        started_at=started,
        finished_at=finished if finished is not None else (None if status == RunStatus.RUNNING else started),
    )


def set_policy(workspace, **values):
    row = MaintenancePolicy.objects.get(workspace=workspace)
    for name, value in values.items():
        setattr(row, name, value)
    row.save()


def recently_maintained(workspace, now):
    record_run(workspace, RunKind.DECAY, started=now - timedelta(minutes=1))
    record_run(
        workspace, RunKind.FULL, started=now - timedelta(hours=1), finished=now - timedelta(minutes=50)
    )


# --- declared schedules ----------------------------------------------------------------------


def test_the_dispatch_schedule_is_declared_every_two_minutes_forever():
    spec = next(s for s in SCHEDULES if s.name == DISPATCH)

    assert spec.func == "maintenance.tasks.dispatch_due_maintenance"
    assert spec.schedule_type == Schedule.MINUTES
    assert spec.minutes == 2
    assert spec.repeats == -1


def test_the_hygiene_verdicts_are_made_in_the_background_every_five_minutes():
    spec = next(s for s in SCHEDULES if s.name == VERDICTS)

    assert spec.func == "maintenance.tasks.assess_hygiene_verdicts"
    assert (spec.schedule_type, spec.minutes, spec.repeats) == (Schedule.MINUTES, 5, -1)


def test_the_schedules_exist_after_migrate_because_the_post_migrate_handler_ran():
    # The test database was built with migrate, which sent post_migrate.
    row = Schedule.objects.get(name=DISPATCH)

    assert row.func == "maintenance.tasks.dispatch_due_maintenance"
    assert row.schedule_type == Schedule.MINUTES
    assert row.minutes == 2


def test_the_handler_is_connected_to_post_migrate_of_the_maintenance_app():
    Schedule.objects.filter(name__startswith="maintenance.").delete()
    config = apps.get_app_config("maintenance")

    post_migrate.send(sender=config, app_config=config, using="default", verbosity=0, interactive=False)

    assert Schedule.objects.filter(name=DISPATCH).count() == 1


def test_post_migrate_of_another_app_does_not_sync():
    Schedule.objects.filter(name__startswith="maintenance.").delete()
    config = apps.get_app_config("memory")

    post_migrate.send(sender=config, app_config=config, using="default", verbosity=0, interactive=False)

    assert not Schedule.objects.filter(name=DISPATCH).exists()


def test_the_handler_does_nothing_when_django_q_is_not_migrated_yet(monkeypatch):
    Schedule.objects.filter(name__startswith="maintenance.").delete()
    monkeypatch.setattr(
        connection.introspection, "table_names", lambda *a, **k: ["maintenance_maintenancerun"]
    )

    signals.sync_schedules_after_migrate(using="default", verbosity=0)

    monkeypatch.undo()
    assert not Schedule.objects.filter(name=DISPATCH).exists()


def test_a_new_schedule_is_due_at_once():
    Schedule.objects.filter(name__startswith="maintenance.").delete()
    before = timezone.now()

    result = sync_schedules()

    assert result["created"] == [DISPATCH, VERDICTS]
    row = Schedule.objects.get(name=DISPATCH)
    assert before <= row.next_run <= timezone.now()


def test_syncing_twice_changes_nothing_the_second_time():
    sync_schedules()
    rows_before = list(Schedule.objects.order_by("pk").values())

    result = sync_schedules()

    assert result == {"created": [], "updated": [], "unchanged": [DISPATCH, VERDICTS], "removed": []}
    assert list(Schedule.objects.order_by("pk").values()) == rows_before


def test_a_changed_declaration_updates_the_row_and_keeps_its_next_run():
    sync_schedules()
    row = Schedule.objects.get(name=DISPATCH)
    later = timezone.now() + timedelta(minutes=1)
    Schedule.objects.filter(pk=row.pk).update(next_run=later)
    changed = (ScheduleSpec(name=DISPATCH, func="maintenance.tasks.dispatch_due_maintenance", minutes=5),)

    result = sync_schedules(changed)

    assert result["updated"] == [DISPATCH]
    row.refresh_from_db()
    assert (row.minutes, row.next_run) == (5, later)
    assert sync_schedules(changed)["unchanged"] == [DISPATCH]


def test_a_hand_edit_in_the_admin_is_undone():
    sync_schedules()
    Schedule.objects.filter(name=DISPATCH).update(repeats=0, args="1, 2", next_run=None)

    result = sync_schedules()

    assert result["updated"] == [DISPATCH]
    row = Schedule.objects.get(name=DISPATCH)
    assert (row.repeats, row.args) == (-1, None)
    assert row.next_run is not None


def test_undeclared_maintenance_schedules_are_removed_and_other_schedules_kept():
    sync_schedules()
    Schedule.objects.create(name="maintenance.retired", func="maintenance.tasks.gone")
    Schedule.objects.create(name="operator nightly report", func="reports.tasks.nightly")

    result = sync_schedules()

    assert result["removed"] == ["maintenance.retired"]
    names = set(Schedule.objects.values_list("name", flat=True))
    assert names == {DISPATCH, VERDICTS, "operator nightly report"}


def test_duplicate_rows_of_one_name_collapse_to_the_oldest():
    sync_schedules()
    first = Schedule.objects.get(name=DISPATCH)
    Schedule.objects.create(name=DISPATCH, func="maintenance.tasks.dispatch_due_maintenance")

    result = sync_schedules()

    assert result["removed"] == [DISPATCH]
    assert list(Schedule.objects.filter(name=DISPATCH).values_list("pk", flat=True)) == [first.pk]


def test_the_sync_schedules_command_prints_json():
    Schedule.objects.filter(name__startswith="maintenance.").delete()
    out = StringIO()

    call_command("sync_schedules", "--json", stdout=out)
    again = StringIO()
    call_command("sync_schedules", stdout=again)

    assert json.loads(out.getvalue()) == {
        "created": [DISPATCH, VERDICTS],
        "updated": [],
        "unchanged": [],
        "removed": [],
    }
    assert "0 change(s)" in again.getvalue()


# --- the dispatcher: what is due ----------------------------------------------------------------


def test_a_fresh_workspace_gets_a_full_run_alone_which_sweeps_too(workspace, now):
    result = tasks.dispatch_due_maintenance(now=now)

    # No decay sweep beside it: two workers would take both at once and the lease would turn
    # one of them away (bench/workers.py saw every full run skipped that way).
    assert result == {"enqueued": [{"workspace": "acme", "kind": "full"}], "checked": 1}
    assert queued() == [(workspace.pk, "full")]


def test_a_full_run_counts_as_a_sweep_unless_the_lease_turned_it_away(workspace, now):
    interval = timedelta(seconds=PolicyValues().decay_interval_seconds)
    full = record_run(workspace, RunKind.FULL, started=now - interval + timedelta(seconds=30))
    assert full.status == RunStatus.SUCCEEDED
    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == []
    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now + timedelta(seconds=30)), workspace) == [
        "decay"
    ]
    OrmQ.objects.all().delete()  # as if the worker had taken that sweep

    MaintenanceRun.objects.filter(pk=full.pk).update(status=RunStatus.SKIPPED)
    # A skipped full run is not completed either: the full run is due again, alone.
    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["full"]
    # With an earlier full run completed (no full run due), the skipped one did not sweep.
    record_run(workspace, RunKind.FULL, started=now - timedelta(hours=2), finished=now - timedelta(hours=1))
    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["decay"]


@pytest.mark.parametrize(
    "history",
    ["none", "full_just_ran", "full_skipped", "decay_ran", "full_failed", "full_running"],
)
def test_the_dashboard_shows_the_times_the_dispatcher_acts_on(workspace, now, history):
    """The console's "next runs" and the dispatcher read one history and one rule: at every
    minute of the next day, a kind the dashboard shows as due is what the dispatcher enqueues
    (a full run alone: it sweeps too), and nothing else."""
    from console.selectors import next_runs

    hour = timedelta(hours=1)
    record_run(workspace, RunKind.FULL, started=now - 30 * hour, finished=now - 29 * hour)
    if history == "full_just_ran":  # it swept: the dashboard once showed the sweep as due
        record_run(workspace, RunKind.FULL, started=now - timedelta(minutes=3), finished=now)
    elif history == "full_skipped":
        record_run(workspace, RunKind.FULL, started=now - timedelta(minutes=3), status=RunStatus.SKIPPED)
    elif history == "decay_ran":
        record_run(workspace, RunKind.FULL, started=now - 2 * hour, finished=now - hour)
        record_run(workspace, RunKind.DECAY, started=now - timedelta(minutes=4))
    elif history == "full_failed":
        record_run(workspace, RunKind.FULL, started=now - timedelta(minutes=20), status=RunStatus.FAILED)
    elif history == "full_running":
        record_run(workspace, RunKind.FULL, started=now - timedelta(minutes=20), status=RunStatus.RUNNING)
    policy = MaintenancePolicy.objects.get(workspace=workspace).values()
    for minute in range(0, 24 * 60, 7):
        at = now + timedelta(minutes=minute)
        shown = next_runs(workspace, now=at)
        row = Workspace.objects.annotate(**tasks.run_history(at)).get(pk=workspace.pk)
        dispatched = tasks.due_kinds(history=tasks.RunHistory.of(row), policy=policy, now=at)
        due = [
            kind
            for kind, next_run in (("full", shown.full), ("decay", shown.decay))
            if next_run.state == "due"
        ]
        assert dispatched == due[:1], (history, minute, shown)


def test_nothing_is_enqueued_when_recent_runs_exist(workspace, now):
    recently_maintained(workspace, now)

    result = tasks.dispatch_due_maintenance(now=now)

    assert result == {"enqueued": [], "checked": 1}
    assert queued() == []


def test_a_decay_sweep_is_due_once_the_last_one_started_longer_ago_than_the_interval(workspace, now):
    recently_maintained(workspace, now)
    MaintenanceRun.objects.filter(kind=RunKind.DECAY).update(started_at=now - timedelta(seconds=600))

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["decay"]


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.SKIPPED, RunStatus.RUNNING])
def test_a_decay_sweep_that_started_recently_counts_whatever_its_status(workspace, now, status):
    # A crash loop (or a lease that keeps being held) waits one interval, not two minutes.
    recently_maintained(workspace, now)
    MaintenanceRun.objects.filter(kind=RunKind.DECAY).delete()
    record_run(workspace, RunKind.DECAY, started=now - timedelta(seconds=30), status=status)

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == []


def test_dry_runs_do_not_postpone_real_maintenance(workspace, now):
    record_run(workspace, RunKind.DECAY, started=now - timedelta(seconds=30), dry_run=True)
    record_run(workspace, RunKind.FULL, started=now - timedelta(minutes=5), dry_run=True)

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["full"]


def test_a_full_run_is_due_once_the_last_completed_one_finished_longer_ago_than_the_interval(workspace, now):
    recently_maintained(workspace, now)
    MaintenanceRun.objects.filter(kind=RunKind.FULL).update(
        started_at=now - timedelta(hours=25), finished_at=now - timedelta(hours=24)
    )

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["full"]


def test_a_changed_maintenance_interval_applies_at_once(workspace, now):
    recently_maintained(workspace, now)
    MaintenanceRun.objects.filter(kind=RunKind.FULL).update(
        started_at=now - timedelta(hours=6), finished_at=now - timedelta(hours=5)
    )
    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == []

    set_policy(workspace, maintenance_interval_hours=4)

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["full"]


def test_a_changed_decay_interval_applies_at_once(workspace, now):
    recently_maintained(workspace, now)
    MaintenanceRun.objects.filter(kind=RunKind.DECAY).update(started_at=now - timedelta(seconds=300))
    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == []

    set_policy(workspace, decay_interval_seconds=120)

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["decay"]


def test_a_blocked_full_run_counts_as_completed(workspace, now):
    recently_maintained(workspace, now)
    MaintenanceRun.objects.filter(kind=RunKind.FULL).update(status=RunStatus.BLOCKED)

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == []


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.SKIPPED])
def test_a_full_run_that_did_not_complete_does_not_count_as_completed(workspace, now, status):
    recently_maintained(workspace, now)
    MaintenanceRun.objects.filter(kind=RunKind.FULL).update(
        status=status, started_at=now - timedelta(hours=2), finished_at=now - timedelta(hours=2)
    )

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["full"]


def test_a_full_run_in_progress_holds_off_another_full_run_and_the_decay_sweep(workspace, now):
    record_run(workspace, RunKind.FULL, started=now - timedelta(minutes=59), status=RunStatus.RUNNING)

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == []


def test_a_running_row_older_than_an_hour_belongs_to_a_killed_run(workspace, now):
    record_run(workspace, RunKind.FULL, started=now - timedelta(minutes=61), status=RunStatus.RUNNING)

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["full"]


def test_a_full_run_that_failed_recently_is_retried_an_hour_later_not_every_dispatch(workspace, now):
    recently_maintained(workspace, now)
    MaintenanceRun.objects.filter(kind=RunKind.FULL).update(
        started_at=now - timedelta(days=2), finished_at=now - timedelta(days=2)
    )
    failed = record_run(workspace, RunKind.FULL, started=now - timedelta(minutes=10), status=RunStatus.FAILED)
    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == []

    MaintenanceRun.objects.filter(pk=failed.pk).update(started_at=now - timedelta(minutes=61))

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["full"]


def test_each_workspace_is_judged_by_its_own_history(workspace, other_workspace, now):
    recently_maintained(other_workspace, now)

    result = tasks.dispatch_due_maintenance(now=now)

    assert kinds_enqueued(result, workspace) == ["full"]
    assert kinds_enqueued(result, other_workspace) == []
    assert result["checked"] == 2


def test_a_workspace_without_a_policy_row_uses_the_defaults(workspace, now):
    MaintenancePolicy.objects.filter(workspace=workspace).delete()
    record_run(
        workspace, RunKind.DECAY, started=now - timedelta(seconds=PolicyValues().decay_interval_seconds - 1)
    )

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["full"]


# --- the dispatcher: idempotency and cost -------------------------------------------------------


def test_a_second_dispatch_does_not_enqueue_what_still_waits_in_the_queue(workspace, now):
    tasks.dispatch_due_maintenance(now=now)

    again = tasks.dispatch_due_maintenance(now=now)
    later = tasks.dispatch_due_maintenance(now=now + timedelta(minutes=2))

    assert again["enqueued"] == later["enqueued"] == []
    assert queued() == [(workspace.pk, "full")]


def test_a_queued_task_left_behind_for_hours_no_longer_blocks(workspace, now, monkeypatch):
    tasks.dispatch_due_maintenance(now=now)
    monkeypatch.setattr(tasks, "QUEUED_FORGOTTEN_AFTER", timedelta(seconds=-1))

    assert kinds_enqueued(tasks.dispatch_due_maintenance(now=now), workspace) == ["full"]


def test_another_workspaces_queued_task_does_not_block(workspace, other_workspace, now):
    recently_maintained(workspace, now)
    tasks.dispatch_due_maintenance(now=now)  # queues the other workspace's runs
    MaintenanceRun.objects.filter(workspace=workspace).delete()

    result = tasks.dispatch_due_maintenance(now=now)

    assert kinds_enqueued(result, workspace) == ["full"]
    assert kinds_enqueued(result, other_workspace) == []


def test_other_tasks_in_the_queue_are_ignored(workspace, now):
    async_task("math.floor", 1.5)  # not ours: never run here
    recently_maintained(workspace, now)

    assert tasks.queued_runs() == set()


def _workspaces(count, now, *, maintained):
    made = []
    for i in range(count):
        ws = accounts.workspace_create(slug=f"ws-{i:03d}")
        if maintained:
            recently_maintained(ws, now)
        made.append(ws)
    return made


def _work(captured: list[dict[str, str]]) -> list[str]:
    """The statements of a dispatch but its transaction and its turn: the savepoint and its
    release (the test runs in a transaction already) and, on PostgreSQL, the advisory lock,
    which must be the first statement of the transaction."""
    sql = [q["sql"].strip() for q in captured]
    control = [q for q in sql if q.upper().startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
    assert len(control) == 2, sql
    sql = [q for q in sql if q not in control]
    if connection.vendor == "postgresql":
        assert "pg_advisory_xact_lock" in sql[0], sql
        sql = sql[1:]
    return sql


@pytest.mark.parametrize("count", [3, 30])
def test_a_dispatch_with_nothing_due_costs_three_queries_whatever_the_workspaces(count, now):
    _workspaces(count, now, maintained=True)

    with CaptureQueriesContext(connection) as ctx:
        result = tasks.dispatch_due_maintenance(now=now)

    work = _work(ctx.captured_queries)
    # One UPDATE gives up queued runs no worker started (maintenance.runs.fail_lost_queued),
    # then the two reads.
    assert len(work) == 3
    assert work[0].upper().startswith('UPDATE "MAINTENANCE_MAINTENANCERUN"')
    assert result == {"enqueued": [], "checked": count}


@pytest.mark.parametrize("count", [3, 30])
def test_a_dispatch_costs_three_queries_plus_one_insert_per_enqueued_task(count, now):
    _workspaces(count, now, maintained=False)

    with CaptureQueriesContext(connection) as ctx:
        result = tasks.dispatch_due_maintenance(now=now)

    assert len(result["enqueued"]) == count
    work = _work(ctx.captured_queries)
    selects = [q for q in work if q.upper().startswith("SELECT")]
    assert len(selects) == 2
    assert len(work) == 3 + count


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite runs one writer at a time itself")
@pytest.mark.django_db(transaction=True)
def test_two_dispatchers_at_once_enqueue_each_due_run_once(now):
    """Two clusters' dispatches (or one delivered twice) at the same moment: without taking
    turns both read an empty queue and both enqueue every run."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    _workspaces(5, now, maintained=False)
    barrier = threading.Barrier(2)

    def dispatch(_: int) -> int:
        try:
            barrier.wait()
            return len(tasks.dispatch_due_maintenance(now=now)["enqueued"])
        finally:
            connections.close_all()

    with ThreadPoolExecutor(2) as pool:
        enqueued = sorted(pool.map(dispatch, range(2)))

    assert enqueued == [0, 5]  # one full run each (it sweeps too)
    assert len(tasks.queued_runs()) == OrmQ.objects.count() == 5


# --- the scheduled run -----------------------------------------------------------------------------


def test_run_scheduled_records_a_run_triggered_by_the_schedule(workspace, now):
    new_entries.entry_create(workspace=workspace, content="A memory worth keeping for a while", now=now)

    result = tasks.run_scheduled(workspace.pk, "decay")

    run = MaintenanceRun.objects.get(pk=result["run_id"])
    assert (run.workspace_id, run.kind, run.trigger) == (workspace.pk, "decay", "schedule")
    assert run.status == RunStatus.SUCCEEDED


def test_run_scheduled_for_a_deleted_workspace_does_nothing(workspace):
    workspace_id = workspace.pk
    workspace.delete()

    assert tasks.run_scheduled(workspace_id, "full") is None
    assert not MaintenanceRun.objects.exists()


def test_in_q2_sync_mode_a_dispatch_runs_a_fresh_workspace_maintenance_inline(workspace, now, monkeypatch):
    # q2's sync mode runs each task inline through its worker and monitor (no cluster, no queue).
    monkeypatch.setattr(Conf, "SYNC", True)
    new_entries.entry_create(workspace=workspace, content="A memory worth keeping for a while", now=now)

    first = tasks.dispatch_due_maintenance()
    second = tasks.dispatch_due_maintenance()

    assert kinds_enqueued(first, workspace) == ["full"]
    assert second["enqueued"] == []
    runs = MaintenanceRun.objects.filter(workspace=workspace).order_by("pk")
    assert [(r.kind, r.trigger, r.status) for r in runs] == [("full", "schedule", "succeeded")]
    assert not OrmQ.objects.exists()
