"""Serve the whole product from one command: the ASGI app (site, API, websockets) under
uvicorn, plus the django-q2 cluster (the scheduler and its workers) as a child process."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser


def _die_with_parent() -> None:
    """Linux: the cluster gets SIGTERM when this server process dies, however it dies."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class Command(BaseCommand):
    help = "Serve site, API and websockets with uvicorn, and run the django-q2 cluster beside it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=settings.PORT)
        parser.add_argument("--no-scheduler", action="store_true", help="Do not start the q2 cluster.")

    def handle(self, *args: object, **options: object) -> None:
        cluster = None
        if not options["no_scheduler"]:
            cluster = subprocess.Popen(
                [sys.executable, "manage.py", "qcluster"], cwd=settings.BASE_DIR, preexec_fn=_die_with_parent
            )
        host, port = str(options["host"]), int(str(options["port"]))
        self.stdout.write(f"Memory Steward on http://{host}:{port}/console/ (API docs: /api/v1/docs)")
        try:
            uvicorn.run("config.asgi:application", host=host, port=port, lifespan="off", log_level="info")
        finally:
            # The cluster must not outlive the server: it would keep running maintenance unseen.
            if cluster is not None and cluster.poll() is None:
                cluster.terminate()
                try:
                    cluster.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    cluster.kill()
