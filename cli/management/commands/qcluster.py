"""``manage.py qcluster``: django-q2's cluster, stopping on SIGTERM and SIGINT within
STOP_SECONDS with no process left behind. It replaces django-q2's own command of the
same name (``maintenance`` comes before ``django_q`` in INSTALLED_APPS for that).

Invariants: only this process decides how the cluster stops (the sentinel and everything it
forks ignore SIGTERM and SIGINT); workers get GRACE_SECONDS to finish the task in hand, then
SIGTERM (a maintenance run is abandoned and its row marked ``failed``); at STOP_SECONDS
whatever is left is killed and logged. Why django-q2's command is not enough: docs/maintenance.md
("Stopping a worker").
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from multiprocessing import Event
from typing import Any

from django.conf import settings
from django_q.cluster import Cluster, Sentinel, get_mp_context
from django_q.management.commands.qcluster import Command as QClusterCommand

from config.processes import become_subreaper, descendants, kill_descendants, signal_all

log = logging.getLogger(__name__)

GRACE_SECONDS = 4.0  # the workers may finish the task in hand
STOP_SECONDS = 8.0  # then whatever is left of the cluster is killed


class _Sentinel(Sentinel):
    def start(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by every process it forks
        super().start()


class _Cluster(Cluster):
    """django-q2's Cluster with our sentinel, and a start that a stop request interrupts."""

    def __init__(self, stop_requested: list[int]):
        super().__init__()
        self.stop_requested = stop_requested  # the signals received; a plain list, see handle

    def start(self) -> int:
        self.stop_event = Event()
        self.start_event = Event()
        self.sentinel = get_mp_context().Process(
            target=_Sentinel,
            name=f"Process-{uuid.uuid4().hex}",
            args=(self.stop_event, self.start_event, self.cluster_id, self.broker, self.timeout),
        )
        self.sentinel.start()
        log.info("Q Cluster %s starting.", self.name)
        while not self.start_event.is_set() and not self.stop_requested:
            if not self.sentinel.is_alive():
                exitcode = self.sentinel.exitcode
                raise RuntimeError(f"Q Cluster {self.name} failed to start: sentinel exit code {exitcode}")
            time.sleep(0.1)
        return self.pid

    def stop_within_deadline(self) -> None:
        """Set the stop event from a thread of its own (a ``set()`` that hangs cannot stop the
        rest), let the workers finish within GRACE_SECONDS, then SIGTERM every process of the
        cluster (a worker in a maintenance run abandons it, ``maintenance.tasks``; the others
        ignore it) and kill what is left at STOP_SECONDS."""
        began = time.monotonic()
        if self.sentinel is not None and self.sentinel.is_alive():
            log.info("Q Cluster %s stopping.", self.name)
            threading.Thread(target=self.stop_event.set, daemon=True).start()
            self.sentinel.join(GRACE_SECONDS)
        busy = descendants(os.getpid())
        if busy:
            log.info("Q Cluster %s: work in hand after %.0f s; SIGTERM to %s", self.name, GRACE_SECONDS, busy)
            signal_all(busy, signal.SIGTERM)
            while descendants(os.getpid()) and time.monotonic() - began < STOP_SECONDS:
                time.sleep(0.1)
        left = kill_descendants(os.getpid())
        if left:
            log.warning("Q Cluster %s: killed %s, still running after %.0f s", self.name, left, STOP_SECONDS)
        if self.sentinel is not None:
            self.sentinel.join(1)  # reap it
        log.info("Q Cluster %s has stopped.", self.name)


class Command(QClusterCommand):
    help = "Start the django-q2 cluster; it stops on SIGTERM or SIGINT within seconds, leaving no process."

    def handle(self, *args: Any, **options: Any) -> None:
        settings.SECRET_KEY  # noqa: B018 -- as django-q2's command: tasks are signed with it
        if options.get("cluster_name"):
            os.environ["Q_CLUSTER_NAME"] = options["cluster_name"]
        # The handler only records the signal: taking a lock there (threading.Event.set) could
        # deadlock with the main thread holding it when the signal lands.
        stop_requested: list[int] = []
        become_subreaper()  # a worker orphaned by a dead sentinel is still ours to stop
        cluster = _Cluster(stop_requested)  # installs django-q2's handlers: replaced next
        signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.append(signum))
        signal.signal(signal.SIGINT, lambda signum, frame: stop_requested.append(signum))
        try:
            cluster.start()
            if options.get("run_once"):
                stop_requested.append(0)
            while not stop_requested and cluster.sentinel.is_alive():
                time.sleep(0.2)
        finally:
            cluster.stop_within_deadline()
