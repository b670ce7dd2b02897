"""PlanScore: the temporary table a run's plan scores into (``managed = False``: no table is
ever created by a migration; the plan creates it as a TEMP table inside its own transaction).
HygieneAssessment: the text detectors' verdict per entry, kept while its title, content hash
and the residue patterns stay the same.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("maintenance", "0003_proposals_and_review_mode"),
        ("memory", "0006_operator_holds"),
    ]

    operations = [
        migrations.CreateModel(
            name="PlanScore",
            fields=[
                ("entry_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("importance", models.FloatField()),
                ("retention", models.FloatField()),
            ],
            options={
                "db_table": "maintenance_planscore",
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="HygieneAssessment",
            fields=[
                (
                    "entry",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="memory.entry",
                    ),
                ),
                ("content_hash", models.CharField(max_length=64)),
                ("title", models.TextField(blank=True)),
                ("patterns_key", models.CharField(max_length=64)),
                ("reasons", models.JSONField(default=list)),
            ],
        ),
    ]
