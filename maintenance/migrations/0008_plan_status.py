"""PlanStatus: the temporary table a run's plan keeps its status changes in (``managed =
False``: no table is ever created by a migration; the plan creates it as a TEMP table inside
its own transaction, see maintenance/plan_status.py)."""


from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('maintenance', '0007_hygiene_points'),
    ]

    operations = [
        migrations.CreateModel(
            name='PlanStatus',
            fields=[
                ('entry_id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('status', models.CharField(max_length=16)),
                ('changed_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'maintenance_planstatus',
                'managed': False,
            },
        ),
    ]
