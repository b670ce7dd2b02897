from datetime import UTC, datetime

import pytest

from memory import accounts
from memory.models import Workspace


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
