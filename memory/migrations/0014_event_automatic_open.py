"""A partial index of the automatic archivals and tombstones not yet reverted: the review
tab of automatic changes and its count on every console page read those rows only, instead of
walking every event of the workspace (21 ms at 100,000 entries, growing with the events)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("maintenance", "0008_plan_status"),
        ("memory", "0013_supersedes_where_set"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="lifecycleevent",
            index=models.Index(
                condition=models.Q(
                    ("automatic", True),
                    ("entry__isnull", False),
                    ("reverted_at__isnull", True),
                    ("to_status__in", ["archived", "tombstoned"]),
                ),
                fields=["workspace", "run"],
                name="event_automatic_open",
            ),
        ),
    ]
