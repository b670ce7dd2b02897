"""Serve the whole product from one command: the ASGI app (site, API, websockets) under
uvicorn, plus the django-q2 cluster (the scheduler and its workers) as a child process.

It stops on SIGTERM and SIGINT within STOP_SECONDS with no process left. uvicorn
shuts down gracefully on either, then raises the signal again at its own process so that the
process dies of it: the ``finally`` of a plain ``uvicorn.run`` never ran, and the cluster was
left to its death signal. Here the signal is forwarded to the cluster the moment uvicorn
receives it (both shut down at once: ``qcluster`` stops within its own 8 s), uvicorn's re-raise
lands in this command's handler, and the command waits for the cluster, kills whatever is
left of it, and only then dies of the signal it was sent.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from types import FrameType

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from config.processes import become_subreaper, kill_descendants

STOP_SECONDS = 9  # the cluster's own stop takes at most 8 s (maintenance qcluster)
GRACEFUL_SHUTDOWN_SECONDS = 5  # requests and websockets still open are closed after this


def _die_with_parent() -> None:
    """Linux: the cluster gets SIGTERM when this server process dies, however it dies."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class _Server(uvicorn.Server):
    """uvicorn's server, passing the stop signal on to the cluster as soon as it arrives."""

    def __init__(self, config: uvicorn.Config, cluster: subprocess.Popen[bytes] | None):
        super().__init__(config)
        self.cluster = cluster

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.cluster is not None and self.cluster.poll() is None:
            self.cluster.send_signal(signal.SIGTERM)
        super().handle_exit(sig, frame)


class Command(BaseCommand):
    help = "Serve site, API and websockets with uvicorn, and run the django-q2 cluster beside it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=settings.PORT)
        parser.add_argument("--no-scheduler", action="store_true", help="Do not start the q2 cluster.")

    def handle(self, *args: object, **options: object) -> None:
        received: list[int] = []

        def remember(signum: int, frame: FrameType | None) -> None:
            received.append(signum)

        # uvicorn puts back the handlers it found, then raises the signal it served: it lands
        # here instead of killing the process before the cluster is stopped.
        signal.signal(signal.SIGTERM, remember)
        signal.signal(signal.SIGINT, remember)
        become_subreaper()  # the cluster's processes stay ours to find even if it dies first
        cluster = None
        if not options["no_scheduler"]:
            cluster = subprocess.Popen(
                [sys.executable, "manage.py", "qcluster"], cwd=settings.BASE_DIR, preexec_fn=_die_with_parent
            )
        host, port = str(options["host"]), int(str(options["port"]))
        self.stdout.write(f"Memory Steward on http://{host}:{port}/console/ (API docs: /api/v1/docs)")
        config = uvicorn.Config(
            "config.asgi:application",
            host=host,
            port=port,
            lifespan="on",  # the MCP endpoint's session manager runs inside it (config.asgi)
            log_level="info",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        )
        try:
            _Server(config, cluster).run()
        finally:
            # The cluster must not outlive the server: it would keep running maintenance unseen.
            if cluster is not None:
                self._stop_cluster(cluster)
        if received:  # die of the signal, as a service manager expects
            signal.signal(received[0], signal.SIG_DFL)
            os.kill(os.getpid(), received[0])

    def _stop_cluster(self, cluster: subprocess.Popen[bytes]) -> None:
        if cluster.poll() is None:
            cluster.send_signal(signal.SIGTERM)  # again, harmless: qcluster stops once
            try:
                cluster.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                cluster.kill()
                cluster.wait()
        kill_descendants(os.getpid())  # nothing of it may be left, even if it died first
