"""A real server for the MCP tests, and the SDK's own client driven from synchronous tests.

``live_server()`` migrates and seeds a database of its own (a temporary SQLite file, or a fresh
PostgreSQL database on the suite's server when the suite runs on PostgreSQL: pytest's test
database is not shared with another process), then starts ``manage.py serve --no-scheduler``
(uvicorn, the ASGI app of ``make run``) on a free port. ``McpClient`` is the official SDK's
``Client`` over Streamable HTTP with a bearer key, run on an event loop of its own thread: one
task owns it from start to close, as the SDK's task groups require.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.helpers_subprocess import free_port

ROOT = Path(__file__).resolve().parent.parent
RATE_LIMIT = 150  # per key and minute on the test server: the rate-limit test spends one key's
# The workspaces seeded for the MCP test modules (tests/conftest.py starts the server once):
# test_mcp.py's, then test_mcp_isolation.py's.
SLUGS = ["acme", "globex", "initech", "soylent", "umbrella", "hooli", "piedpiper"]


@dataclass
class Live:
    base: str
    env: dict[str, str]
    seed: dict[str, Any]
    log: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.base + "/mcp"

    def ids(self, slug: str) -> dict[str, int]:
        return self.seed[slug]["ids"]

    def key(self, slug: str, name: str) -> str:
        return self.seed[slug]["keys"][name]

    def api(self, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
        """The JSON API's answer (status, body) to the same key."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.base}/api/v1{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def start(self, args: list[str], port: int) -> subprocess.Popen[bytes]:
        """Another server process on the same database (stopped at the end)."""
        env = {**self.env, "MCP_PUBLIC_URL": f"http://127.0.0.1:{port}/mcp"}
        with self.log.open("ab") as log:
            proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=log, stderr=log)
        self.procs.append(proc)
        wait_until_up(f"http://127.0.0.1:{port}", proc, self.log)
        return proc


def wait_until_up(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/v1/health", timeout=5)
            return
        except OSError:  # refused, reset, or slow to answer (TimeoutError) on a loaded machine
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{log.read_text()}") from None
            time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextmanager
def _database(tmp: Path) -> Iterator[str]:
    """A migrated database of the server's own: on PostgreSQL when the suite runs there."""
    from tests.helpers_subprocess import migrated_database

    url, drop = migrated_database(f"mcp_{secrets.token_hex(4)}", tmp)
    try:
        yield url
    finally:
        if drop is not None:
            drop()


@contextmanager
def live_server(tmp: Path, slugs: list[str]) -> Iterator[Live]:
    with _database(tmp) as database_url:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.pop("REDIS_URL", None)  # per-process rate-limit counters: other suites share that Redis
        env.update(
            DATABASE_URL=database_url,
            BACKUP_DIR=str(tmp / "backups"),
            DJANGO_SETTINGS_MODULE="config.settings",
            API_RATE_LIMIT_PER_MINUTE=str(RATE_LIMIT),
            MCP_PUBLIC_URL=f"http://127.0.0.1:{port}/mcp",
            PYTHONUNBUFFERED="1",
            LOG_LEVEL="WARNING",
        )
        seeded = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "mcp_seed.py"), *slugs],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        live = Live(
            base=f"http://127.0.0.1:{port}",
            env=env,
            seed=json.loads(seeded.stdout.strip().splitlines()[-1]),
            log=tmp / "server.log",
        )
        with live.log.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "serve", "--no-scheduler", "--port", str(port)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=log,
            )
        live.procs.append(proc)
        try:
            wait_until_up(live.base, proc, live.log)
            yield live
        finally:
            for each in reversed(live.procs):
                _stop(each)


class Alternating(httpx2.AsyncBaseTransport):
    """Sends each request to the next of ``ports`` in turn (one client, several processes)."""

    def __init__(self, ports: list[int]):
        self.inner = httpx2.AsyncHTTPTransport()
        self.ports = itertools.cycle(ports)
        self.answered: list[tuple[int, int]] = []  # (port, status) of every request

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = next(self.ports)
        request.url = request.url.copy_with(port=port)
        response = await self.inner.handle_async_request(request)
        self.answered.append((port, response.status_code))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class McpClient:
    """The SDK's ``Client`` for synchronous tests: every call runs in the one task that
    opened it, on an event loop of this client's own thread."""

    def __init__(
        self,
        url: str,
        key: str | None,
        *,
        mode: str = "auto",
        transport: httpx2.AsyncBaseTransport | None = None,
    ):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.jobs: asyncio.Queue[Any] | None = None
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.done = asyncio.run_coroutine_threadsafe(
            self._main(url, headers, mode, transport, ready), self.loop
        )
        try:
            ready.result(timeout=60)
        except BaseException:
            self._stop_loop()
            raise

    async def _main(
        self,
        url: str,
        headers: dict[str, str],
        mode: str,
        transport: httpx2.AsyncBaseTransport | None,
        ready: concurrent.futures.Future[None],
    ) -> None:
        self.jobs = asyncio.Queue()
        try:
            async with (
                httpx2.AsyncClient(headers=headers, transport=transport, timeout=60) as http,
                Client(streamable_http_client(url, http_client=http), mode=mode) as client,  # type: ignore[arg-type]
            ):
                self.client = client
                ready.set_result(None)
                while (job := await self.jobs.get()) is not None:
                    work, result = job
                    try:
                        result.set_result(await work(client))
                    except BaseException as exc:  # handed to the caller
                        result.set_exception(exc)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                raise

    def run(self, work: Callable[[Client], Awaitable[Any]], timeout: float = 60) -> Any:
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        assert self.jobs is not None
        self.loop.call_soon_threadsafe(self.jobs.put_nowait, (work, result))
        return result.result(timeout=timeout)

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return self.run(lambda c: c.call_tool(name, arguments or {}))

    def tools(self) -> list[Any]:
        return self.run(lambda c: c.list_tools()).tools

    def read(self, uri: str) -> str:
        result = self.run(lambda c: c.read_resource(uri))
        return result.contents[0].text

    @property
    def protocol_version(self) -> str:
        return self.client.protocol_version

    def close(self) -> None:
        if self.jobs is not None:
            self.loop.call_soon_threadsafe(self.jobs.put_nowait, None)
        try:
            self.done.result(timeout=30)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    def __enter__(self) -> McpClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
