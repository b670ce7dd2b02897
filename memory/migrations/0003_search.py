"""The full-text index of entries (memory.search), kept current by the database itself.

PostgreSQL: a stored generated tsvector column (title weight A, content weight B) with a GIN
index on latest versions. SQLite: an external-content FTS5 table over memory_entry, kept in
sync by triggers, built once here. Neither is on the Django model (state is unchanged), so the
ORM never reads or writes them and every write path - ORM, raw executemany, set-based UPDATE -
keeps the index current.

Two consequences for later migrations:
- PostgreSQL refuses to change the type of a column a generated column reads ("cannot alter
  type of a column used by a generated column"): a migration that alters Entry.title or
  Entry.content must drop search_vector first and add it back after.
- Django's SQLite schema editor rebuilds memory_entry for many ALTERs, which drops the
  triggers; memory.search.ensure_sqlite_index() re-creates them and rebuilds the index.
"""

from django.db import migrations

POSTGRESQL_FORWARD = [
    """
    ALTER TABLE memory_entry ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english', coalesce(title, '')), 'A')
        || setweight(to_tsvector('english', coalesce(content, '')), 'B')
    ) STORED
    """,
    "CREATE INDEX memory_entry_search ON memory_entry USING gin (search_vector) WHERE is_latest",
]
POSTGRESQL_REVERSE = [
    "DROP INDEX IF EXISTS memory_entry_search",
    "ALTER TABLE memory_entry DROP COLUMN IF EXISTS search_vector",
]

SQLITE_FORWARD = [
    """
    CREATE VIRTUAL TABLE memory_entry_fts USING fts5(
        title, content, content='memory_entry', content_rowid='id',
        tokenize='porter unicode61 remove_diacritics 2'
    )
    """,
    """
    CREATE TRIGGER memory_entry_fts_ai AFTER INSERT ON memory_entry BEGIN
        INSERT INTO memory_entry_fts(rowid, title, content) VALUES (new.id, new.title, new.content);
    END
    """,
    """
    CREATE TRIGGER memory_entry_fts_ad AFTER DELETE ON memory_entry BEGIN
        INSERT INTO memory_entry_fts(memory_entry_fts, rowid, title, content)
        VALUES ('delete', old.id, old.title, old.content);
    END
    """,
    """
    CREATE TRIGGER memory_entry_fts_au AFTER UPDATE OF title, content ON memory_entry BEGIN
        INSERT INTO memory_entry_fts(memory_entry_fts, rowid, title, content)
        VALUES ('delete', old.id, old.title, old.content);
        INSERT INTO memory_entry_fts(rowid, title, content) VALUES (new.id, new.title, new.content);
    END
    """,
    "INSERT INTO memory_entry_fts(memory_entry_fts) VALUES ('rebuild')",
]
SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS memory_entry_fts_ai",
    "DROP TRIGGER IF EXISTS memory_entry_fts_ad",
    "DROP TRIGGER IF EXISTS memory_entry_fts_au",
    "DROP TABLE IF EXISTS memory_entry_fts",
]


FORWARD = {"postgresql": POSTGRESQL_FORWARD, "sqlite": SQLITE_FORWARD}
REVERSE = {"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE}


def forward(apps, schema_editor):
    for sql in FORWARD.get(schema_editor.connection.vendor, []):
        schema_editor.execute(sql)


def reverse(apps, schema_editor):
    for sql in REVERSE.get(schema_editor.connection.vendor, []):
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0002_audit_links_and_reverts"),
    ]

    operations = [
        migrations.RunPython(forward, reverse),
    ]
