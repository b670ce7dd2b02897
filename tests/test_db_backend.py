"""config.postgresql: Django's PostgreSQL backend reading ``timestamptz`` with psycopg's
compiled loader. Every timestamp must come back as the instant stored, in UTC, exactly as
Django's own loader gives it (SQLite has its own converters: skipped there)."""

import datetime

import psycopg
import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader

from config.postgresql import base as backend
from config.postgresql.base import UTCTimestamptzLoader
from memory import new_entries
from memory.models import Entry

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's timestamptz loader"),
]

UTC = datetime.UTC
INSTANTS = [
    datetime.datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC),
    datetime.datetime(1970, 1, 1, tzinfo=UTC),
    datetime.datetime(2000, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
    datetime.datetime(1, 1, 1, tzinfo=UTC),
    datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime.datetime(2026, 6, 1, 12, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=5, minutes=30))),
]


def _read(cursor, value):
    cursor.execute("SELECT %s::timestamptz", [value])
    return cursor.fetchone()[0]


@pytest.mark.skipif(backend._CompiledLoader is None, reason="psycopg's pure-Python implementation")
def test_connections_read_timestamps_with_the_compiled_loader():
    connection.ensure_connection()
    loader = connection.connection.adapters.get_loader(1184, 0)  # timestamptz, text
    assert loader is UTCTimestamptzLoader


@pytest.mark.parametrize("instant", INSTANTS)
def test_the_compiled_loader_reads_what_djangos_loader_reads(instant):
    with connection.cursor() as cursor:
        fast = _read(cursor, instant)
    with connection.cursor() as cursor:
        register_tzloader(UTC, cursor.cursor)  # Django's own loader on this cursor
        slow = _read(cursor, instant)
    assert fast == slow == instant
    assert fast.tzinfo is UTC and slow.tzinfo is UTC
    assert fast.utcoffset() == datetime.timedelta(0)


@pytest.mark.skipif(backend._CompiledLoader is None, reason="Django's own loader relabels the wall time")
def test_a_session_in_another_zone_still_reads_utc():
    instant = INSTANTS[0]
    with connection.cursor() as cursor:
        cursor.execute("SET TIME ZONE 'America/Los_Angeles'")
        try:
            value = _read(cursor, instant)
        finally:
            cursor.execute("SET TIME ZONE 'UTC'")
    assert value == instant and value.tzinfo is UTC


def test_an_entry_reads_back_its_stored_instants(workspace):
    at = datetime.datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
    entry = new_entries.entry_create(workspace=workspace, content="timestamps", now=at, created_at=at)
    row = Entry.objects.get(pk=entry.pk)
    assert (row.created_at, row.updated_at, row.status_changed_at, row.scored_at) == (at, at, at, at)
    assert row.created_at.tzinfo is UTC


def test_every_connection_gives_temporary_tables_room_before_its_first_one():
    """A maintenance plan's temporary tables (scores, planned statuses) fit in the session's
    memory: set on every new connection, since it cannot change after the first one."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW temp_buffers")
        assert cursor.fetchone()[0] == backend.TEMP_BUFFERS
        cursor.execute("CREATE TEMP TABLE bench_probe (x int)")
        cursor.execute("DROP TABLE bench_probe")


def test_every_session_prints_floats_exactly_whatever_the_database_sets():
    """A database set to ``extra_float_digits = 0`` prints floats to 15 digits, and the driver
    reads them as text: a backup would hold them rounded. Every session of the project's
    backend asks for exact floats at its start, which outranks the database's setting."""
    name = connection.settings_dict["NAME"]
    admin = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    try:
        admin.execute(f'ALTER DATABASE "{name}" SET extra_float_digits = 0')
        plain = {k: v for k, v in connection.get_connection_params().items() if k != "options"}
        with psycopg.connect(**plain) as bare, psycopg.connect(**connection.get_connection_params()) as ours:
            assert bare.execute("SHOW extra_float_digits").fetchone()[0] == "0"
            assert ours.execute("SHOW extra_float_digits").fetchone()[0] == "1"
            exact = 1.2345678901234567
            assert bare.execute("SELECT %s::float8::text", [exact]).fetchone()[0] != repr(exact)
            assert ours.execute("SELECT %s::float8::text", [exact]).fetchone()[0] == repr(exact)
    finally:
        admin.execute(f'ALTER DATABASE "{name}" RESET extra_float_digits')
        admin.close()
