"""Move an entry's retention and ``scored_at`` out of the wide ``memory_entry`` row into the
narrow ``memory_entryscore`` (one row per entry): a sweep rewrites them on every run, and every
rewrite of the entry row added an entry to each of its indexes. The values are copied over."""

import django.db.models.deletion
from django.db import migrations, models

COPY = (
    "INSERT INTO memory_entryscore (entry_id, retention, scored_at)"
    " SELECT id, retention, scored_at FROM memory_entry"
)
COPY_BACK = (
    "UPDATE memory_entry SET"
    " retention = COALESCE((SELECT s.retention FROM memory_entryscore s WHERE s.entry_id = memory_entry.id), 1.0),"
    " scored_at = (SELECT s.scored_at FROM memory_entryscore s WHERE s.entry_id = memory_entry.id)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0014_event_automatic_open"),
    ]

    operations = [
        migrations.CreateModel(
            name="EntryScore",
            fields=[
                (
                    "entry",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="score",
                        serialize=False,
                        to="memory.entry",
                    ),
                ),
                ("retention", models.FloatField(default=1.0)),
                ("scored_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.RunSQL(COPY, reverse_sql=COPY_BACK),
        migrations.RemoveField(model_name="entry", name="retention"),
        migrations.RemoveField(model_name="entry", name="scored_at"),
    ]
