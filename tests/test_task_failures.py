"""A scheduled run that fails still leaves its MaintenanceRun row with the error, so
the console shows every failure, even when the failure struck before run_maintenance could
write that row: here PostgreSQL ends the worker's session just as the run's row is inserted."""

import psycopg
import pytest
from django.db import OperationalError, connection

from maintenance import tasks
from maintenance.models import MaintenanceRun

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL ends a session on request"),
]


def test_a_run_whose_row_could_not_be_written_leaves_a_failed_row_with_the_error(workspace):
    ended = []

    def end_the_session_at_the_run_insert(execute, sql, params, many, context):
        if not ended and sql.startswith('INSERT INTO "maintenance_maintenancerun"'):
            pid = context["connection"].connection.info.backend_pid
            other_params = connection.get_connection_params()
            other_params.pop("context", None)
            with psycopg.connect(**other_params, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", [pid])
            ended.append(pid)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(end_the_session_at_the_run_insert), pytest.raises(OperationalError):
        tasks.run_scheduled(workspace.pk, "decay")
    assert ended
    (run,) = MaintenanceRun.objects.filter(workspace=workspace)
    assert (run.kind, run.trigger, run.status) == ("decay", "schedule", "failed")
    assert run.finished_at is not None
    assert "OperationalError: terminating connection" in run.error, run.error
