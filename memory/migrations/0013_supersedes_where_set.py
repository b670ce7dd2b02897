"""Index an entry's ``supersedes`` only where it is set: a first version (most rows) then has
no entry in that index, and a status change or score refresh of it one index insert fewer.

The field's own index is dropped by name rather than by AlterField, which on SQLite would
rebuild the whole entries table for it."""

import django.db.models.deletion
from django.db import migrations, models

FIELD_INDEX = "memory_entry_supersedes_id_05f0e729"  # what Django named the field's index


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0012_search_cover"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="entry",
                    name="supersedes",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="superseded_by",
                        to="memory.entry",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f"DROP INDEX IF EXISTS {FIELD_INDEX}",
                    reverse_sql=f"CREATE INDEX {FIELD_INDEX} ON memory_entry (supersedes_id)",
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="entry",
            index=models.Index(
                condition=models.Q(("supersedes__isnull", False)), fields=["supersedes"], name="entry_supersedes"
            ),
        ),
    ]
