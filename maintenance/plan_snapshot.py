"""On SQLite, a run's plan works on a private copy of the database instead of holding its
write lock.

The plan (``maintenance.runs._plan``) is one transaction rolled back at its end; on SQLite,
with one writer at a time, it would block every API write for the whole plan. The copy is one
consistent read of the database (SQLite's online backup, blocking no writer in WAL mode) in a
temporary file removed afterwards; the plan writes only into it. No copy inside a caller's
transaction (its uncommitted rows would be missing), nor when it cannot be made (the plan then
runs in the database, and logs it), nor with ``PLAN_SNAPSHOT = False``. How and where:
docs/maintenance.md ("Progress").
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)

_active: ContextVar[bool] = ContextVar("plan_snapshot", default=False)
PREFIX = "plan-"
LEFTOVER_SECONDS = 86400  # a copy this old belongs to no running plan (tasks time out sooner)


def possible() -> bool:
    """Whether a plan started now would run on a copy (SQLite, outside a caller's transaction)."""
    return (
        connection.vendor == "sqlite"
        and not connection.in_atomic_block
        and bool(getattr(settings, "PLAN_SNAPSHOT", True))
    )


def active() -> bool:
    """Whether the default connection is on a plan's copy right now."""
    return _active.get()


def folder() -> Path:
    """Where copies go: ``PLAN_SNAPSHOT_DIR``, else the database file's folder, else (an
    in-memory database) the system's temporary folder."""
    configured = getattr(settings, "PLAN_SNAPSHOT_DIR", None)
    if configured:
        return Path(configured)
    name = str(connection.settings_dict["NAME"])
    if name.startswith("file:") or name == ":memory:":
        return Path(tempfile.gettempdir())
    return Path(name).parent


def _remove_leftovers(where: Path, now: float) -> None:
    for old in where.glob(f"{PREFIX}*.sqlite3"):
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > LEFTOVER_SECONDS:
                _remove(str(old))


def _remove(path: str) -> None:
    for name in (path, f"{path}-journal", f"{path}-wal", f"{path}-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


@contextlib.contextmanager
def snapshot() -> Iterator[bool]:
    """Point the default connection at a fresh copy of the database until the block ends
    (yields True), or leave it as it is where ``possible`` says no (yields False)."""
    if not possible():
        yield False
        return
    connection.ensure_connection()
    source = connection.connection
    path = ""
    copy = None
    try:
        where = folder()
        _remove_leftovers(where, time.time())
        fd, path = tempfile.mkstemp(prefix=PREFIX, suffix=".sqlite3", dir=where)
        os.close(fd)
        # Django's own connection set-up: the same SQL functions and pragmas as the source.
        copy = connection.get_new_connection({**connection.get_connection_params(), "database": path})
        # A throwaway file: no syncing, and no journal while the pages are copied (into a WAL
        # file they would be written twice, several times slower: bench/reports/maintenance.md,
        # section "SQLite's plan on a copy of the database").
        copy.execute("PRAGMA journal_mode=OFF")
        copy.execute("PRAGMA synchronous=OFF")
        source.backup(copy)
        # The plan rolls back: its journal, in memory (the copied header said WAL).
        copy.execute("PRAGMA journal_mode=MEMORY")
        copy.isolation_level = source.isolation_level
    except (OSError, sqlite3.Error):
        log.warning("no copy of the database for the plan: it runs under the write lock", exc_info=True)
        if copy is not None:
            copy.close()
        if path:
            _remove(path)
        yield False
        return
    try:
        connection.connection = copy
        token = _active.set(True)
        try:
            yield True
        finally:
            _active.reset(token)
            connection.connection = source
    finally:
        copy.close()
        _remove(path)
