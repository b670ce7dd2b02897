"""PostgreSQL: an index that lets a broad search find its most important matches without
reading the table (memory.search, "broad query").

A broad query walks the workspace's visible entries by importance and keeps the first
RANK_CAP matches. Through the table, each walked entry is a random heap page (~5 us); with
(workspace, importance, id) carrying status and the tsvector, the walk is an index-only scan
(~0.4 us per entry, bench/reports/api.md). It costs about 370 MB per million entries.

Index-only scans skip the heap only for pages the visibility map marks all-visible, i.e.
vacuumed since their last change; autovacuum keeps that up. Right after a mass update (a
maintenance run rescoring every entry) a broad search reads the heap until autovacuum has
passed: slower, never wrong.

Built CONCURRENTLY (so the migration is not atomic) to leave writes running on a deployed
database. Dropping memory_entry.search_vector (see 0003) drops this index with it. Nothing on
SQLite, whose search has its own index (FTS5).
"""

from django.db import migrations

INDEX = "memory_entry_search_walk"
CREATE = f"""
    CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX}
    ON memory_entry (workspace_id, importance DESC, id DESC) INCLUDE (status, search_vector)
    WHERE is_latest AND status IN ('active', 'stale', 'archived')
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def reverse(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("memory", "0004_live_outbox"),
    ]

    operations = [
        migrations.RunPython(forward, reverse),
    ]
