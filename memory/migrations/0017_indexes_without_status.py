"""No index of ``memory_entry`` names ``status`` any more, as a key or in a partial index's
condition: a status change then changes no indexed column, and on PostgreSQL it is a HOT update
(the new version beside the old on its page, which keeps room for it: fillfactor 70, migration
0010) instead of a new entry in each of the table's indexes. A first maintenance run of a large
workspace changes the status of most of its entries.

Four indexes keep their names and keys without the status; ``entry_sweep_age`` goes (the
sweeps by age read their rows in one pass). Not atomic on PostgreSQL: each new index is built
CONCURRENTLY under a temporary name, the old one dropped CONCURRENTLY, the new one renamed, so
a deployed database keeps answering writes of memory_entry meanwhile; run again after an
interruption, it drops what the interrupted attempt left and goes on.
"""

from django.db import migrations, models

OLD = [
    models.Index(
        condition=models.Q(("is_latest", True), ("status__in", ["active", "stale", "staged", "archived"])),
        fields=["workspace", "-importance", "-id"],
        name="entry_by_importance",
    ),
    models.Index(
        condition=models.Q(
            ("is_latest", True), ("status__in", ["active", "stale"]), ("tier", "constitutional")
        ),
        fields=["workspace", "-importance", "-id"],
        name="entry_constitutional",
    ),
    models.Index(
        condition=models.Q(("is_latest", True), ("status__in", ["active", "stale"]), ("tier", "episodic")),
        fields=["workspace", "id"],
        name="entry_sweep_decay_rows",
    ),
    models.Index(
        condition=models.Q(("is_latest", True), ("status", "staged")),
        fields=["workspace", "ttl_expires_at"],
        name="entry_sweep_staged",
    ),
]
NEW = [
    models.Index(
        condition=models.Q(("is_latest", True)),
        fields=["workspace", "-importance", "-id"],
        name="entry_by_importance",
    ),
    models.Index(
        condition=models.Q(("is_latest", True), ("tier", "constitutional")),
        fields=["workspace", "-importance", "-id"],
        name="entry_constitutional",
    ),
    models.Index(
        condition=models.Q(("is_latest", True), ("tier", "episodic")),
        fields=["workspace", "id"],
        name="entry_sweep_decay_rows",
    ),
    models.Index(
        condition=models.Q(("is_latest", True), ("ttl_expires_at__isnull", False)),
        fields=["workspace", "ttl_expires_at"],
        name="entry_sweep_staged",
    ),
]
AGE = models.Index(
    condition=models.Q(("is_latest", True), ("status__in", ["active", "stale", "archived"])),
    fields=["workspace", "status", "status_changed_at"],
    name="entry_sweep_age",
)


def _renamed(index, name):
    fresh = index.clone()
    fresh.name = name
    return fresh


def _swap(schema_editor, model, olds, news):
    """Replace each index of ``olds`` by the one of ``news`` with its name. On PostgreSQL the
    new one is built concurrently under a temporary name first (one left by an interrupted
    attempt, possibly invalid, is dropped before), then the old dropped and the new renamed;
    SQLite, which cannot rename an index, simply drops the old and builds the new."""
    if schema_editor.connection.vendor != "postgresql":
        for old, new in zip(olds, news, strict=True):
            schema_editor.remove_index(model, old)
            schema_editor.add_index(model, new)
        return
    for old, new in zip(olds, news, strict=True):
        building = _renamed(new, f"{new.name}_new")
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {building.name}")
        schema_editor.add_index(model, building, concurrently=True)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {old.name}")
        schema_editor.rename_index(model, building, new)


def forward(apps, schema_editor):
    entry = apps.get_model("memory", "Entry")
    _swap(schema_editor, entry, OLD, NEW)
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {AGE.name}")
    else:
        schema_editor.remove_index(entry, AGE)


def reverse(apps, schema_editor):
    entry = apps.get_model("memory", "Entry")
    concurrently = {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}
    schema_editor.add_index(entry, AGE, **concurrently)
    _swap(schema_editor, entry, NEW, OLD)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("memory", "0016_maintenance_policy")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, reverse)],
            state_operations=[
                *(migrations.RemoveIndex(model_name="entry", name=index.name) for index in [*OLD, AGE]),
                *(migrations.AddIndex(model_name="entry", index=index) for index in NEW),
            ],
        ),
    ]
