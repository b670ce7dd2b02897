"""A server-side error of the API answers JSON ``{"detail": ...}`` whatever DEBUG says:
503 with Retry-After when the database is locked or unreachable, 500 otherwise; never
Django's HTML page nor django-ninja's plain-text traceback. Every error here is a real one of
a real database: a row lock held by another connection, a column that is not there."""

import json
import sqlite3

import psycopg
import pytest
from django.db import connection
from django.test import Client

from config.middleware import RETRY_AFTER_SECONDS
from memory import accounts, new_entries

DEBUG_MODES = pytest.mark.parametrize("debug", [True, False], ids=["debug", "production"])


def call(method: str, path: str, secret: str, body=None, **client_options):
    client = Client(**client_options)
    kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body is not None else {}
    return getattr(client, method)(f"/api/v1{path}", HTTP_AUTHORIZATION=f"Bearer {secret}", **kwargs)


def assert_json(response, status: int) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json", response.content[:300]
    body = json.loads(response.content)
    assert set(body) == {"detail"}
    assert "Traceback" not in body["detail"]
    return body


@pytest.fixture
def agent(workspace) -> str:
    return accounts.api_key_create(workspace=workspace, name="errors", role="agent")[1]


@DEBUG_MODES
@pytest.mark.django_db
def test_a_database_error_answers_500_json(workspace, agent, settings, debug):
    settings.DEBUG = debug
    new_entries.entry_create(workspace=workspace, content="a memory the list cannot read")
    with connection.cursor() as cursor:  # undone with the test's transaction
        cursor.execute("ALTER TABLE memory_entry RENAME COLUMN content TO content_gone")
    body = assert_json(call("get", "/entries", agent), 500)
    assert body["detail"] == "internal server error"


@pytest.fixture
def locked_entry(workspace):
    """An entry whose row another connection holds locked (for update) until the test ends."""
    entry = new_entries.entry_create(workspace=workspace, content="a memory someone else is writing")
    if connection.vendor == "postgresql":
        params = connection.get_connection_params()
        params.pop("context", None)
        other = psycopg.connect(**params)
        other.execute("SELECT id FROM memory_entry WHERE id = %s FOR UPDATE", [entry.pk])
        with connection.cursor() as cursor:  # instead of waiting, give up at once
            cursor.execute("SET lock_timeout = '50ms'")
    else:
        # The test database is SQLite's shared-cache memory database: a second connection to it
        # that holds the write lock makes every writer fail with "database table is locked".
        other = sqlite3.connect(connection.settings_dict["NAME"], uri=True, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE memory_entry SET title = 'held' WHERE id = ?", [entry.pk])
    yield entry
    other.rollback()
    other.close()
    if connection.vendor == "postgresql":
        # The session setting went back to the pool with its connection, whichever that is
        # now: a new pool, so that no later test inherits it.
        connection.close()
        connection.close_pool()


@DEBUG_MODES
@pytest.mark.django_db(transaction=True)
def test_a_lock_answers_503_json_with_retry_after(workspace, agent, locked_entry, settings, debug):
    settings.DEBUG = debug
    response = call("post", f"/entries/{locked_entry.pk}/access", agent, {"actor": "agent-1"})
    body = assert_json(response, 503)
    assert response["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert "retry" in body["detail"]


def _behind_the_api_middleware(view):
    """``view`` as Django calls it inside the middleware chain, its exceptions turned into
    Django's own 500 page (the debug page with DEBUG), with api_json_errors outside it."""
    from django.core.handlers.exception import convert_exception_to_response

    from config.middleware import api_json_errors

    return api_json_errors(convert_exception_to_response(view))


@DEBUG_MODES
@pytest.mark.django_db(transaction=True)
def test_an_error_that_escapes_the_api_handlers_still_answers_json(locked_entry, settings, debug):
    # A middleware or anything else outside django-ninja's exception handlers raising: Django
    # answers HTML, and api_json_errors turns it into the API's shape, 503 for a lock.
    from django.test import RequestFactory

    settings.DEBUG = debug

    def write_the_locked_row(request):
        with connection.cursor() as cursor:
            cursor.execute("UPDATE memory_entry SET title = 'mine' WHERE id = %s", [locked_entry.pk])

    def read_a_missing_table(request):
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    request = RequestFactory().post("/api/v1/entries")
    response = _behind_the_api_middleware(write_the_locked_row)(request)
    assert_json(response, 503)
    assert response["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert_json(_behind_the_api_middleware(read_a_missing_table)(RequestFactory().get("/api/v1/x")), 500)
    page = _behind_the_api_middleware(read_a_missing_table)(RequestFactory().get("/console/"))
    assert page.status_code == 500 and page["Content-Type"].startswith("text/html")  # not the API's
