"""The importance index covers archived entries and orders by id too (lists filtered by any
statuses, and the walk of a broad search, read it in order without sorting).

Built as a new index before the old one is dropped, CONCURRENTLY on PostgreSQL (so this
migration is not atomic): a deployed database keeps answering reads and writes of
memory_entry while the index is built, instead of waiting on the lock DROP INDEX would hold
until the build committed.
"""

from django.db import migrations, models

OLD = models.Index(
    condition=models.Q(("is_latest", True), ("status__in", ["active", "stale", "staged"])),
    fields=["workspace", "-importance"],
    name="entry_live_by_importance",
)
NEW = models.Index(
    condition=models.Q(("is_latest", True), ("status__in", ["active", "stale", "staged", "archived"])),
    fields=["workspace", "-importance", "-id"],
    name="entry_by_importance",
)


def _swap(schema_editor, model, add, remove):
    concurrently = {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}
    schema_editor.add_index(model, add, **concurrently)
    schema_editor.remove_index(model, remove, **concurrently)


def forward(apps, schema_editor):
    _swap(schema_editor, apps.get_model("memory", "Entry"), NEW, OLD)


def reverse(apps, schema_editor):
    _swap(schema_editor, apps.get_model("memory", "Entry"), OLD, NEW)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("memory", "0004_live_outbox"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, reverse)],
            state_operations=[
                migrations.RemoveIndex(model_name="entry", name="entry_live_by_importance"),
                migrations.AddIndex(model_name="entry", index=NEW),
            ],
        ),
    ]
