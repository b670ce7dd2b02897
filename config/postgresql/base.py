"""Django's PostgreSQL backend, reading ``timestamptz`` with psycopg's compiled loader.

Django registers its own loader for ``timestamptz`` (``psycopg_any.BaseTzLoader``): psycopg's
pure-Python loader plus a ``replace(tzinfo=...)``, ~6 us per value on the benchmark machine,
against ~0.5 us for psycopg's compiled loader (psycopg[binary]). A page of 20 entries holds
~100 timestamps: ~0.5 ms of CPU per list request (bench/reports/api.md). The compiled loader
gives the same value whenever the session's time zone is UTC, which Django sets on every
connection when ``USE_TZ`` is on and the connection's zone is UTC; any other zone, or
psycopg's pure-Python implementation, leaves Django's loader in place.
``tests/test_db_backend.py`` proves both loaders read the same values.
"""

from __future__ import annotations

import datetime
from typing import Any

import psycopg
import psycopg.postgres
from django.db.backends.postgresql import base
from psycopg import adapt
from psycopg.abc import AdaptContext
from psycopg.pq import Format

# The loader psycopg itself uses for timestamptz text: compiled when psycopg runs its binary
# or C implementation (psycopg[binary] or psycopg[c]), none with the pure-Python one.
_CompiledLoader: Any = (
    psycopg.adapters.get_loader(psycopg.postgres.types["timestamptz"].oid, Format.TEXT)
    if psycopg.pq.__impl__ in ("binary", "c")
    else None
)


class UTCTimestamptzLoader:
    """Loads ``timestamptz`` text with the compiled loader. A value in another zone (a session
    whose zone was changed behind Django's back) is converted to UTC: the same instant
    (Django's loader would relabel its wall time as UTC). ``timezone`` is what Django
    compares before putting its own loader back on a cursor."""

    format = Format.TEXT
    timezone = datetime.UTC

    def __init__(self, oid: int, context: AdaptContext | None = None):
        self._load = _CompiledLoader(oid, context).load

    def load(self, data: Any) -> datetime.datetime:
        value: datetime.datetime = self._load(data)
        return value if value.tzinfo is datetime.UTC else value.astimezone(datetime.UTC)


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        if _CompiledLoader is not None and self.timezone is datetime.UTC and "context" in params:
            context = adapt.AdaptersMap(params["context"])
            context.register_loader("timestamptz", UTCTimestamptzLoader)
            params["context"] = context
        return params
