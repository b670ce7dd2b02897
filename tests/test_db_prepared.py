"""PostgreSQL: the API's repeated statements are prepared on the server (config.settings,
DB_PREPARED): after psycopg's threshold of 5 runs a statement is in pg_prepared_statements and
later runs reuse it. SQLite has no such thing (skipped there)."""

import pytest
from django.db import connection

from memory.models import Entry

pytestmark = pytest.mark.django_db


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL prepares statements")
def test_a_statement_run_five_times_is_prepared_on_the_server(workspace):
    def prepared() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%memory_entry%"]
            )
            return int(cursor.fetchone()[0])

    before = prepared()
    for _ in range(6):
        list(Entry.objects.filter(workspace=workspace, importance__gte=0.5).values_list("pk", flat=True))
    assert prepared() > before
