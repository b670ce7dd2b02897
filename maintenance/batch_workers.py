"""A pass's batches written over several database connections at once (PostgreSQL).

A first run over a large workspace changes most of its entries, in batches of
``pass_tools.BATCH_SIZE``, each one transaction: its ids locked and read again through the
pass's whole predicate, the status UPDATE, the LifecycleEvents (and Tombstones). The batches of
one pass are independent of each other — disjoint ids, each its own transaction — and nearly
all of their time is the database server's. One connection keeps one server process busy; the
server has more cores. ``each_batch`` hands the batches to ``WORKERS`` threads, each with its
own connection, and yields their results to the caller's thread, which renews the run's lease
between them (``RunContext.heartbeat``) as it does between sequential batches.

Every guarantee of a batch holds as before, because every batch is still one transaction of
its own: a kill (or a stop: the caller's thread takes the signal, tells the workers to take no
further batch, cancels their statements in flight and waits for them) leaves no half-applied
batch; a lease lost or a failed batch stops the pass the same way. What differs is only their
order of commit, which nothing reads: a pass's ids are sorted at its end. The threads'
connections are closed (handed back to the pool) when the pass is over.

Sequential (in the caller's thread and connection) on SQLite (one writer at a time), inside a
caller's transaction (a worker could not see its uncommitted rows, nor be rolled back with
it), and for a single batch.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection, connections

T = TypeVar("T")
log = logging.getLogger(__name__)

# Connections writing one pass's batches at once; the setting MAINTENANCE_BATCH_WORKERS
# overrides it (1: sequential).
WORKERS = 2
# How long the caller's thread waits for a result before it renews the lease anyway (seconds).
WAIT = 1.0


def workers() -> int:
    return max(1, int(getattr(settings, "MAINTENANCE_BATCH_WORKERS", WORKERS)))


def concurrent(batches: int) -> bool:
    """Whether ``batches`` batches go to worker threads: PostgreSQL, outside a transaction,
    more than one batch and more than one worker."""
    return (
        batches > 1 and workers() > 1 and connection.vendor == "postgresql" and not connection.in_atomic_block
    )


def each_batch(
    batches: Sequence[Sequence[int]],
    work: Callable[[Sequence[int]], T | None],
    heartbeat: Callable[[], None],
    *,
    alone_until: Callable[[Sequence[int]], T | None] | None = None,
) -> Iterator[T]:
    """``work(batch)`` for every batch — one transaction each, opened by ``work`` — and the
    results that are not None, in the order they are done. ``heartbeat`` after each batch, in
    the caller's thread (it may raise: no further batch is started, and the ones in hand are
    waited for). ``alone_until``: the work of the first batches instead, one at a time in the
    caller's thread until one of them returns a result (a destructive pass's first change waits
    for the pre-prune backup, which must not race a batch)."""
    first = 0
    if alone_until is not None:
        for batch in batches:
            first += 1
            result = alone_until(batch)
            heartbeat()
            if result is not None:
                yield result
                break
    batches = batches[first:]
    if not concurrent(len(batches)):
        for batch in batches:
            result = work(batch)
            heartbeat()
            if result is not None:
                yield result
        return
    pending = iter(batches)
    take = threading.Lock()
    stop = threading.Event()
    # What the workers hand back: ("done", result), ("failed", exception), ("left", None).
    done: queue.Queue[tuple[str, Any]] = queue.Queue()
    # Each worker's driver connection, for the caller's thread to cancel a statement in flight.
    sessions: dict[int, Any] = {}

    def drain() -> None:
        try:
            while not stop.is_set():
                with take:
                    batch = next(pending, None)
                if batch is None:
                    return
                connection.ensure_connection()
                sessions[threading.get_ident()] = connection.connection
                done.put(("done", work(batch)))
        except BaseException as exc:  # handed to the caller's thread, which raises it
            stop.set()
            done.put(("failed", exc))
        finally:
            sessions.pop(threading.get_ident(), None)
            try:
                connections.close_all()
            except Exception:  # a broken session: the pool discards it
                log.warning("a batch worker's connection could not be closed", exc_info=True)
            done.put(("left", None))

    threads: list[threading.Thread] = []
    finished = False
    try:
        for n in range(min(workers(), len(batches))):
            thread = threading.Thread(
                target=contextvars.copy_context().run, args=(drain,), name=f"batch-worker-{n}", daemon=True
            )
            thread.start()
            threads.append(thread)
        running = len(threads)
        while running:
            try:
                what, value = done.get(timeout=WAIT)
            except queue.Empty:
                heartbeat()
                continue
            if what == "failed":
                raise value
            if what == "left":
                running -= 1
                continue
            heartbeat()
            if value is not None:
                yield value
        finished = True
    finally:
        stop.set()
        if not finished:
            # Stopped (a signal, a lost lease, a failed batch): the statements in flight are
            # cancelled, so their batches roll back at once instead of running on unwatched.
            for session in list(sessions.values()):
                with contextlib.suppress(Exception):  # the session ended meanwhile
                    session.cancel()
        for thread in threads:
            thread.join()
