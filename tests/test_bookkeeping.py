"""The bookkeeping reclaims itself (pass 11's second half, maintenance/bookkeeping.py): runs that
changed nothing fold into per-day counts after a week; past the policy's audit_retention_days
the records of purged lineages, runs nothing refers to and old day counts go — never what an
operator can still revert; a dry run reports the same counts and removes nothing."""

from datetime import UTC, timedelta

import pytest

from maintenance.models import MaintenanceRun, RunDaySummary
from maintenance.revert import revert_run
from maintenance.run_start import run_maintenance
from memory import accounts, entry_changes, new_entries
from memory.models import Entry, LifecycleEvent, Tombstone
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db


def policy(workspace, **values):
    MaintenancePolicy.objects.filter(workspace=workspace).update(**values)


def make(workspace, now, *, age_days=0.0, **fields):
    entry = new_entries.entry_create(
        workspace=workspace,
        content=f"memory {Entry.objects.count()} about caching and retries",
        created_at=now - timedelta(days=age_days),
        now=now - timedelta(days=age_days),
    )
    if fields:
        Entry.objects.filter(pk=entry.pk).update(**fields)
    return entry


def run_at(workspace, moment, **kwargs):
    """A run whose rows say it started at ``moment`` (the run's own now), as if it had run then."""
    result = run_maintenance(workspace=workspace, now=moment, **kwargs)
    MaintenanceRun.objects.filter(pk=result["run_id"]).update(started_at=moment, finished_at=moment)
    return result


def days(workspace):
    return {
        (d.day.isoformat(), d.kind, d.status, d.dry_run): d.runs
        for d in RunDaySummary.objects.filter(workspace=workspace)
    }


def skipped_run(workspace, moment):
    return MaintenanceRun.objects.create(
        workspace=workspace, kind="decay", trigger="schedule", status="skipped", started_at=moment
    ).pk


def test_runs_that_changed_nothing_fold_into_per_day_counts_after_a_week(workspace, now):
    old = now - timedelta(days=10)
    noop = [run_at(workspace, old + timedelta(minutes=10 * i), kind="decay")["run_id"] for i in range(3)]
    dry = run_at(workspace, old, kind="full", dry_run=True)["run_id"]
    skipped = skipped_run(workspace, old)
    eight_days = run_at(workspace, now - timedelta(days=8), kind="decay")["run_id"]
    # Younger than a week: kept as rows (they are also the newest of their kind and status).
    young = [
        run_at(workspace, now - timedelta(days=6), kind="decay")["run_id"],
        run_at(workspace, now - timedelta(days=6), kind="full", dry_run=True)["run_id"],
        skipped_run(workspace, now - timedelta(days=6)),
    ]

    result = run_at(workspace, now)

    assert result["counts"]["reclaimed_rows"] == {"folded_runs": 6}
    assert not MaintenanceRun.objects.filter(pk__in=[*noop, dry, skipped, eight_days]).exists()
    assert MaintenanceRun.objects.filter(pk__in=young).count() == 3
    day = old.date().isoformat()
    assert days(workspace) == {
        (day, "decay", "succeeded", False): 3,
        (day, "full", "succeeded", True): 1,
        (day, "decay", "skipped", False): 1,
        ((now - timedelta(days=8)).date().isoformat(), "decay", "succeeded", False): 1,
    }


def test_the_newest_run_of_each_kind_and_status_is_never_folded(workspace, now):
    old = now - timedelta(days=30)
    decay = run_at(workspace, old, kind="decay")["run_id"]
    skipped = skipped_run(workspace, old)
    result = run_at(workspace, now)
    assert result["counts"]["reclaimed_rows"] == {}
    assert MaintenanceRun.objects.filter(pk__in=[decay, skipped]).count() == 2


def test_folding_adds_to_the_day_counts_and_keeps_the_newest_run_of_each_kind(workspace, now):
    old = now - timedelta(days=20)
    first = [run_at(workspace, old + timedelta(minutes=i), kind="decay")["run_id"] for i in range(2)]
    run_at(workspace, now - timedelta(days=12))  # a full run: folds the first decay run
    assert days(workspace) == {(old.date().isoformat(), "decay", "succeeded", False): 1}
    assert MaintenanceRun.objects.filter(pk=first[1]).exists()  # the newest decay run stays
    run_at(workspace, old + timedelta(minutes=5), kind="decay")
    run_at(workspace, now)
    assert days(workspace) == {(old.date().isoformat(), "decay", "succeeded", False): 2}
    # The newest decay run and the newest full run are still rows.
    kinds = set(MaintenanceRun.objects.filter(workspace=workspace).values_list("kind", flat=True))
    assert kinds == {"decay", "full"}


def test_runs_that_changed_something_or_failed_are_never_folded(workspace, now):
    policy(workspace, cold_threshold=0.9)
    make(workspace, now, age_days=400)
    old = now - timedelta(days=30)
    changed = run_at(workspace, old, kind="decay")
    assert changed["counts"]["evicted"] == 1
    failed = MaintenanceRun.objects.create(
        workspace=workspace, kind="decay", trigger="schedule", status="failed", started_at=old, error="boom"
    ).pk
    blocked = MaintenanceRun.objects.create(
        workspace=workspace, kind="full", trigger="api", status="blocked", started_at=old
    ).pk
    for i in range(2):  # newer runs of the same kind and status: the old ones are not the newest
        MaintenanceRun.objects.create(
            workspace=workspace,
            kind="decay",
            trigger="schedule",
            status="failed",
            started_at=old + timedelta(days=i + 1),
        )
        MaintenanceRun.objects.create(
            workspace=workspace,
            kind="full",
            trigger="api",
            status="blocked",
            started_at=old + timedelta(days=i + 1),
        )
    run_at(workspace, now - timedelta(days=1), kind="decay")  # newer than the changing run

    result = run_at(workspace, now)

    assert "folded_runs" not in result["counts"]["reclaimed_rows"]
    assert MaintenanceRun.objects.filter(pk__in=[changed["run_id"], failed, blocked]).count() == 3
    assert not RunDaySummary.objects.exists()


def _purged_long_ago(workspace, now, ago_days):
    """An entry tombstoned and purged ``ago_days`` ago by a full run (with its backup)."""
    entry = make(workspace, now, age_days=ago_days + 200)
    entry_changes.entry_tombstone(
        workspace=workspace, entry_id=entry.pk, now=now - timedelta(days=ago_days + 190)
    )
    purger = run_at(workspace, now - timedelta(days=ago_days))
    assert purger["counts"]["hard_deleted"] == 1
    return entry.pk, purger["run_id"]


def test_audit_retention_removes_the_records_of_long_purged_lineages(workspace, other_workspace, now):
    # The recent one first: its run would already reclaim what is older than its retention.
    recent_entry, recent_run = _purged_long_ago(workspace, now, 100)
    old_entry, old_run = _purged_long_ago(workspace, now, 800)
    other_entry, other_run = _purged_long_ago(other_workspace, now, 800)
    events_before = LifecycleEvent.objects.filter(workspace=workspace, entry_ref=old_entry).count()
    assert events_before >= 2  # the tombstone and the purge

    result = run_at(workspace, now)

    rows = result["counts"]["reclaimed_rows"]
    assert rows["tombstones"] == 1 and rows["lifecycle_events"] == events_before and rows["runs"] == 1
    assert not Tombstone.objects.filter(entry_ref=old_entry).exists()
    assert not LifecycleEvent.objects.filter(entry_ref=old_entry).exists()
    assert not MaintenanceRun.objects.filter(pk=old_run).exists()
    # Younger than the retention: kept.
    assert Tombstone.objects.filter(entry_ref=recent_entry).exists()
    assert MaintenanceRun.objects.filter(pk=recent_run).exists()
    # Another workspace's rows are never touched by this workspace's run.
    assert Tombstone.objects.filter(entry_ref=other_entry).exists()
    assert MaintenanceRun.objects.filter(pk=other_run).exists()


def test_audit_retention_zero_keeps_everything(workspace, now):
    policy(workspace, audit_retention_days=0)
    old_entry, old_run = _purged_long_ago(workspace, now, 3000)
    run_at(workspace, now - timedelta(days=1))
    result = run_at(workspace, now)
    assert set(result["counts"]["reclaimed_rows"]) <= {"folded_runs"}
    assert Tombstone.objects.filter(entry_ref=old_entry).exists()
    assert LifecycleEvent.objects.filter(entry_ref=old_entry).exists()
    assert MaintenanceRun.objects.filter(pk=old_run).exists()


def test_a_run_still_revertible_after_the_retention_stays_and_reverts(workspace, now):
    policy(workspace, cold_threshold=0.0, stale_after_days=7, archive_after_days=14)
    entry = make(workspace, now, age_days=2000, status="stale", status_changed_at=now - timedelta(days=1500))
    archiving = run_at(workspace, now - timedelta(days=1000))
    assert archiving["counts"]["archived"] == 1
    Entry.objects.filter(pk=entry.pk).update(pinned=True)  # nothing else happens to it
    run_at(workspace, now - timedelta(days=1))

    result = run_at(workspace, now)

    assert "runs" not in result["counts"]["reclaimed_rows"]
    assert MaintenanceRun.objects.filter(pk=archiving["run_id"]).exists()
    assert LifecycleEvent.objects.filter(run_id=archiving["run_id"], entry=entry).exists()
    assert revert_run(workspace, archiving["run_id"], actor="user:op", now=now)["reverted"] == [entry.pk]
    assert Entry.objects.get(pk=entry.pk).status == "stale"


def test_a_dry_run_reports_the_same_counts_and_removes_nothing(workspace, now):
    old_entry, _ = _purged_long_ago(workspace, now, 800)
    for i in range(3):
        run_at(workspace, now - timedelta(days=10, minutes=i), kind="decay")
    run_at(workspace, now - timedelta(days=795))  # newer than the purging run, reclaims nothing yet
    before = (
        MaintenanceRun.objects.count(),
        LifecycleEvent.objects.count(),
        Tombstone.objects.count(),
        RunDaySummary.objects.count(),
    )

    dry = run_maintenance(workspace=workspace, now=now, dry_run=True)

    assert dry["counts"]["reclaimed_rows"]["folded_runs"] == 2
    assert dry["counts"]["reclaimed_rows"]["tombstones"] == 1
    after = (
        MaintenanceRun.objects.count() - 1,  # the dry run's own row
        LifecycleEvent.objects.count(),
        Tombstone.objects.count(),
        RunDaySummary.objects.count(),
    )
    assert after == before
    real = run_maintenance(workspace=workspace, now=now)
    assert real["counts"]["reclaimed_rows"] == dry["counts"]["reclaimed_rows"]
    assert not Tombstone.objects.filter(entry_ref=old_entry).exists()


def test_propose_mode_runs_reclaim_the_bookkeeping_too(propose_workspace, now):
    ws = propose_workspace
    for i in range(3):
        run_at(ws, now - timedelta(days=10, minutes=i), kind="decay")
    result = run_at(ws, now)
    assert result["counts"]["reclaimed_rows"] == {"folded_runs": 2}
    assert RunDaySummary.objects.filter(workspace=ws).get().runs == 2


def test_the_day_of_a_folded_run_is_its_utc_day(workspace, now):
    moment = now.replace(hour=23, minute=59).astimezone(UTC) - timedelta(days=9)
    run_at(workspace, moment, kind="decay")
    run_at(workspace, moment + timedelta(minutes=2), kind="decay")
    run_at(workspace, now)
    assert days(workspace) == {(moment.date().isoformat(), "decay", "succeeded", False): 1}


# --- the history still shows the folded runs --------------------------------------------------------


def _folded_history(workspace, other_workspace, now):
    old = now - timedelta(days=10)
    for i in range(3):
        run_at(workspace, old + timedelta(minutes=i), kind="decay")
    run_at(workspace, old, kind="full", dry_run=True)
    for ws in (workspace, other_workspace):
        run_at(ws, now - timedelta(days=2), kind="full", dry_run=True)
        run_at(ws, now - timedelta(days=9), kind="decay")
    run_at(other_workspace, now - timedelta(days=9, minutes=1), kind="decay")
    run_at(other_workspace, now)
    return run_at(workspace, now)


def test_the_api_run_history_shows_the_folded_counts_per_day(workspace, other_workspace, now):
    from tests.test_api_maintenance import call

    _folded_history(workspace, other_workspace, now)
    agent = accounts.api_key_create(workspace=workspace, name="agent key", role="agent")[1]

    runs = call("GET", "/maintenance/runs", agent).json()
    assert runs["folded_runs"] == 4  # 2 of the 3 decay runs (the third is newer), 1 dry run
    assert runs["folded_runs"] == sum(d.runs for d in RunDaySummary.objects.filter(workspace=workspace))
    assert call("GET", "/maintenance/runs?kind=decay", agent).json()["folded_runs"] == 3
    folded = call("GET", "/maintenance/runs/folded", agent).json()
    assert folded["count"] == 2
    assert folded["items"] == [
        {
            "day": (now - timedelta(days=10)).date().isoformat(),
            "kind": "decay",
            "status": "succeeded",
            "dry_run": False,
            "runs": 3,
        },
        {
            "day": (now - timedelta(days=10)).date().isoformat(),
            "kind": "full",
            "status": "succeeded",
            "dry_run": True,
            "runs": 1,
        },
    ]
    assert call("GET", "/maintenance/runs/folded?kind=full&limit=1", agent).json()["items"][0]["runs"] == 1
    assert call("GET", "/maintenance/runs/folded?status=nope", agent).status_code == 422
    # The other workspace's folded runs are its own.
    other = accounts.api_key_create(workspace=other_workspace, name="agent key", role="agent")[1]
    assert call("GET", "/maintenance/runs/folded", other).json()["items"] == [
        {
            "day": (now - timedelta(days=9)).date().isoformat(),
            "kind": "decay",
            "status": "succeeded",
            "dry_run": False,
            "runs": 1,
        },
    ]


def test_the_console_run_history_shows_the_folded_counts_per_day(client, workspace, other_workspace, now):
    from tests.test_console_review import login

    _folded_history(workspace, other_workspace, now)
    login(client, workspace)
    html = client.get("/console/acme/runs/").content.decode()
    day = (now - timedelta(days=10)).date().isoformat()
    assert "4 older runs that changed nothing" in html
    section = html[html.index('id="run-days"') :]
    assert f'>{day}</time></td><td data-label="Kind">decay</td>' in section
    assert '<td class="num" data-label="Runs">3</td>' in section
    filtered = client.get("/console/acme/runs/?kind=full").content.decode()
    assert "1 older run that changed nothing" in filtered


# --- the worker's bookkeeping: task results and the live outbox ------------------------------------


def _task(n, *, success, stopped):
    from django_q.models import Task

    return Task.objects.create(
        id=f"task-{n:05d}",
        name=f"task {n}",
        func="maintenance.tasks.run_scheduled",
        started=stopped,
        stopped=stopped,
        success=success,
    )


def test_failed_task_results_are_trimmed_by_age_and_by_number(settings):
    from django.utils import timezone
    from django_q.models import Task

    from maintenance import tasks

    settings.Q_FAILURES_KEEP, settings.Q_FAILURES_KEEP_DAYS = 3, 30
    real_now = timezone.now()
    old = [_task(i, success=False, stopped=real_now - timedelta(days=31 + i)) for i in range(2)]
    recent = [_task(10 + i, success=False, stopped=real_now - timedelta(hours=i)) for i in range(5)]
    succeeded = _task(99, success=True, stopped=real_now - timedelta(days=90))  # q2's save_limit bounds these

    assert tasks.reclaim_worker_rows(real_now, batch=2) == {"task_failures": 4}

    left = set(Task.objects.values_list("id", flat=True))
    assert left == {t.id for t in recent[:3]} | {succeeded.id}
    assert not left & {t.id for t in old}
    assert tasks.reclaim_worker_rows(real_now) == {}


def test_a_scheduled_full_run_trims_the_worker_bookkeeping(workspace, settings):
    from django.utils import timezone
    from django_q.models import Task

    from maintenance import tasks
    from memory.models import LiveMessage

    settings.Q_FAILURES_KEEP_DAYS = 30
    real_now = timezone.now()
    _task(1, success=False, stopped=real_now - timedelta(days=40))
    LiveMessage.objects.create(
        workspace_id=workspace.pk, html="x", origin="elsewhere", created_at=real_now - timedelta(hours=1)
    )
    tasks.run_scheduled(workspace.pk, "decay")
    assert Task.objects.filter(id="task-00001").exists()  # a decay sweep leaves them alone
    tasks.run_scheduled(workspace.pk, "full")
    assert not Task.objects.filter(id="task-00001").exists()
    assert not LiveMessage.objects.exists()


def test_the_run_page_shows_the_reclaimed_rows_by_kind(client, workspace, other_workspace, now):
    from tests.test_console_review import login

    result = _folded_history(workspace, other_workspace, now)
    assert result["counts"]["reclaimed_rows"] == {"folded_runs": 4}
    login(client, workspace)
    html = client.get(f"/console/acme/runs/{result['run_id']}/").content.decode()
    row = '<th scope="row" title="reclaimed_rows">bookkeeping rows removed</th><td class="num">4</td>'
    assert row in html
    assert '<span class="meta" id="reclaimed-rows">folded_runs 4</span>' in html
