import gc
import os
import threading
import time
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from django.db import connection, connections

from memory import accounts
from memory.models import Workspace

# The longest modules first (per --durations on 2026-12-06: the state machine about 2 minutes,
# the API fuzz 1.5, the stop and run-safety tests' real processes about a minute each; the
# hosted test, PostgreSQL only, about a minute).
# pytest-xdist hands tests out in collection order, so a long test collected late can run
# alone at the end while the other worker has nothing left. pytest-django then groups the tests
# as Django does (plain database tests, then transactional ones, then those that use no test
# database), so the order below holds within each group, and the long tests of the last group
# (real processes on databases of their own) are moved to the very front after it: on a slow
# machine (2026-12-07) the PostgreSQL pass spent its last 2–3 minutes on one worker, running
# the run-safety kill test (a minute) and the stop tests collected last.
LONG_FIRST = (
    "tests/test_lifecycle_stateful.py",
    "tests/test_api_fuzz.py",
    "tests/test_run_safety.py",
    "tests/test_hosted.py",
    "tests/test_stops.py",
    "tests/test_queued_runs.py",
    "tests/test_commands_proposals.py",
    "tests/test_backup_across_databases.py",
    "tests/test_serve.py",
    "tests/test_mcp.py",
)
# What makes pytest-django count a test as one that uses the test database.
_DATABASE_FIXTURES = (
    "db",
    "transactional_db",
    "live_server",
    "django_db_reset_sequences",
    "django_db_serialized_rollback",
)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _uses_test_database(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    marked = item.get_closest_marker("django_db") is not None
    return marked or any(name in names for name in _DATABASE_FIXTURES)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    # Before pytest-django's own (stable) sort: the order holds within each of its groups, and
    # no transactional test's flush moves ahead of a plain one.
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item), len(rank)))  # stable
    yield
    # After it: the long tests that touch no test database go first (stable again). They start
    # their own processes on databases of their own, so no database test depends on their order.
    items.sort(key=lambda item: 0 if _module(item) in rank and not _uses_test_database(item) else 1)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's, and before its teardown drops the test database on PostgreSQL: this
    thread's connections handed back, every connection pool Django knows of closed, then a
    wait of up to 5 s for other sessions on the database, then any still there ended and named
    in a warning, so that the drop cannot fail ("being accessed by other users") and leave the
    database behind. The check connects outside the pool: through Django's ``connection`` it
    opened a new pool, whose idle spare connection (its last statement the time-zone setting)
    was the very session it then waited 10 s for and ended. The warning names the process that
    holds each session's socket (``_holders``), and this process's threads when it is this
    one, and what in this process refers to its connection and whether a garbage collection
    closes it (``_owner``). That is how the last one seen was found: the live relay's read of
    the outbox, run while channels' test communicator had turned channels' connection clean-up
    off, kept its connection (``memory.events.Relay``, which now hands it back when it stops)."""
    yield
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            return
        connections.close_all()  # this thread's connections back to their pools, first
        for alias in connections:
            if connections[alias].vendor == "postgresql":
                connections[alias].close_pool()  # a connection still taken out stays open
        params = connection.get_connection_params()
        others = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        with psycopg.connect(**params, autocommit=True) as side:
            deadline = time.monotonic() + 5
            while True:
                left = side.execute(
                    f"SELECT pid, application_name, client_port, state, backend_start::text,"
                    f" left(query, 120) {others}"
                ).fetchall()
                if not left or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if left:
                # Named before their sockets close.
                held = [(*row, _holders(row[2]), _owner(row[0])) for row in left]
                side.execute(f"SELECT pg_terminate_backend(pid) {others}")
                warnings.warn(f"sessions left on the test database, ended: {held}", stacklevel=1)


def _owner(pid: int) -> str:
    """In this process, the psycopg connection to the session ``pid`` and what refers to it
    (types, two levels up), and whether a garbage collection closed it. "" when no connection
    of this process has that session; never raises."""
    try:
        described = _referred(pid)  # its own frame: no reference is left for the collection
        if not described:
            return ""
        gc.collect()
        after = "still open after one" if _connections(pid) else "closed by a garbage collection"
        return f"{'; '.join(described)}, {after}"
    except Exception as exc:  # a diagnosis only
        return f"owner unknown ({exc!r})"


def _connections(pid: int) -> list[psycopg.Connection]:
    return [
        obj
        for obj in gc.get_objects()
        # type(), not isinstance(): isinstance asks an object's __class__, which evaluates a
        # lazy object left on the heap (a request's user: a query, a new session).
        if issubclass(type(obj), psycopg.Connection) and not obj.closed and obj.info.backend_pid == pid
    ]


def _referred(pid: int) -> list[str]:
    found = _connections(pid)
    described = []
    for conn in found:
        chain = []
        for ref in gc.get_referrers(conn):
            if ref is not found:
                above = sorted({type(r).__name__ for r in gc.get_referrers(ref) if r is not found})
                chain.append(f"{type(ref).__name__}<-{above[:6]}")
        described.append(f"psycopg connection referred to by {chain[:6]}")
    return described


def _holders(port: int | None) -> str:
    """Which local processes hold the client end of a database session (its TCP port), read
    from /proc (Linux): each one's pid and command line, and when it is this process, the
    names of its threads. "unknown" where that cannot be told (another system, a Unix socket,
    a process gone meanwhile); never raises, so that the warning it goes into is always given."""
    try:
        return ", ".join(_proc_holders(port)) or "unknown"
    except Exception as exc:  # a diagnosis only
        return f"unknown ({exc!r})"


def _proc_holders(port: int | None) -> list[str]:
    if not port or port <= 0:
        return []
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for fields in (line.split() for line in lines):
            if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return []
    found = []
    for pid in (name for name in os.listdir("/proc") if name.isdigit()):
        if not any(_link(f"/proc/{pid}/fd/{fd}") in inodes for fd in _listing(f"/proc/{pid}/fd")):
            continue
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # gone meanwhile
            continue
        described = f"pid {pid}: {command.decode(errors='replace')[:160]}"
        if int(pid) == os.getpid():
            described += f" (this process; threads: {[t.name for t in threading.enumerate()]})"
        found.append(described)
    return found


def _listing(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:  # a process gone meanwhile, or not ours to read
        return []


def _link(path: str) -> str:
    """The socket inode a /proc file descriptor names ("" for anything else, or one closed
    meanwhile: the listing's own, for one)."""
    try:
        target = os.readlink(path)
    except OSError:
        return ""
    return target[8:-1] if target.startswith("socket:[") else ""


@pytest.fixture
def now() -> datetime:
    return datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def workspace(db) -> Workspace:
    # In apply review mode: most tests check what the passes themselves do. Propose mode, the
    # default of a new workspace, has its own tests (test_proposals.py) and fixture below.
    return accounts.workspace_create(slug="acme", name="Acme", review_mode="apply")


@pytest.fixture
def other_workspace(db) -> Workspace:
    return accounts.workspace_create(slug="globex", name="Globex", review_mode="apply")


@pytest.fixture
def propose_workspace(db) -> Workspace:
    return accounts.workspace_create(slug="initech", name="Initech")


@pytest.fixture(autouse=True)
def _empty_cache():
    # Counts and search estimates are cached per workspace id, and ids repeat across tests
    # (SQLite reuses them after a rollback): each test starts with an empty process cache.
    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache

    if isinstance(caches["default"], LocMemCache):  # never flush a shared Redis
        caches["default"].clear()


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    # The default PBKDF2 hasher costs about a second per password; tests don't need that.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _private_backup_dir(settings, tmp_path):
    # Every test writes backups into its own folder: parallel workers never share one, and no
    # test leaves files in the developer's var/backups.
    settings.BACKUP_DIR = tmp_path / "backups"


@pytest.fixture(scope="session")
def mcp_live(tmp_path_factory):
    """One real server for the MCP test modules (tests/mcp_live.py), started once per test
    process (per xdist worker) and only when a test asks for it; each module works in
    workspaces of its own."""
    from tests.mcp_live import SLUGS, live_server

    with live_server(tmp_path_factory.mktemp("mcp"), SLUGS) as server:
        yield server
