"""Backups go through the ``backups`` storage of settings.STORAGES and nothing else: writing
(manual and pre-prune), rotation, the API's list, and restore by name all work on an
in-memory storage and on a file system storage in another folder, while BACKUP_DIR is a file
that any direct use would trip over."""

from __future__ import annotations

import gzip
import json
import re
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import storages
from django.core.management import call_command
from django.test import Client

from config.settings import backup_storage
from maintenance import backup_files, backups, purge_now, restore
from maintenance.models import Backup
from memory import accounts, entry_changes, new_entries
from memory.models import Entry
from memory.models.choices import TombstoneReason
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def unusable_backup_dir(settings, tmp_path):
    """BACKUP_DIR is a file: a code path that wrote or read it directly would fail."""
    blocker = tmp_path / "backup-dir-is-a-file"
    blocker.write_text("not a folder")
    settings.BACKUP_DIR = blocker
    return blocker


def use_storage(settings, backend: str, **options) -> None:
    settings.STORAGES = {**settings.STORAGES, "backups": {"BACKEND": backend, "OPTIONS": options}}


@pytest.fixture
def in_memory(settings, unusable_backup_dir):
    use_storage(settings, "django.core.files.storage.InMemoryStorage")
    return storages["backups"]


@pytest.fixture
def elsewhere(settings, unusable_backup_dir, tmp_path):
    folder = tmp_path / "another-folder"
    use_storage(settings, "django.core.files.storage.FileSystemStorage", location=str(folder))
    return folder


def populate(workspace) -> list[Entry]:
    return [
        new_entries.entry_create(workspace=workspace, content=f"Memory number {n} about pools.", now=NOW)
        for n in range(5)
    ]


def test_a_backup_is_written_to_and_restored_from_an_in_memory_storage(workspace, in_memory):
    entries = populate(workspace)
    backup = backups.write_backup(workspace, reason="manual", now=NOW)

    name = f"acme/{backup.file_name}"
    assert in_memory.exists(name)
    with in_memory.open(name, "rb") as handle:
        data = handle.read()
    assert backup.size_bytes == len(data)
    assert json.loads(gzip.decompress(data).splitlines()[0])["workspace"] == "acme"

    Entry.objects.filter(pk=entries[0].pk).delete()
    source = backup_files.resolve_backup(backup.file_name, "acme")
    assert source == backup_files.StoredBackup(name)
    result = restore.restore_backup(source)
    assert result["restored"]["entry"] == 1
    assert result["file"] == name
    assert Entry.objects.filter(pk=entries[0].pk).exists()


def test_pre_prune_rotation_and_cleanup_delete_from_the_storage(workspace, in_memory):
    MaintenancePolicy.objects.filter(workspace=workspace).update(backups_keep=2)
    for hour in range(4):
        backups.write_backup(workspace, reason="pre-prune", now=NOW + timedelta(hours=hour))
    _, stored = in_memory.listdir("acme")
    kept = sorted(Backup.objects.filter(workspace=workspace).values_list("file_name", flat=True))
    assert (
        sorted(stored)
        == kept
        == [
            "pre-prune-backup-20261129T140000Z.jsonl.gz",
            "pre-prune-backup-20261129T150000Z.jsonl.gz",
        ]
    )

    assert backups.cleanup_backups(workspace, 1) == ["pre-prune-backup-20261129T140000Z.jsonl.gz"]
    assert in_memory.listdir("acme")[1] == ["pre-prune-backup-20261129T150000Z.jsonl.gz"]


def test_a_purge_writes_its_pre_prune_backup_to_the_storage(workspace, in_memory):
    entry = populate(workspace)[0]
    entry_changes.entry_tombstone(
        workspace=workspace, entry_id=entry.pk, reason=TombstoneReason.API, actor="t"
    )
    purge_now.entry_purge(workspace=workspace, entry=entry, actor="user:ops")
    (backup,) = Backup.objects.filter(workspace=workspace)
    assert backup.reason == "pre-prune"
    assert in_memory.exists(f"acme/{backup.file_name}")
    _, rows, _ = backup_files.read_backup(backup_files.stored_backup(backup))
    assert entry.pk in {r["id"] for r in rows["entry"]}


def test_a_backup_in_another_folder_is_listed_by_the_api_and_restored_by_the_command(
    workspace, elsewhere, settings
):
    settings.API_RATE_LIMIT_PER_MINUTE = 0
    populate(workspace)
    call_command("backup", "--workspace", "acme", "--json", stdout=StringIO())
    (backup,) = Backup.objects.filter(workspace=workspace)
    assert (elsewhere / "acme" / backup.file_name).is_file()

    _, raw = accounts.api_key_create(workspace=workspace, name="viewer", role="agent")
    listed = Client().get("/api/v1/backups", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    assert [item["file_name"] for item in listed["items"]] == [backup.file_name]

    Entry.objects.filter(workspace=workspace).delete()
    call_command("restore_backup", backup.file_name, "--workspace", "acme", "--json", stdout=StringIO())
    assert Entry.objects.filter(workspace=workspace).count() == 5


def test_a_failed_write_leaves_nothing_in_the_storage(workspace, in_memory, monkeypatch):
    def refuse(**kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Backup.objects, "create", refuse)
    with pytest.raises(backup_files.BackupError, match="No space left"):
        backups.write_backup(workspace, now=NOW)
    assert in_memory.listdir("acme") == ([], [])


def test_an_unknown_name_is_no_stored_backup(workspace, in_memory):
    assert backup_files.resolve_backup("nope.jsonl.gz", "acme") == Path("nope.jsonl.gz")
    with pytest.raises(backup_files.BackupError, match="no such backup"):
        backup_files.read_backup(backup_files.StoredBackup("acme/nope.jsonl.gz"))


def test_no_code_uses_backup_dir_but_the_default_storage():
    # BACKUP_DIR is where the default storage keeps its files, nothing more: every other path
    # goes through storages["backups"].
    users = sorted(
        str(path.relative_to(ROOT))
        for folder in ("config", "maintenance", "memory")
        for path in (ROOT / folder).rglob("*.py")
        if re.search(r"settings\.BACKUP_DIR|\bBACKUP_DIR\s*=", path.read_text())
    )
    assert users == ["config/settings.py", "maintenance/storage.py"]


def test_the_backups_storage_is_configured_by_environment():
    assert backup_storage({}) == {"BACKEND": "maintenance.storage.BackupDirStorage", "OPTIONS": {}}
    s3 = {
        "BACKUP_STORAGE_BACKEND": "storages.backends.s3.S3Storage",
        "BACKUP_STORAGE_OPTIONS": '{"bucket_name": "b", "location": "backups"}',
    }
    assert backup_storage(s3) == {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {"bucket_name": "b", "location": "backups"},
    }
    for bad in ("{not json", "[1, 2]"):
        with pytest.raises(ImproperlyConfigured, match="BACKUP_STORAGE_OPTIONS"):
            backup_storage({"BACKUP_STORAGE_OPTIONS": bad})
