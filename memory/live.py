"""Live updates of the console pages: what is announced, when, and how it reaches the browser.

**What.** Ready-rendered HTML fragments whose top-level element carries an id; htmx's websocket
extension (``hx-ws`` from django-htmx, connected by ``base.html`` on every workspace page)
swaps each one out of band, replacing the element of the same id. The publisher renders the
very partial the pages include, so a page shows the same thing before and after an update:

- ``console/partials/live_runs.html`` — ``<section id="live-runs">``, the last runs
  (``announce_runs``);
- ``console/partials/live_queue.html`` — ``<span id="live-queue">``, the open review counts
  (``announce_queue``).

Fragments go to every member of the workspace whatever their role, so they carry links and
no action buttons (actions stay on the pages, where the server checks the role).

**When.** ``run_started``/``run_finished`` are called by ``maintenance.runs`` when a run is
recorded and when it ends (in whatever process runs it: web, django-q2 worker, command line);
console views call ``announce_queue`` (and ``announce_runs``) after review actions. Rendering
and sending happen after the transaction commits (``transaction.on_commit``): a rolled-back
write announces nothing, and a fragment shows committed state. An announcement never breaks
or slows the work that makes it: errors are logged and dropped, a send waits at most two
seconds, rendering is one query.

**How** (``memory.events``):

- *Hosted* (``REDIS_URL``: channels-redis): the fragment is sent to the workspace's group on
  the shared layer; every web process on every machine forwards it to its websockets.
- *Embedded* (no Redis: ``InMemoryChannelLayer``, which reaches only its own process): the
  fragment is sent to the local group — pages served by the same process get it at once — and
  written to the outbox table ``LiveMessage`` with the writing process's id. Every web process
  runs one relay task (started by the first websocket that connects, stopped a minute after
  the last one closed) that polls the outbox every 0.5 s with one indexed query, forwards the
  rows of *other* processes (a django-q2 worker, ``manage.py maintain``) to its local group,
  and deletes rows older than five minutes. So a run in the worker process reaches an open
  dashboard within about half a second, with no service beyond the database. The consumer
  itself never touches the database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.template.loader import render_to_string
from django.utils import timezone

from memory.events import deliver

if TYPE_CHECKING:
    from django.http import HttpRequest

    from maintenance.models import MaintenanceRun
    from memory.models import Workspace

log = logging.getLogger(__name__)

RUNS_SHOWN = 10
RECENT_CHANGES = timedelta(days=7)  # "recent automatic changes" of the queue count
RUNS_TEMPLATE = "console/partials/live_runs.html"
QUEUE_TEMPLATE = "console/partials/live_queue.html"


# --- what the pages include ------------------------------------------------------------------------


def recent_runs(workspace: Workspace | int, limit: int = RUNS_SHOWN) -> list[MaintenanceRun]:
    """The last runs of a workspace, newest first, with their workspace: one query."""
    from maintenance.models import MaintenanceRun

    workspace_id = workspace if isinstance(workspace, int) else workspace.pk
    return list(
        MaintenanceRun.objects.filter(workspace_id=workspace_id)
        .select_related("workspace")
        .defer("affected", "params", "result", "error")
        .order_by("-started_at", "-pk")[:limit]
    )


def runs_context(workspace: Workspace) -> dict[str, Any]:
    """The context of ``live_runs.html`` (``runs``, ``workspace``) for a page that includes it."""
    return {"runs": recent_runs(workspace), "workspace": workspace}


def _count(rows: QuerySet[Any]) -> Coalesce:
    """The number of ``rows`` of the outer workspace, as a subquery."""
    counted = rows.filter(workspace_id=OuterRef("pk")).order_by().values("workspace_id")
    return Coalesce(Subquery(counted.annotate(n=Count("pk")).values("n")[:1]), 0)


def queue_counts(workspace: Workspace | int) -> dict[str, int]:
    """Open review work, in one query: open disputes, open tombstones (neither restored nor
    purged), and automatic archivals and tombstones of the last ``RECENT_CHANGES`` not
    reverted. (Hygiene candidates are left out: finding them scans every entry.)"""
    from maintenance.models import Dispute, DisputeStatus
    from memory.models import LifecycleEvent, Status, Tombstone
    from memory.models import Workspace as WorkspaceModel

    workspace_id = workspace if isinstance(workspace, int) else workspace.pk
    found = (
        WorkspaceModel.objects.filter(pk=workspace_id)
        .annotate(
            q_disputes=_count(Dispute.objects.filter(status=DisputeStatus.OPEN)),
            q_tombstones=_count(Tombstone.objects.filter(restored_at__isnull=True, purged_at__isnull=True)),
            q_automatic=_count(
                LifecycleEvent.objects.filter(
                    automatic=True,
                    reverted_at__isnull=True,
                    entry__isnull=False,
                    to_status__in=[Status.ARCHIVED, Status.TOMBSTONED, Status.STALE],
                    created_at__gte=timezone.now() - RECENT_CHANGES,
                )
            ),
        )
        .values("q_disputes", "q_tombstones", "q_automatic")
        .first()
    ) or {}
    return {name: found.get(f"q_{name}", 0) for name in ("disputes", "tombstones", "automatic")}


def queue_context(workspace: Workspace) -> dict[str, Any]:
    """The context of ``live_queue.html`` (``queue``, ``workspace``)."""
    return {"queue": queue_counts(workspace), "workspace": workspace}


def context(request: HttpRequest) -> dict[str, Any]:
    """Template context processor: ``live_queue``, the review counts of the workspace page
    being rendered (``request.console``, set by ``memory.console.workspace_page``), computed
    only if a template uses it (a callable: Django's templates call it on first use)."""
    console = getattr(request, "console", None)
    if console is None:
        return {}
    workspace = console.workspace
    return {"live_queue": lambda: queue_counts(workspace)}


def render_runs(workspace_id: int) -> str:
    runs = recent_runs(workspace_id)
    if runs:
        workspace = runs[0].workspace
    else:
        from memory.models import Workspace

        workspace = Workspace.objects.get(pk=workspace_id)
    return render_to_string(RUNS_TEMPLATE, {"runs": runs, "workspace": workspace})


def render_queue(workspace_id: int) -> str:
    from memory.models import Workspace

    workspace = Workspace.objects.get(pk=workspace_id)
    return render_to_string(QUEUE_TEMPLATE, queue_context(workspace))


# --- announcing -----------------------------------------------------------------------------------


def _announce(workspace_id: int, *renderers: Callable[[int], str]) -> None:
    """After commit: render the fragments and send them as one message. Never raises."""

    def send() -> None:
        try:
            html = "\n".join(render(workspace_id) for render in renderers)
        except Exception:
            log.exception("live update of workspace %s not rendered", workspace_id)
            return
        deliver(workspace_id, html)

    try:
        transaction.on_commit(send, robust=True)
    except Exception:
        log.exception("live update of workspace %s not scheduled", workspace_id)


def announce_runs(workspace_id: int) -> None:
    """Open pages of the workspace show the current last runs (after commit)."""
    _announce(workspace_id, render_runs)


def announce_queue(workspace_id: int) -> None:
    """Open pages of the workspace show the current review counts (after commit)."""
    _announce(workspace_id, render_queue)


def run_started(run: MaintenanceRun) -> None:
    """A run was recorded (status running)."""
    _announce(run.workspace_id, render_runs)


def run_finished(run: MaintenanceRun) -> None:
    """A run ended (any status): its row changes, and the queue may have too."""
    if run.dry_run or run.status != "succeeded":
        _announce(run.workspace_id, render_runs)
    else:
        _announce(run.workspace_id, render_runs, render_queue)
