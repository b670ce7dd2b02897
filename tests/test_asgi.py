"""config.asgi.SyncStackASGIHandler: a request's synchronous work runs on one thread, reused
by later requests, and a slow request does not hold up another (each has a thread to itself).

Driven in-process through the ASGI callable (the real server is tests/test_serve.py). Paths
that do not exist answer 404 through the whole middleware chain without touching a database.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from django.core import signals
from django.db import connection, connections

from config.asgi import SyncStackASGIHandler, django_asgi_app


def _scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }


async def _get(path: str) -> int:
    """One request through the handler; its status."""
    sent: list[dict[str, Any]] = []
    delivered = asyncio.Event()
    body = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if body:
            return body.pop()
        await delivered.wait()  # then the client hangs up, as a server reports it
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            delivered.set()

    await django_asgi_app(_scope(path), receive, send)
    return int(sent[0]["status"])


def _run(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """asyncio.run in a thread of its own (a browser test may have left a loop running here)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(asyncio.run(main())))
    thread.start()
    thread.join(30)
    assert out, "the requests did not finish"
    return out[0]


def test_the_handler_serves_the_project():
    assert isinstance(django_asgi_app, SyncStackASGIHandler)


def test_a_request_runs_on_one_thread_and_later_requests_reuse_it():
    seen: list[tuple[str, str, int]] = []

    def started(sender: Any, scope: dict[str, Any], **kwargs: Any) -> None:
        seen.append((scope["path"], "started", threading.get_ident()))

    def finished(sender: Any, **kwargs: Any) -> None:
        seen.append(("", "finished", threading.get_ident()))

    async def main() -> tuple[list[int], int]:
        loop_thread = threading.get_ident()
        return [await _get(f"/no-such-page-{i}") for i in range(3)], loop_thread

    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    try:
        statuses, loop_thread = _run(main)
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)
    assert statuses == [404, 404, 404]
    assert [event for _, event, _ in seen] == ["started", "finished"] * 3
    threads = {ident for _, _, ident in seen}
    # request_finished (which hands the database connection back) ran on the thread that
    # served the request, and the next requests reused that thread instead of starting one.
    assert len(threads) == 1
    assert loop_thread not in threads


def test_a_slow_request_does_not_hold_up_another():
    release = threading.Event()
    fast_done = threading.Event()

    holding: list[int] = []

    def started(sender: Any, scope: dict[str, Any], **kwargs: Any) -> None:
        if scope["path"] == "/slow-request":
            holding.append(threading.get_ident())
            release.wait(10)

    async def main() -> tuple[int, int, bool]:
        slow = asyncio.ensure_future(_get("/slow-request"))
        for _ in range(500):  # until the slow request holds its thread
            if holding:
                break
            await asyncio.sleep(0.01)
        fast = await _get("/fast-request")
        fast_done.set()
        overtaken = not slow.done()
        release.set()
        return await slow, fast, overtaken

    signals.request_started.connect(started)
    try:
        slow_status, fast_status, overtaken = _run(main)
    finally:
        release.set()
        signals.request_started.disconnect(started)
    assert (slow_status, fast_status) == (404, 404)
    assert fast_done.is_set()
    assert overtaken  # the fast request finished while the slow one was still held


def test_a_cancelled_request_does_not_hand_its_busy_thread_to_the_next():
    release = threading.Event()
    held: list[int] = []
    after: list[int] = []

    def started(sender: Any, scope: dict[str, Any], **kwargs: Any) -> None:
        if scope["path"] == "/held-request":
            held.append(threading.get_ident())
            release.wait(10)
        elif scope["path"] == "/after-request":
            after.append(threading.get_ident())

    async def main() -> int:
        task = asyncio.ensure_future(_get("/held-request"))
        for _ in range(500):  # until its thread is busy in request_started
            if held:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        status = await _get("/after-request")
        release.set()
        return status

    signals.request_started.connect(started)
    try:
        status = _run(main)
    finally:
        release.set()
        signals.request_started.disconnect(started)
    assert status == 404
    assert held and after
    assert after[0] != held[0]  # the next request got a thread of its own, not the busy one


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the pool is PostgreSQL's; an in-memory SQLite ignores close"
)
@pytest.mark.django_db(transaction=True)  # the request's thread uses the database
def test_a_request_whose_work_raises_hands_its_thread_s_database_connection_back():
    """A request whose synchronous work raises never sends request_finished, which hands its
    thread's connection back to the pool; the handler does not keep that thread, and before
    it ends the thread closes its connections: no pool slot stays taken."""
    seen: list[tuple[Any, threading.Thread]] = []

    def started(sender: Any, scope: dict[str, Any], **kwargs: Any) -> None:
        if scope["path"] == "/failing-request":
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT 1")
            seen.append((connections["default"], threading.current_thread()))
            raise RuntimeError("a receiver of request_started failed")

    async def main() -> None:
        with contextlib.suppress(RuntimeError):
            await _get("/failing-request")

    signals.request_started.connect(started)
    try:
        _run(main)
    finally:
        signals.request_started.disconnect(started)
    ((wrapper, thread),) = seen
    thread.join(10)
    assert not thread.is_alive()
    assert wrapper.connection is None  # closed on its thread: back in the pool
