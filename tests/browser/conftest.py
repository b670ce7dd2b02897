"""Browser tests: Playwright (Python) drives Debian's Chromium against the real product.

One server and one browser per test session (per xdist worker): ``manage.py serve
--no-scheduler`` (uvicorn, the ASGI app of ``make run``) on a free port, over its own
temporary SQLite file — whatever database the rest of the suite runs on, pytest's test
database is not shared with another process — migrated and seeded by separate processes
(``tests/browser/seed.py``: one workspace per scenario, so tests do not see each other's
changes). Nothing here touches pytest's database.

Chromium is Debian's ``/usr/bin/chromium`` (``make browser`` installs it; Playwright never
downloads a browser). Without it, or without the ``playwright`` package, these tests skip
with a message saying so.

Every page a test visits is saved as ``var/screenshots/<name>.png`` (git-ignored).

Every browser context reports each Content-Security-Policy violation of its pages (the
``securitypolicyviolation`` event, and Chromium's console message for those no page event
tells): a test during which any page met one fails (``no_csp_violation``, autouse).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers_subprocess import free_port, migrated_sqlite

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = ROOT / "var" / "screenshots"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
# Set before any script of the page runs: the tests read it to know the live websocket is open.
WS_PROBE = """
window.__liveOpen = false;
document.addEventListener('htmx:wsOpen', () => { window.__liveOpen = true; });
document.addEventListener('htmx:wsClose', () => { window.__liveOpen = false; });
"""

# Every CSP violation any page of any context meets, as the page saw it, in order.
CSP_VIOLATIONS: list[dict[str, Any]] = []
_csp_reported = 0  # how many of them a test has failed on already
CSP_PROBE = """
document.addEventListener('securitypolicyviolation', (e) => {
  window.__reportCspViolation({
    page: location.href, directive: e.violatedDirective, blocked: e.blockedURI,
    source: `${e.sourceFile}:${e.lineNumber}`, sample: e.sample,
  });
});
"""


@dataclass
class Server:
    base: str
    env: dict[str, str]
    seed: dict[str, Any]
    password: str
    log: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def url(self, path: str) -> str:
        return self.base + path

    def manage(self, *args: str, timeout: float = 120) -> str:
        """``manage.py args`` in a separate process against the server's database."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"manage.py {' '.join(args)}: {done.stderr}"
        return done.stdout

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        """``manage.py args`` started in the background (stopped at the end of the session)."""
        with self.log.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, stdout=log, stderr=log
            )
        self.procs.append(proc)
        return proc


def _requirements() -> None:
    pytest.importorskip("playwright", reason="the playwright package is missing: pip install -e '.[dev]'")
    if not (CHROMIUM.exists() and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium (apt-get)")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    _requirements()
    tmp = tmp_path_factory.mktemp("browser")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        DATABASE_URL=migrated_sqlite(tmp / "db.sqlite3"),
        BACKUP_DIR=str(tmp / "backups"),
        DJANGO_DEBUG="1",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        DJANGO_SETTINGS_MODULE="config.settings",
        PYTHONUNBUFFERED="1",
        LOG_LEVEL="WARNING",
    )
    env.pop("REDIS_URL", None)  # the embedded mode: the worker reaches the page through the outbox
    password = secrets.token_urlsafe(12)
    seeded = subprocess.run(
        # "--password=…" in one argument: a random password may start with "-", which argparse
        # would take for an option of its own.
        [sys.executable, str(Path(__file__).with_name("seed.py")), f"--password={password}"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    seed = json.loads(seeded.stdout.strip().splitlines()[-1])
    srv = Server(
        base=f"http://127.0.0.1:{port}", env=env, seed=seed, password=password, log=tmp / "server.log"
    )
    web = srv.start("serve", "--no-scheduler", "--port", str(port))
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{srv.base}/api/v1/health", timeout=1)
            break
        except (urllib.error.URLError, ConnectionError):
            if web.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the server did not start:\n{srv.log.read_text()}")
            time.sleep(0.2)
    yield srv
    for proc in reversed(srv.procs):
        _stop(proc)


# Package scope, not session: while Playwright's sync API is open it keeps an event loop
# registered in the main thread, and every later test on the same worker then meets Django's
# SynchronousOnlyOperation on its first database call outside pytest-django (seen in CI after
# the browser tests: the run-safety and stop tests' own connections). Closed when the worker
# leaves this package; opened again should it come back.
@pytest.fixture(scope="package")
def browser(server: Server) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _page_violation(violation: dict[str, Any]) -> None:
    CSP_VIOLATIONS.append(violation)


def _console_violation(message: Any) -> None:
    # htmx reports its own errors (e.g. htmx:oobErrorNoTarget: a live fragment with no target
    # on the page) on the console: a page that meets one fails the test too.
    if "Content Security Policy" in message.text or message.text.startswith("htmx:"):
        CSP_VIOLATIONS.append({"page": message.page.url if message.page else "?", "console": message.text})


def new_context(browser: Any, server: Server) -> Any:
    context = browser.new_context(base_url=server.base, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    context.expose_function("__reportCspViolation", _page_violation)
    context.on("console", _console_violation)
    context.add_init_script(CSP_PROBE)
    context.add_init_script(WS_PROBE)
    return context


@pytest.fixture(autouse=True)
def no_csp_violation() -> Iterator[None]:
    """Fails the test if a page met a CSP violation since the last test checked (the session's
    login included)."""
    global _csp_reported
    yield
    new = CSP_VIOLATIONS[_csp_reported:]
    _csp_reported = len(CSP_VIOLATIONS)
    assert not new, f"Content-Security-Policy violations or htmx errors: {json.dumps(new, indent=1)}"


def log_in(page: Any, server: Server, *, next_path: str = "/console/") -> None:
    """Through the login form, as a person does."""
    page.goto(next_path)
    page.get_by_label("Username").fill(server.seed["username"])
    page.get_by_label("Password").fill(server.password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"**{next_path}")


@pytest.fixture(scope="package")
def logged_in(browser: Any, server: Server) -> Iterator[Any]:
    """A browser context whose session cookie belongs to the seeded operator (logged in once)."""
    context = new_context(browser, server)
    page = context.new_page()
    log_in(page, server)
    page.close()
    yield context
    context.close()


@pytest.fixture
def page(logged_in: Any) -> Iterator[Any]:
    page = logged_in.new_page()
    yield page
    flush_reports(page)
    page.close()


def flush_reports(page: Any) -> None:
    """Let the page's last violation reports reach CSP_VIOLATIONS before it closes: they
    travel the same connection as this round trip, ahead of it."""
    if not page.is_closed():
        page.evaluate("0")


def shot(page: Any, name: str) -> Path:
    """Save what the page shows now as var/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def wait_live(page: Any) -> None:
    """Until the page's live websocket is open (htmx's ws extension fired htmx:wsOpen)."""
    # A function, not an expression: Playwright evaluates a bare expression with the page's
    # eval, which the Content-Security-Policy refuses.
    page.wait_for_function("() => window.__liveOpen === true", timeout=10_000)
