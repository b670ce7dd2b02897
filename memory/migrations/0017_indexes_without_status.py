"""No index of ``memory_entry`` names ``status`` (as a key or in a partial index's condition)
any more, and on PostgreSQL the table keeps room on its pages (fillfactor 70): a status change
then touches no index, and PostgreSQL writes it as a HOT update beside the old version. A first
maintenance run of a large workspace changes the status of most of its entries; each of those
changes added an entry to every index before. ``entry_sweep_age`` goes (the sweeps by age read
their rows in one pass); the other four keep their names and keys without the status.

The fillfactor applies to pages written from now on; an existing table gets it on its next
rewrite (``VACUUM FULL memory_entry``, which locks the table while it runs)."""

from django.db import migrations, models

FILLFACTOR = 70


def fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE memory_entry SET (fillfactor = {FILLFACTOR})")


def default_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE memory_entry RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("memory", "0016_maintenance_policy")]

    operations = [
        migrations.RemoveIndex(model_name="entry", name="entry_sweep_staged"),
        migrations.RemoveIndex(model_name="entry", name="entry_sweep_age"),
        migrations.RemoveIndex(model_name="entry", name="entry_by_importance"),
        migrations.RemoveIndex(model_name="entry", name="entry_constitutional"),
        migrations.RemoveIndex(model_name="entry", name="entry_sweep_decay_rows"),
        migrations.AddIndex(
            model_name="entry",
            index=models.Index(
                condition=models.Q(("is_latest", True)),
                fields=["workspace", "-importance", "-id"],
                name="entry_by_importance",
            ),
        ),
        migrations.AddIndex(
            model_name="entry",
            index=models.Index(
                condition=models.Q(("is_latest", True), ("tier", "constitutional")),
                fields=["workspace", "-importance", "-id"],
                name="entry_constitutional",
            ),
        ),
        migrations.AddIndex(
            model_name="entry",
            index=models.Index(
                condition=models.Q(("is_latest", True), ("tier", "episodic")),
                fields=["workspace", "id"],
                name="entry_sweep_decay_rows",
            ),
        ),
        migrations.AddIndex(
            model_name="entry",
            index=models.Index(
                condition=models.Q(("is_latest", True), ("ttl_expires_at__isnull", False)),
                fields=["workspace", "ttl_expires_at"],
                name="entry_sweep_staged",
            ),
        ),
        migrations.RunPython(fillfactor, default_fillfactor),
    ]
