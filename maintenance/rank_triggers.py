"""The database triggers that mark entries for the hygiene rank (``HygieneRankDirty``), for
PostgreSQL (statement-level, over transition tables: one INSERT … SELECT per statement, so a
run's batch of 500 status changes costs one extra statement, not 500) and SQLite (row-level,
with a WHEN clause). Installed by migration 0010; the columns named here are the ones the rank
reads (``maintenance.hygiene_rank``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

DIRTY = "maintenance_hygienerankdirty"
# A setting of the session the entries' trigger obeys on PostgreSQL: 'off' (for the rest of
# one transaction, inside ``unmarked``), the trigger writes no mark.
MARKS_SETTING = "memory_steward.rank_marks"
# The entry id of a mark that stands for every entry of its workspace: the next fold rebuilds
# the workspace's rank (no entry has id 0).
EVERY_ENTRY = 0
# The entry's columns the rank reads; a change of any of them marks the entry.
RANK_COLUMNS = (
    "workspace_id",
    "is_latest",
    "status",
    "title",
    "content_hash",
    "source",
    "last_feedback",
    "tier",
    "pinned",
    "held_at",
    "review_kept_hash",
    "created_at",
)
# A change of these may change the duplicate points of the entry's copies: the mark names
# its content hash, and folding recomputes every latest entry with that hash.
COPY_COLUMNS = ("workspace_id", "is_latest", "status", "content_hash", "created_at")


def _changed(columns: tuple[str, ...], op: str) -> str:
    return " OR ".join(f"n.{c} {op} o.{c}" for c in columns)


def entries_function(*, obeys_setting: bool = True, create: str = "CREATE") -> str:
    """The PostgreSQL function of the entries' triggers; with ``obeys_setting``, a transaction
    inside ``unmarked`` skips it (migration maintenance 0011 added that)."""
    quiet = (
        f"  IF current_setting('{MARKS_SETTING}', true) = 'off' THEN RETURN NULL; END IF;\n"
        if obeys_setting
        else ""
    )
    return f"""
{create} FUNCTION hygiene_rank_mark_entries() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
{quiet}  IF TG_OP = 'INSERT' THEN
    INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
    SELECT n.workspace_id, n.id, n.content_hash FROM new_rows n WHERE n.is_latest;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
    SELECT o.workspace_id, o.id, o.content_hash FROM old_rows o WHERE o.is_latest;
  ELSE
    INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
    SELECT n.workspace_id, n.id,
           CASE WHEN {_changed(COPY_COLUMNS, "IS DISTINCT FROM")} THEN n.content_hash END
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE (n.is_latest OR o.is_latest) AND ({_changed(RANK_COLUMNS, "IS DISTINCT FROM")});
    INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
    SELECT o.workspace_id, o.id, o.content_hash
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.is_latest AND (n.content_hash IS DISTINCT FROM o.content_hash
                           OR n.workspace_id IS DISTINCT FROM o.workspace_id);
  END IF;
  RETURN NULL;
END $$"""


POSTGRESQL_INSTALL = [
    entries_function(),
    f"""
CREATE FUNCTION hygiene_rank_mark_assessments() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
    SELECT e.workspace_id, e.id, NULL FROM old_rows o JOIN memory_entry e ON e.id = o.entry_id;
  ELSE
    INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
    SELECT e.workspace_id, e.id, NULL FROM new_rows n JOIN memory_entry e ON e.id = n.entry_id;
  END IF;
  RETURN NULL;
END $$""",
    "CREATE TRIGGER hygiene_rank_entry_insert AFTER INSERT ON memory_entry"
    " REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION hygiene_rank_mark_entries()",
    "CREATE TRIGGER hygiene_rank_entry_update AFTER UPDATE ON memory_entry"
    " REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows"
    " FOR EACH STATEMENT EXECUTE FUNCTION hygiene_rank_mark_entries()",
    "CREATE TRIGGER hygiene_rank_entry_delete AFTER DELETE ON memory_entry"
    " REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION hygiene_rank_mark_entries()",
    "CREATE TRIGGER hygiene_rank_assessment_insert AFTER INSERT ON maintenance_hygieneassessment"
    " REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION hygiene_rank_mark_assessments()",
    "CREATE TRIGGER hygiene_rank_assessment_update AFTER UPDATE ON maintenance_hygieneassessment"
    " REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows"
    " FOR EACH STATEMENT EXECUTE FUNCTION hygiene_rank_mark_assessments()",
    "CREATE TRIGGER hygiene_rank_assessment_delete AFTER DELETE ON maintenance_hygieneassessment"
    " REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION hygiene_rank_mark_assessments()",
]

POSTGRESQL_REMOVE = [
    *(
        f"DROP TRIGGER IF EXISTS hygiene_rank_{t} ON {table}"
        for table, names in (
            ("memory_entry", ("entry_insert", "entry_update", "entry_delete")),
            (
                "maintenance_hygieneassessment",
                ("assessment_insert", "assessment_update", "assessment_delete"),
            ),
        )
        for t in names
    ),
    "DROP FUNCTION IF EXISTS hygiene_rank_mark_entries()",
    "DROP FUNCTION IF EXISTS hygiene_rank_mark_assessments()",
]


def _sqlite_changed(columns: tuple[str, ...]) -> str:
    return " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in columns)


SQLITE_INSTALL = [
    f"""CREATE TRIGGER IF NOT EXISTS hygiene_rank_entry_insert AFTER INSERT ON memory_entry WHEN NEW.is_latest
BEGIN
  INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
  VALUES (NEW.workspace_id, NEW.id, NEW.content_hash);
END""",
    f"""CREATE TRIGGER IF NOT EXISTS hygiene_rank_entry_delete AFTER DELETE ON memory_entry WHEN OLD.is_latest
BEGIN
  INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
  VALUES (OLD.workspace_id, OLD.id, OLD.content_hash);
END""",
    f"""CREATE TRIGGER IF NOT EXISTS hygiene_rank_entry_update
AFTER UPDATE OF {", ".join(RANK_COLUMNS)} ON memory_entry
WHEN (NEW.is_latest OR OLD.is_latest) AND ({_sqlite_changed(RANK_COLUMNS)})
BEGIN
  INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
  VALUES (NEW.workspace_id, NEW.id, CASE WHEN {_sqlite_changed(COPY_COLUMNS)} THEN NEW.content_hash END);
  INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
  SELECT OLD.workspace_id, OLD.id, OLD.content_hash
  WHERE OLD.is_latest
    AND (NEW.content_hash IS NOT OLD.content_hash OR NEW.workspace_id IS NOT OLD.workspace_id);
END""",
    *(
        f"""CREATE TRIGGER IF NOT EXISTS hygiene_rank_assessment_{op.lower()}
AFTER {op} ON maintenance_hygieneassessment
BEGIN
  INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)
  SELECT e.workspace_id, e.id, NULL FROM memory_entry e WHERE e.id = {row}.entry_id;
END"""
        for op, row in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD"))
    ),
]

SQLITE_NAMES = tuple(
    f"hygiene_rank_{t}"
    for t in (
        "entry_insert",
        "entry_update",
        "entry_delete",
        "assessment_insert",
        "assessment_update",
        "assessment_delete",
    )
)
SQLITE_REMOVE = [f"DROP TRIGGER IF EXISTS {name}" for name in SQLITE_NAMES]


class Unmarked:
    """The marks of one transaction (``unmarked``): ``begin`` turns the entries' trigger off
    for the rest of it (PostgreSQL; a no-op on SQLite), and the transaction then ends with one
    mark standing for every entry of the workspace."""

    def __init__(self, workspace_id: int) -> None:
        self.workspace_id = workspace_id
        self.off = False

    def begin(self) -> None:
        if self.off or connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config(%s, 'off', true)", [MARKS_SETTING])
        self.off = True

    def end(self) -> None:
        if not self.off:
            return
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {DIRTY} (workspace_id, entry_id, content_hash)"
                " SELECT %s, %s, NULL FROM (SELECT set_config(%s, 'on', true)) AS marked_again",
                [self.workspace_id, EVERY_ENTRY, MARKS_SETTING],
            )
        self.off = False


@contextmanager
def unmarked(workspace_id: int, *, begin: bool = True) -> Iterator[Unmarked]:
    """One transaction (a savepoint inside the caller's) whose changes of entries the
    triggers do not mark one by one once it has begun (at once, or when the caller calls
    ``begin`` on what it yields): on PostgreSQL the entries' trigger is skipped for its
    statements from then on, and one mark standing for every entry of the workspace
    (``EVERY_ENTRY``) is written before it commits, so the next fold rebuilds the rank. For a
    batch of a pass that changes more entries than a fold would fold one by one
    (``hygiene_rank.REBUILD_OVER``), or a restore once it has written that many: the rank is
    rebuilt after it anyway, and the marks' INSERT was 1.4–3.5 ms of each ~12 ms batch of 500
    status changes (bench/reports/maintenance.md, "Where a batch's time goes"). The setting
    lasts as long as the transaction (or is undone with the savepoint), so no other statement
    of the session goes unmarked. On SQLite (row triggers, no setting) an ordinary
    transaction: every change is marked."""
    with transaction.atomic():
        marks = Unmarked(workspace_id)
        if begin:
            marks.begin()
        yield marks
        marks.end()


def obey_setting(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    """Migration maintenance 0011: the entries' trigger function learns ``MARKS_SETTING``."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(entries_function(create="CREATE OR REPLACE"))


def ignore_setting(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    """Migration maintenance 0011 reversed: the function without the setting (as 0010 made
    it before 0011 existed)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(entries_function(obeys_setting=False, create="CREATE OR REPLACE"))


def _run(schema_editor, statements: dict[str, list[str]]) -> None:  # type: ignore[no-untyped-def]
    for sql in statements.get(schema_editor.connection.vendor, []):
        schema_editor.execute(sql)


def install(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    _run(schema_editor, {"postgresql": POSTGRESQL_INSTALL, "sqlite": SQLITE_INSTALL})


def remove(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    _run(schema_editor, {"postgresql": POSTGRESQL_REMOVE, "sqlite": SQLITE_REMOVE})


def ensure_sqlite(conn: BaseDatabaseWrapper | None = None) -> bool:
    """Re-create the SQLite triggers a table rebuild dropped; True if it had to. Django's SQLite
    schema editor rebuilds a table for many ALTERs (copy, drop, rename), and dropping
    ``memory_entry`` or ``maintenance_hygieneassessment`` drops their triggers with it: the rank
    would silently stop hearing of changes. The writes made meanwhile were not marked, so every
    workspace's rank is rebuilt at its next fold (its state is forgotten). Meant for
    ``post_migrate``; a no-op on PostgreSQL (ALTER TABLE keeps triggers) and before migration
    maintenance 0010."""
    from django.db.migrations.recorder import MigrationRecorder

    conn = conn or connection
    if conn.vendor != "sqlite":
        return False
    if not MigrationRecorder(conn).migration_qs.filter(app="maintenance", name="0010_hygiene_rank").exists():
        return False
    with conn.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'hygiene_rank_%'")
        if set(SQLITE_NAMES) <= {name for (name,) in cursor.fetchall()}:
            return False
        for sql in SQLITE_INSTALL:
            cursor.execute(sql)
        cursor.execute("DELETE FROM maintenance_hygienerankstate")
    return True


def drop_before_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, plan: Any = None, **kwargs: Any) -> None:
    """Before ``migrate`` applies anything on SQLite (connected by ``MaintenanceConfig.ready``):
    drop the rank's triggers. Django rebuilds a table by creating a copy, dropping the table and
    renaming the copy, and SQLite checks every trigger of the schema at that rename: the
    assessment triggers name ``memory_entry`` and every trigger names the marks table, so a
    migration rebuilding either would fail. ``ensure_after_migrate`` re-creates them (and
    the ranks are rebuilt: the migrations' own writes were not marked). Nothing to apply:
    nothing is dropped."""
    conn = connections[using]
    if conn.vendor != "sqlite" or not plan:
        return
    with conn.cursor() as cursor:
        for sql in SQLITE_REMOVE:
            cursor.execute(sql)


def ensure_after_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    """After ``migrate`` (connected by ``MaintenanceConfig.ready``)."""
    ensure_sqlite(connections[using])
