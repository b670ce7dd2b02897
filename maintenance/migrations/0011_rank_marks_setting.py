from django.db import migrations

from maintenance import rank_triggers


class Migration(migrations.Migration):
    """The entries' trigger function of the hygiene rank obeys ``rank_triggers.MARKS_SETTING``
    (PostgreSQL; nothing on SQLite): a large run's batches write one mark instead of 500."""

    dependencies = [
        ("maintenance", "0010_hygiene_rank"),
    ]

    operations = [
        migrations.RunPython(rank_triggers.obey_setting, rank_triggers.ignore_setting, elidable=False),
    ]
