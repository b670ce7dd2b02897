"""The SQLite full-text index kept attached to memory_entry.

The index lives in the database and is kept current by the database itself, so no write path
can forget it (imports insert with raw ``executemany``, restores write raw SQL, sweeps update
set-based): on PostgreSQL a stored generated ``tsvector`` column with a GIN index, on SQLite an
external-content FTS5 table kept in sync by triggers. Both are created by migration
``memory.0003_search`` and are not on the Django model, so the ORM never reads or writes them.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

# The triggers as migration memory.0003_search creates them. Django's SQLite schema editor
# rebuilds a table for many ALTERs (copy to a new table, drop the old, rename), and dropping
# memory_entry drops its triggers with it: the index would silently stop following writes.
SQLITE_TRIGGERS = {
    "memory_entry_fts_ai": """
        CREATE TRIGGER IF NOT EXISTS memory_entry_fts_ai AFTER INSERT ON memory_entry BEGIN
            INSERT INTO memory_entry_fts(rowid, title, content) VALUES (new.id, new.title, new.content);
        END""",
    "memory_entry_fts_ad": """
        CREATE TRIGGER IF NOT EXISTS memory_entry_fts_ad AFTER DELETE ON memory_entry BEGIN
            INSERT INTO memory_entry_fts(memory_entry_fts, rowid, title, content)
            VALUES ('delete', old.id, old.title, old.content);
        END""",
    "memory_entry_fts_au": """
        CREATE TRIGGER IF NOT EXISTS memory_entry_fts_au AFTER UPDATE OF title, content ON memory_entry
        BEGIN
            INSERT INTO memory_entry_fts(memory_entry_fts, rowid, title, content)
            VALUES ('delete', old.id, old.title, old.content);
            INSERT INTO memory_entry_fts(rowid, title, content) VALUES (new.id, new.title, new.content);
        END""",
}


# The covering index of the search's filter columns (_SQLITE_MATCHES names it), SQLite only:
# PostgreSQL reads them from its GIN-indexed rows, and every index there costs each non-HOT
# update. Created by migration memory.0012_search_cover; not on the model, so a table rebuild
# drops it like the triggers, and ensure_sqlite_index() re-creates it.
SQLITE_COVER_INDEX = (
    "CREATE INDEX IF NOT EXISTS entry_search_cover"
    " ON memory_entry (id, workspace_id, is_latest, status, importance)"
)


def ensure_sqlite_index(conn: BaseDatabaseWrapper | None = None) -> bool:
    """Re-create missing SQLite triggers and rebuild the index from the entries, and re-create
    the covering index; True if it had to. Meant for ``post_migrate``, after any migration that
    rebuilt memory_entry. A no-op on PostgreSQL (a generated column survives ALTER TABLE) and
    before migration 0003 (0012 for the covering index)."""
    conn = conn or connection
    if conn.vendor != "sqlite":
        return False
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT type, name FROM sqlite_master WHERE name IN ('memory_entry_fts', 'entry_search_cover') "
            "OR (type = 'trigger' AND tbl_name = 'memory_entry')"
        )
        present = {name for _, name in cursor.fetchall()}
        if "memory_entry_fts" not in present:
            return False
        cover_missing = "entry_search_cover" not in present and _migrated(conn, "0012_search_cover")
        if cover_missing:
            cursor.execute(SQLITE_COVER_INDEX)
        if set(SQLITE_TRIGGERS) <= present:
            return cover_missing
        for name, sql in SQLITE_TRIGGERS.items():
            if name not in present:
                cursor.execute(sql)
        cursor.execute("INSERT INTO memory_entry_fts(memory_entry_fts) VALUES ('rebuild')")
    return True


def _migrated(conn: BaseDatabaseWrapper, name: str) -> bool:
    from django.db.migrations.recorder import MigrationRecorder

    return MigrationRecorder(conn).migration_qs.filter(app="memory", name=name).exists()


def ensure_after_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """After ``migrate`` (connected by ``MemoryConfig.ready``): SQLite rebuilds memory_entry for
    many schema changes, dropping the full-text triggers with it."""
    ensure_sqlite_index(connections[using])
