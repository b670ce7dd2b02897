"""Hosted mode for real: two web processes (uvicorn) and two workers (``manage.py qcluster``),
each its own process tree, on PostgreSQL and Redis with the production settings
(``DJANGO_DEBUG=0``, a ``SECRET_KEY``, ``ALLOWED_HOSTS``, ``REDIS_URL``, ``DB_POOL=1``).

Where the test may (root, ``ip`` present, ``ip netns add`` allowed) each of the four runs in a
network namespace of its own, linked to this one by a veth pair: web and workers reach the
database and Redis over a real network link, and the test reaches the web processes over
theirs. PostgreSQL and Redis listen on 127.0.0.1 only (their default; the test does not
reconfigure servers it shares), so the test relays their ports from the host end of each
link to loopback (``Relay``): the services see connections from 127.0.0.1, the processes under
test see a database and a Redis at another address. Elsewhere everything runs on loopback.

The scenario, in about a minute: 20 workspaces seeded, the API driven through both web
processes, a burst of concurrent runs on one workspace (one is queued, the rest are refused and
recorded ``skipped``), then the workers start (one does the queued run) and the dispatcher is
put on their queue every two seconds (``tick``: django-q2's own scheduler looks at its
schedules every 30 s only); every workspace gets its due full run exactly once (alone: it
sweeps too), however many dispatches run, in which cluster, at once or not; then half the
workspaces' sweeps are made a minute old (the history the dispatcher reads, aged instead of
waiting a real minute) and each of those gets exactly one more. A websocket client of web
process A sees a worker's run start and end (channels-redis). Then SIGTERM to every tree: each
stops with no process left, and no log holds a traceback.

PostgreSQL only (the hosted database); its own database, and Redis db 13 of the server at
127.0.0.1:6379 (``TEST_REDIS_URL`` names another), so it shares nothing with the rest of the
suite running beside it. ``make test-hosted`` runs it alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import F

from maintenance.models import MaintenanceRun
from tests.helpers_subprocess import (
    ROOT,
    database_alias,
    free_port,
    helper,
    kill_tree,
    migrated_postgres,
    stop_tree,
    subprocess_env,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="hosted mode runs on PostgreSQL (and Redis)"
)

ALIAS = "hosted"
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13")  # the suite uses db 0 or none
WORKSPACES = 20
BURST = "hosted-00"  # the big one: its runs last long enough to overlap
LIVE = "hosted-01"  # the one the websocket client watches
PLACES = ("web-a", "web-b", "worker-a", "worker-b")
# 20 workspaces of 20 entries, the burst's of 600 (its run lasts long enough to overlap).
SEED = ["hosted-seed", "--workspaces", str(WORKSPACES), "--entries", "20", "--big", "600"]
TICK = 2.0  # seconds between two dispatches
# As the example systemd unit runs it (one process per web place here).
UVICORN = [sys.executable, "-m", "uvicorn", "config.asgi:application"]  # lifespan auto: /mcp needs it
UVICORN += ["--timeout-graceful-shutdown", "5"]
QUIET = 2 * TICK  # dispatches that must find nothing more to do


# --- the network ----------------------------------------------------------------------------------


class Relay:
    """A TCP relay on its own event-loop thread: each connection to a listening address is
    forwarded to the same port on 127.0.0.1."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.servers: list[asyncio.base_events.Server] = []
        self.thread = threading.Thread(target=self.loop.run_forever, name="relay", daemon=True)
        self.thread.start()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def _serve(self, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        with contextlib.suppress(asyncio.CancelledError):  # the relay closes
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def listen(self, host: str, port: int) -> None:
        start = asyncio.start_server(partial(self._serve, port), host, port, reuse_address=True)
        self.servers.append(asyncio.run_coroutine_threadsafe(start, self.loop).result(10))

    async def _shutdown(self) -> None:
        for server in self.servers:
            server.close()
        connections = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@dataclass
class Place:
    """Where processes run: a command prefix, the address they reach the services at, and
    the address their servers listen on (and the test reaches them at)."""

    name: str
    prefix: list[str]
    services: str
    address: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@contextlib.contextmanager
def network(ports: list[int]) -> Iterator[tuple[dict[str, Place], str]]:
    """The four places (network namespaces, or loopback where none can be made) and what
    was chosen, for the report."""
    loopback = {name: Place(name, [], "127.0.0.1", "127.0.0.1") for name in PLACES}
    tag = uuid.uuid4().hex[:6]
    probe = f"ms{tag}p"
    why = ""
    if os.environ.get("TEST_HOSTED_NETWORK") == "loopback":
        why = "TEST_HOSTED_NETWORK=loopback"
    elif os.geteuid() != 0:
        why = "not root"
    elif shutil.which("ip") is None:
        why = "no ip command"
    else:
        try:
            _ip("netns", "add", probe)
            _ip("netns", "del", probe)
        except (subprocess.CalledProcessError, OSError) as exc:
            why = f"ip netns add refused: {getattr(exc, 'stderr', b'') or exc}"
    if why:
        yield loopback, f"loopback ({why})"
        return
    made: list[str] = []
    relay = Relay()
    subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
    places: dict[str, Place] = {}
    try:
        for i, name in enumerate(PLACES):
            ns, host_end, ns_end = f"ms{tag}{i}", f"ms{tag}h{i}", f"ms{tag}n{i}"
            host_ip, ns_ip = f"{subnet}.{4 * i + 1}", f"{subnet}.{4 * i + 2}"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            _ip("link", "set", ns_end, "netns", ns)
            _ip("addr", "add", f"{host_ip}/30", "dev", host_end)
            _ip("link", "set", host_end, "up")
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_end)
            _ip("netns", "exec", ns, "ip", "link", "set", ns_end, "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
            for port in ports:
                relay.listen(host_ip, port)
            places[name] = Place(name, ["ip", "netns", "exec", ns], host_ip, ns_ip)
        yield places, f"network namespaces {', '.join(made)} over veth links ({subnet}.0/24)"
    finally:
        relay.close()
        for ns in made:  # deleting a namespace deletes its end of the link, and so the link
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", ns)


# --- the processes --------------------------------------------------------------------------------


@dataclass
class Hosted:
    env: dict[str, str]  # the production settings, services on 127.0.0.1 (the test's side)
    places: dict[str, Place]
    how: str
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env_at(self, place: Place) -> dict[str, str]:
        env = dict(self.env)
        for name in ("DATABASE_URL", "REDIS_URL"):
            env[name] = (
                env[name]
                .replace("@127.0.0.1:", f"@{place.services}:")
                .replace("//127.0.0.1:", f"//{place.services}:")
            )
        return env

    def start(self, name: str, place: Place, args: list[str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                [*place.prefix, *args],
                cwd=ROOT,
                env=self.env_at(place),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process tree (and group) of its own
            )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")


def _port(url: str, default: int) -> int:
    return urllib.parse.urlsplit(url).port or default


def _redis_answers(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="module")
def hosted(tmp_path_factory, django_db_blocker) -> Iterator[Hosted]:
    if not _redis_answers(REDIS_URL):
        pytest.skip(f"Redis is not answering at {REDIS_URL} (TEST_REDIS_URL names another)")
    parts = urllib.parse.urlsplit(REDIS_URL)
    if parts.hostname not in ("127.0.0.1", "localhost"):
        pytest.skip("the hosted test relays a Redis on this machine's loopback only")
    logs = tmp_path_factory.mktemp("hosted")
    url, drop = migrated_postgres(f"ms_hosted_{uuid.uuid4().hex[:12]}")
    assert "@127.0.0.1:" in url or "//127.0.0.1:" in url or "localhost" in url, url
    url = url.replace("localhost", "127.0.0.1")
    env = subprocess_env(url, logs / "backups")
    env.update(
        DJANGO_DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        REDIS_URL=REDIS_URL.replace("localhost", "127.0.0.1"),
        DB_POOL="1",
        Q_WORKERS="2",
        LOG_LEVEL="INFO",
    )
    try:
        with network([_port(url, 5432), _port(REDIS_URL, 6379)]) as (places, how):
            addresses = sorted({p.address for p in places.values()} | {"127.0.0.1"})
            env["ALLOWED_HOSTS"] = ",".join(addresses)
            run = Hosted(env=env, places=places, how=how, logs=logs)
            try:
                with database_alias(ALIAS, url), django_db_blocker.unblock():
                    yield run
            finally:  # whatever a failed test left running
                for proc in run.procs.values():
                    if proc.poll() is None:
                        kill_tree(proc.pid)
                        proc.wait(10)
    finally:
        drop()


# --- talking to it --------------------------------------------------------------------------------


def call(base: str, key: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """An API call as a client behind the TLS-terminating proxy makes it."""
    request = urllib.request.Request(
        base + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "X-Forwarded-Proto": "https",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def mcp(base: str, key: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One JSON-RPC request to ``/mcp`` (stateless: no session, any web process answers)."""
    request = urllib.request.Request(
        base + "/mcp",
        method="POST",
        data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode(),
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
    if text.lstrip().startswith("{"):
        return json.loads(text)
    data = [line[5:] for line in text.splitlines() if line.startswith("data:")]  # an SSE answer
    return json.loads(data[-1])


def healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/api/v1/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


class Watcher:
    """A websocket client of one web process on one workspace's live page, keeping every
    fragment it is sent."""

    def __init__(self, url: str, origin: str, session: str) -> None:
        from websockets.sync.client import connect

        self.frames: list[str] = []
        self.stack = contextlib.ExitStack()
        self.socket = self.stack.enter_context(
            connect(
                url, additional_headers={"Cookie": f"sessionid={session}", "Origin": origin}, open_timeout=10
            )
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):
            for frame in self.socket:
                self.frames.append(str(frame))

    def saw(self, run_id: int, status: str) -> bool:
        return any(f'data-run-id="{run_id}" data-status="{status}"' in frame for frame in self.frames)

    def close(self) -> None:
        self.stack.close()
        self.thread.join(5)


def runs(**filters: Any) -> list[MaintenanceRun]:
    return list(
        MaintenanceRun.objects.using(ALIAS).filter(**filters).select_related("workspace").order_by("pk")
    )


# --- the scenario ---------------------------------------------------------------------------------


def test_two_web_processes_and_two_workers_in_their_own_trees_keep_every_promise(hosted):
    began = time.monotonic()
    timings: dict[str, float] = {}
    print(f"\nhosted test on {hosted.how}")  # in the report with -s or on failure

    seeded = json.loads(
        helper(
            [*SEED, "--now", datetime.now(UTC).isoformat()],
            hosted.env,
            timeout=120,
        ).splitlines()[-1]
    )
    keys: dict[str, str] = seeded["keys"]
    assert len(keys) == WORKSPACES

    # Two web processes, each its own tree in its own place.
    bases = {}
    for name in ("web-a", "web-b"):
        place = hosted.places[name]
        port = free_port()
        hosted.start(
            name,
            place,
            [*UVICORN, "--host", place.address, "--port", str(port)],
        )
        bases[name] = f"http://{place.address}:{port}"
    for name, base in bases.items():
        wait_for(f"{name} to serve", lambda base=base: healthy(base))
    timings["seeded, web up"] = time.monotonic() - began

    # The API through both: every workspace written and read through A and B alternately.
    def drive(i: int, slug: str) -> list[tuple[str, int]]:
        key, answers = keys[slug], []
        for j in range(4):
            base = bases["web-a" if (i + j) % 2 == 0 else "web-b"]
            note = {"content": f"{slug} note {j} via {base}"}
            status, _ = call(base, key, "POST", "/api/v1/entries", note)
            answers.append((f"POST {base}", status))
        for base in bases.values():
            status, page = call(base, key, "GET", "/api/v1/entries?limit=5")
            answers.append((f"GET {base}", status))
            assert page["count"] >= 4, page
            status, _ = call(base, key, "GET", "/api/v1/search?q=note")
            answers.append((f"search {base}", status))
        return answers

    with ThreadPoolExecutor(8) as pool:
        answers = [a for each in pool.map(drive, range(WORKSPACES), sorted(keys)) for a in each]
    assert {status for _, status in answers} <= {200, 201}, [a for a in answers if a[1] not in (200, 201)]
    timings["API driven"] = time.monotonic() - began

    # The MCP endpoint on both web processes (it needs the ASGI lifespan the web unit keeps on).
    for base in bases.values():
        answer = mcp(base, keys[sorted(keys)[0]], "tools/list", {})
        assert "memory_search" in {tool["name"] for tool in answer["result"]["tools"]}, answer

    # Concurrent runs on one workspace, through both web processes at once: one is queued (202),
    # every other is refused (409, naming the queued run) and recorded skipped.
    barrier = threading.Barrier(6)

    def run_now(i: int) -> tuple[int, Any]:
        barrier.wait()
        base = bases["web-a" if i % 2 == 0 else "web-b"]
        return call(base, keys[BURST], "POST", "/api/v1/maintenance/run", {"dry_run": False})

    with ThreadPoolExecutor(6) as pool:
        burst = list(pool.map(run_now, range(6)))
    queued = [body for status, body in burst if status == 202]
    refused = [body for status, body in burst if status == 409]
    assert len(queued) == 1 and len(refused) == 5, burst
    assert queued[0]["status"] == "queued", queued
    assert {body["running_run_id"] for body in refused} == {queued[0]["run_id"]}, refused
    burst_rows = runs(workspace__slug=BURST, trigger="api")
    assert sorted(r.status for r in burst_rows) == ["queued"] + ["skipped"] * 5
    waiting = f"another run of this workspace waits in the queue (run {queued[0]['run_id']})"
    assert all(r.error == waiting for r in burst_rows if r.status == "skipped"), burst_rows
    timings["burst"] = time.monotonic() - began

    # A member's page of LIVE on web process A, as a browser keeps it open.
    watcher = Watcher(
        f"{bases['web-a'].replace('http', 'ws')}/ws/workspaces/{LIVE}/",
        bases["web-a"],
        seeded["session"],
    )
    try:
        # Two workers, each its own tree in its own place, and the dispatcher on their queue.
        for name in ("worker-a", "worker-b"):
            hosted.start(name, hosted.places[name], [sys.executable, "manage.py", "qcluster"])
        for name in ("worker-a", "worker-b"):
            wait_for(f"{name} to run", lambda name=name: "running." in hosted.log(name))
        hosted.start(
            "tick",
            hosted.places["worker-a"],
            [sys.executable, "tests/helpers_subprocess.py", "tick", "--every", str(TICK)],
        )
        timings["workers up"] = time.monotonic() - began

        # The burst's queued run is done by a worker; the API shows its end.
        wait_for(
            "a worker to do the burst's queued run",
            lambda: call(bases["web-b"], keys[BURST], "GET", queued[0]["url"])[1]["status"] == "succeeded",
        )

        # Round one: every workspace's full run is due, alone (it sweeps too), but the burst
        # workspace's: one finished a moment ago. Its sweep is made due at once (the run's start
        # aged past the 60 s interval, as round two ages others): one decay sweep.
        MaintenanceRun.objects.using(ALIAS).filter(workspace__slug=BURST, trigger="api").update(
            started_at=F("started_at") - timedelta(seconds=61)
        )
        expected = {(slug, "full"): 1 for slug in keys if slug != BURST}
        expected[BURST, "decay"] = 1
        settled(expected, "round one")
        timings["round one"] = time.monotonic() - began

        # LIVE's scheduled runs were made by a worker; web process A's websocket saw each start
        # and end, through Redis.
        for run in runs(workspace__slug=LIVE, trigger="schedule"):
            wait_for(
                f"web A's websocket to show run {run.pk} {run.status}",
                lambda run=run: watcher.saw(run.pk, run.status),
                timeout=10,
            )
        ran = [r for r in runs(workspace__slug=LIVE, trigger="schedule") if r.status != "skipped"]
        assert ran and all(watcher.saw(r.pk, "running") for r in ran), watcher.frames[-3:]

        # Round two: half the workspaces' last sweep (a full run's or a decay sweep's) a minute
        # older; each gets one more sweep, no full run (those count from their end).
        aged = sorted(keys)[::2]
        MaintenanceRun.objects.using(ALIAS).filter(workspace__slug__in=aged).update(
            started_at=F("started_at") - timedelta(seconds=61)
        )
        expected |= {(slug, "decay"): expected.get((slug, "decay"), 0) + 1 for slug in aged}
        settled(expected, "round two")
        timings["round two"] = time.monotonic() - began
    finally:
        watcher.close()

    failed = runs(status="failed")
    assert not failed, [(r.workspace.slug, r.kind, r.error) for r in failed]

    # Every tree stops on SIGTERM, nothing left behind.
    stopping = time.monotonic()
    with ThreadPoolExecutor(len(hosted.procs)) as pool:
        left = dict(
            zip(
                hosted.procs,
                pool.map(
                    lambda p: stop_tree(p, signal.SIGTERM, group=False, timeout=15), hosted.procs.values()
                ),
                strict=True,
            )
        )
    assert left == {name: [] for name in hosted.procs}, left
    assert all(p.returncode is not None for p in hosted.procs.values())
    timings["stopped"] = time.monotonic() - began
    assert time.monotonic() - stopping < 15
    for name in ("worker-a", "worker-b"):
        assert "has stopped" in hosted.log(name), hosted.log(name)[-2000:]
    for name in hosted.procs:
        assert "Traceback" not in hosted.log(name), f"{name}:\n{hosted.log(name)[-4000:]}"
    print("timings (s since start):", {k: round(v, 1) for k, v in timings.items()})


def happened(run: MaintenanceRun) -> bool:
    """Whether a scheduled run counts as the one of its interval, as the dispatcher counts
    them: a decay sweep once it started, whatever became of it (one refused because the
    workspace's full run held the lease left the decay passes to that run); a full run once it
    did its work (one refused by the lease is tried again at the next dispatch)."""
    return run.kind == "decay" or run.status != "skipped"


def settled(expected: dict[tuple[str, str], int], what: str) -> None:
    """Until every (workspace, kind) has had its ``expected`` number of scheduled runs
    (``happened``), none running, and then QUIET seconds more of dispatches changed nothing:
    never one more. Every run refused by the lease overlapped one that worked."""

    def counts() -> dict[tuple[str, str], int]:
        found: dict[tuple[str, str], int] = {}
        for run in runs(trigger="schedule"):
            if happened(run):
                found[run.workspace.slug, run.kind] = found.get((run.workspace.slug, run.kind), 0) + 1
        return found

    def done() -> bool:
        if runs(status="running"):
            return False
        found = counts()
        extra = {k: n for k, n in found.items() if n > expected.get(k, 0)}
        assert not extra, f"{what}: runs beyond the due ones: {extra}"
        return found == expected

    wait_for(f"{what}: the due runs", done, timeout=150)  # a busy machine runs them slowly
    time.sleep(QUIET)
    assert counts() == expected, f"{what}: a dispatch after the due runs started more"
    every = runs()
    # The scheduled runs (the burst's refusals, made by the API before any worker ran, named the
    # run waiting in the queue: checked where the burst is).
    for refused in (r for r in every if r.status == "skipped" and r.trigger == "schedule"):
        assert refused.error == "another run holds this workspace's lease", refused.error
        holders = [
            r
            for r in every
            if r.workspace_id == refused.workspace_id
            and r.status != "skipped"
            and r.started_at <= refused.finished_at
            # The two overlapped: a run gives its lease back once its end is announced, which
            # waits at most two seconds for the channel layer, after its row says it finished.
            and refused.started_at <= r.finished_at + timedelta(seconds=2.5)
        ]
        mine = [
            (r.pk, r.kind, r.trigger, r.status, r.started_at.time(), r.finished_at and r.finished_at.time())
            for r in every
            if r.workspace_id == refused.workspace_id
        ]
        assert holders, f"{what}: run {refused.pk} was refused while no run of its workspace worked: {mine}"
