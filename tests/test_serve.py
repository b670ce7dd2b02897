"""The product serves for real: `manage.py serve` under uvicorn (the ASGI app `make run` uses),
against its own migrated SQLite file, answering pages, API, static files and websockets."""

import asyncio
import concurrent.futures
import http.cookiejar
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import websockets
import websockets.exceptions

from tests.helpers_subprocess import migrated_sqlite

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("serve") / "db.sqlite3"
    env = {**os.environ, "DATABASE_URL": migrated_sqlite(db), "BACKUP_DIR": str(db.parent / "backups")}
    demo = subprocess.run(
        [sys.executable, "manage.py", "setup_demo"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--no-scheduler", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60  # a loaded machine: django, channels and the MCP SDK to import
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/api/v1/health", timeout=1)
            break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"server did not start: {proc.stdout.read().decode() if proc.stdout else ''}")
    yield {"base": base, "port": port, "demo_output": demo.stdout, "env": env}
    proc.terminate()
    proc.wait(timeout=10)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _get(url: str):
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        return opener.open(url, timeout=5)
    except urllib.error.HTTPError as exc:
        return exc


def test_it_serves_the_api_and_its_docs_without_a_cdn(server):
    assert _get(f"{server['base']}/api/v1/health").status == 200
    docs = _get(f"{server['base']}/api/v1/docs")
    assert docs.status == 200
    html = docs.read().decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower()
    assert _get(f"{server['base']}/static/ninja/swagger-ui-bundle.js").status == 200
    assert _get(f"{server['base']}/api/v1/openapi.json").status == 200


def test_its_unknown_api_paths_and_methods_answer_json(server):
    missing = _get(f"{server['base']}/api/v1/no-such-endpoint")
    assert missing.status == 404 and missing.headers["Content-Type"] == "application/json"
    assert set(json.loads(missing.read())) == {"detail"}
    request = urllib.request.Request(f"{server['base']}/api/v1/health", method="DELETE")
    try:
        urllib.request.urlopen(request, timeout=5)
        raise AssertionError("DELETE /health was accepted")
    except urllib.error.HTTPError as refused:
        assert refused.code == 405 and refused.headers["Content-Type"] == "application/json"
        assert "GET" in refused.headers["Allow"] and set(json.loads(refused.read())) == {"detail"}


def test_it_serves_the_mcp_endpoint_in_the_same_process(server):
    # The ASGI root ran the lifespan (the MCP session manager): /mcp answers, asking for a key.
    request = urllib.request.Request(
        f"{server['base']}/mcp",
        data=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}',
        method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
    )
    try:
        urllib.request.urlopen(request, timeout=5)
        raise AssertionError("/mcp answered without a key")
    except urllib.error.HTTPError as refused:
        assert refused.code == 401 and "resource_metadata=" in refused.headers["WWW-Authenticate"]
    metadata = json.loads(_get(f"{server['base']}/.well-known/oauth-protected-resource/mcp").read())
    assert metadata["resource"].endswith("/mcp")


def test_it_serves_admin_with_its_static_files(server):
    assert _get(f"{server['base']}/admin/login/").status == 200
    assert _get(f"{server['base']}/static/admin/css/base.css").status == 200


def test_the_console_asks_for_a_login(server):
    response = _get(f"{server['base']}/console/")
    assert response.status == 302
    assert response.headers["Location"].startswith("/accounts/login/")


def _login_cookie(server) -> str:
    """Log in through the real admin login form; return the Cookie header of the session."""
    password = server["demo_output"].split("with password: ")[1].split()[0]
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = opener.open(f"{server['base']}/accounts/login/", timeout=5).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    data = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": token, "username": "operator", "password": password, "next": "/console/"}
    ).encode()
    opener.open(f"{server['base']}/accounts/login/", data=data, timeout=5)
    cookies = {c.name: c.value for c in jar}
    assert "sessionid" in cookies, "login failed"
    return "; ".join(f"{k}={v}" for k, v in cookies.items())


def _handshake(server, path: str, cookie: str | None = None) -> str:
    async def run() -> str:
        uri = f"ws://127.0.0.1:{server['port']}{path}"
        headers = {"Cookie": cookie} if cookie else {}
        try:
            async with websockets.connect(
                uri, origin=f"http://127.0.0.1:{server['port']}", additional_headers=headers
            ) as ws:
                await ws.ping()
                return "open"
        except websockets.exceptions.InvalidStatus as refused:
            return f"refused {refused.response.status_code}"

    # In a thread of its own: Playwright's sync API (the browser tests, when this worker ran
    # them first) leaves an event loop running in the main thread, and asyncio.run refuses it.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, run()).result()


def test_members_get_a_live_websocket_and_strangers_are_refused(server):
    # Through the real server: the ASGI server, the Channels router, session auth and the
    # membership check all take part in the handshake.
    assert _handshake(server, "/ws/workspaces/demo/") == "refused 403"
    assert _handshake(server, "/ws/nowhere/") == "refused 403"
    cookie = _login_cookie(server)
    assert _handshake(server, "/ws/workspaces/demo/", cookie) == "open"
    assert _handshake(server, "/ws/workspaces/no-such-workspace/", cookie) == "refused 403"


def test_setup_demo_prints_a_generated_password_once_and_is_idempotent(server):
    assert "with password: " in server["demo_output"]
    password = server["demo_output"].split("with password: ")[1].split()[0]
    assert len(password) >= 12
    again = subprocess.run(
        [sys.executable, "manage.py", "setup_demo"],
        cwd=ROOT,
        env=server["env"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert password not in again.stdout
    assert "Demo ready" in again.stdout
