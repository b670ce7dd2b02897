"""A backup written on SQLite restores into the suite's database (PostgreSQL when the suite
runs there) with every column of every row as it was, run references included: the restored
workspace's runs can still be reverted. The backup is written by other processes
("machine A") into a backups storage configured by environment, and restored by its name in
that storage by this process ("machine B"), whose own BACKUP_DIR is elsewhere."""

import json

import pytest

from maintenance import backup_files, restore
from maintenance.models import MaintenanceRun
from maintenance.revert import revert_run
from memory.models import Entry, LifecycleEvent, Tombstone, Workspace
from tests.helpers_subprocess import dump_workspace, helper, manage, migrated_sqlite, subprocess_env

pytestmark = pytest.mark.django_db
NOW = "2026-06-01T00:00:00+00:00"


SHARED = "shared-storage"  # under tmp_path: the storage both "machines" reach


@pytest.fixture
def sqlite_backup(tmp_path):
    """A workspace seeded and maintained on a SQLite file in other processes, then backed up
    there into the shared storage: (the backup's name there, every row as SQLite had it, the
    run's id)."""
    env = subprocess_env(migrated_sqlite(tmp_path / "source.sqlite3"), tmp_path / "machine-a-backups")
    env["BACKUP_STORAGE_BACKEND"] = "django.core.files.storage.FileSystemStorage"
    env["BACKUP_STORAGE_OPTIONS"] = json.dumps({"location": str(tmp_path / SHARED)})
    helper(["seed", "--workspace", "w", "--entries", "120", "--now", NOW, "--review-mode", "apply"], env)
    run = json.loads(
        helper(["run", "--workspace", "w", "--now", NOW, "--batch-size", "20"], env).splitlines()[-1]
    )
    written = json.loads(manage(["backup", "--workspace", "w", "--json"], env))
    rows = json.loads(helper(["dump", "--workspace", "w"], env).splitlines()[-1])
    assert (tmp_path / SHARED / "w" / written["file"]).is_file()
    # Machine A's own folder got nothing: the run's pre-prune backup went to the storage too.
    assert not [p for p in (tmp_path / "machine-a-backups").rglob("*") if p.is_file()]
    return written["file"], rows, run


def test_a_sqlite_backup_restores_every_column_and_its_runs_stay_revertible(
    sqlite_backup, settings, tmp_path
):
    name, before, run = sqlite_backup
    assert run["status"] == "succeeded" and run["counts"]["archived"] and run["counts"]["pruned"]
    assert Workspace.objects.filter(slug="w").count() == 0
    settings.BACKUP_DIR = tmp_path / "machine-b-backups"
    settings.STORAGES = {
        **settings.STORAGES,
        "backups": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / SHARED)},
        },
    }

    source = backup_files.resolve_backup(name, "w")
    assert source == backup_files.StoredBackup(f"w/{name}")
    restore.restore_backup(source)

    after = dump_workspace("w")
    assert after.keys() == before.keys()
    for name in before:
        assert after[name] == before[name], name
    workspace = Workspace.objects.get(slug="w")
    the_run = MaintenanceRun.objects.get(pk=run["run_id"], workspace=workspace)
    assert Tombstone.objects.filter(workspace=workspace, run=the_run).exists()
    assert LifecycleEvent.objects.filter(workspace=workspace, run=the_run).exists()

    reverted = revert_run(workspace, the_run.pk, actor="user:ops")
    assert reverted["reverted"], reverted
    assert not Entry.objects.filter(
        pk__in=reverted["reverted"], status__in=["archived", "tombstoned"]
    ).exists()
