"""Django's PostgreSQL backend, made safe across ``fork`` and reading ``timestamptz`` with
psycopg's compiled loader.

Invariants: a forked child never uses, closes nor finalises a pool or connection it inherited
(it opens its own on first use); the compiled loader is used only where it reads the same
values as Django's (a UTC session and a compiled psycopg; ``tests/test_db_backend.py`` proves
it), else Django's loader stays. Why the loader: bench/reports/api.md.
"""

from __future__ import annotations

import datetime
import os
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


# The session's memory for temporary tables, reserved only as they use it. A maintenance plan
# keeps its scores and status changes in temporary tables (~110 MB at 1,000,000 entries) and
# reads them once per entry of every pass; with PostgreSQL's default 8 MB they spilled to
# files and the plan's score statement alone took 1 s more (bench/reports/maintenance.md).
# It can only be set before the session's first temporary table: a startup option of every
# new session (beside the settings' own ``options``), not a statement on every checkout from
# the pool, which happens once per request.
TEMP_BUFFERS = "256MB"
# Floats printed exactly (PostgreSQL's default since 12, but a server or database may set 0,
# which prints 15 digits): the driver reads floats as text, and a backup must hold each one as
# stored, and a restore compare them so (maintenance/backup_files.py, ``digests_exact``).
EXTRA_FLOAT_DIGITS = 1


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        """Django registers its own ``timestamptz`` loader (``psycopg_any.BaseTzLoader``:
        psycopg's pure-Python loader plus a ``replace(tzinfo=...)``), several times slower than
        psycopg's compiled one, and a list page holds about five timestamps per entry. The
        compiled loader gives the same value whenever the session's zone is UTC, which Django
        sets on every connection when ``USE_TZ`` is on and the connection's zone is UTC; any
        other zone, or psycopg's pure-Python implementation, leaves Django's loader in place."""
        params = super().get_connection_params()
        if _CompiledLoader is not None and self.timezone is datetime.UTC and "context" in params:
            context = adapt.AdaptersMap(params["context"])
            context.register_loader("timestamptz", UTCTimestamptzLoader)
            params["context"] = context
        params["options"] = (
            f"{params.get('options') or ''} -c temp_buffers={TEMP_BUFFERS}"
            f" -c extra_float_digits={EXTRA_FLOAT_DIGITS}"
        ).strip()
        return params


# What a forked child inherited from its parent and must never use nor finalise (see below).
_INHERITED: list[Any] = []


def _forget_inherited_connections() -> None:
    """Run in every child right after ``fork``. django-q2 forks its workers, monitor and pusher
    from a process that has used the database; Django's psycopg pool (a class attribute of the
    backend) and any open connection come along, and two processes on one PostgreSQL session
    interleave their protocol messages ("the last operation didn't produce records", "prepared
    statement "_pg3_0" already exists" — psycopg numbers its prepared statements per
    connection, and both count from the same state —, "can't change 'autocommit' now"). q2
    calls ``connections.close_all()`` before it forks, but with the pool that hands the
    connection back to the pool, which the child inherits idle. So the child forgets them and
    opens its own on first use. They are not closed: closing would send PostgreSQL a Terminate
    message on a socket the parent still uses. They stay referenced in ``_INHERITED`` for the
    child's life, so no finaliser ever runs on them (multiprocessing's children leave through
    ``os._exit``)."""
    from django.db import connections

    pools: dict[str, Any] = base.DatabaseWrapper._connection_pools  # type: ignore[attr-defined]
    if pools:
        _INHERITED.append(dict(pools))
        pools.clear()
    # The thread that forked is the only one the child has; its connections are the ones
    # Django would reuse.
    for wrapper in connections.all(initialized_only=True):
        if wrapper.vendor == "postgresql" and wrapper.connection is not None:
            _INHERITED.append(wrapper.connection)
            wrapper.connection = None


os.register_at_fork(after_in_child=_forget_inherited_connections)
