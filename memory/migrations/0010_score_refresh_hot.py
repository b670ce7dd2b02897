"""Score refreshes of memory_entry can be HOT updates on PostgreSQL.

A maintenance run rewrites importance, retention and scored_at of every latest entry. On
PostgreSQL an UPDATE that changes no indexed column, and finds room on the row's page, is a
HOT update: no new entry in any of the table's indexes (13, the full-text GIN index among
them). So:

* the decay pass's partial index no longer holds retention (it holds the rows in id order, the
  pass's keyset order, and the pass reads retention off them);
* memory_entry keeps 30% of each page free (fillfactor 70) for the new row versions. This
  applies to pages written from now on; an existing table gets it as its pages are rewritten
  (``VACUUM FULL memory_entry`` or pg_repack applies it at once, at the cost of a lock).

On SQLite only the index changes (an UPDATE there touches only the indexes of the columns it
changes). Not atomic on PostgreSQL: the new index is built CONCURRENTLY, before the old one is
dropped, so a deployed database keeps answering writes of memory_entry meanwhile.
"""

from django.db import migrations, models

OLD = models.Index(
    condition=models.Q(("is_latest", True), ("status__in", ["active", "stale"]), ("tier", "episodic")),
    fields=["workspace", "retention"],
    name="entry_sweep_decay",
)
NEW = models.Index(
    condition=models.Q(("is_latest", True), ("status__in", ["active", "stale"]), ("tier", "episodic")),
    fields=["workspace", "id"],
    name="entry_sweep_decay_rows",
)
FILLFACTOR = 70


def _swap(schema_editor, model, add, remove):
    concurrently = {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}
    schema_editor.add_index(model, add, **concurrently)
    schema_editor.remove_index(model, remove, **concurrently)


def forward(apps, schema_editor):
    entry = apps.get_model("memory", "Entry")
    _swap(schema_editor, entry, NEW, OLD)
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE memory_entry SET (fillfactor = {FILLFACTOR})")


def reverse(apps, schema_editor):
    entry = apps.get_model("memory", "Entry")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE memory_entry RESET (fillfactor)")
    _swap(schema_editor, entry, OLD, NEW)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("memory", "0009_entry_constitutional_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, reverse)],
            state_operations=[
                migrations.RemoveIndex(model_name="entry", name="entry_sweep_decay"),
                migrations.AddIndex(model_name="entry", index=NEW),
            ],
        ),
    ]
