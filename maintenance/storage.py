"""Where backups live: the ``backups`` entry of ``settings.STORAGES``.

By default ``BackupDirStorage``, a FileSystemStorage on ``BACKUP_DIR`` (one folder per
workspace, private permissions). In hosted mode any Django storage backend every machine
reaches (django-storages' S3, Google Cloud or Azure backends, configured by environment in
``config.settings``): backups, their rotation and restores all go through this storage, so a
restore can run on another machine than the one that wrote the backup.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.conf import settings
from django.core.files.storage import FileSystemStorage


class BackupDirStorage(FileSystemStorage):
    """FileSystemStorage rooted at ``settings.BACKUP_DIR`` unless given a location (read when
    first used and again whenever the setting changes), folders 0700 and files 0600: a
    backup holds every memory of a workspace."""

    def __init__(self, location: Any = None, **options: Any) -> None:
        options.setdefault("directory_permissions_mode", 0o700)
        options.setdefault("file_permissions_mode", 0o600)
        super().__init__(location=location, **options)

    @cached_property
    def base_location(self) -> Any:
        return self._value_or_setting(getattr(self, "_location", None), str(settings.BACKUP_DIR))

    def _clear_cached_properties(self, setting: str, **kwargs: Any) -> None:
        super()._clear_cached_properties(setting, **kwargs)  # type: ignore[arg-type]
        if setting == "BACKUP_DIR":
            self.__dict__.pop("base_location", None)
            self.__dict__.pop("location", None)
