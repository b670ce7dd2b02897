"""Live updates of the console pages: what is announced, when, and how it reaches the browser.

Ready-rendered HTML fragments (the very partials the pages include), swapped by id by htmx's
websocket extension. Fragments go to every member whatever their role, so they carry links and
no action buttons. Everything is rendered and sent after commit (a rolled-back write announces
nothing), and an announcement never breaks or slows the work that makes it. Transport is
``memory.events`` (channels-redis when hosted, else the local layer plus the ``LiveMessage``
outbox). The fragments and who announces what are in docs/console.md ("Live updates").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.template.loader import render_to_string
from django.utils import timezone

from console.selectors import next_runs
from console.selectors_maintenance import open_review
from maintenance.models import MaintenanceRun, ProposalAction
from memory.capped import capped_counts
from memory.events import deliver, deliver_aside
from memory.models import Workspace
from memory.models.choices import Status
from memory.selectors import status_counts

if TYPE_CHECKING:
    from django.http import HttpRequest

    from maintenance.models import MaintenanceRun
log = logging.getLogger(__name__)

RUNS_SHOWN = 10
RUNS_TEMPLATE = "console/partials/live_runs.html"
QUEUE_TEMPLATE = "console/partials/live_queue.html"
PROGRESS_TEMPLATE = "console/partials/run_progress.html"
STATUS_TEMPLATE = "console/dashboard.html#status-counts"
SCHEDULE_TEMPLATE = "console/dashboard.html#next-run"


# --- what the pages include ------------------------------------------------------------------------


def recent_runs(workspace: Workspace | int, limit: int = RUNS_SHOWN) -> list[MaintenanceRun]:
    """The last runs of a workspace, newest first, with their workspace: one query."""
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


QUEUE_KEYS = ("proposals", "proposed_archive", "proposed_tombstone", "automatic", "tombstones", "disputes")


def queue_counts(workspace: Workspace | int) -> dict[str, int]:
    """Open review work, in one statement, counted by the very selectors the review tabs list:
    open proposals (and of them archives and tombstones), automatic changes a revert would
    still undo (``automatic_changes``), open tombstones and open disputes — each capped at
    ``memory.capped.CAP`` + 1 (pages show "1,000+"), so the header costs the same at a million
    entries as at a thousand. (Hygiene candidates are left out: finding them scores entries.)"""
    ws: Any = workspace if not isinstance(workspace, int) else Workspace(pk=workspace)
    lists = open_review(ws)
    proposed = lists["pending"]
    return capped_counts(
        {
            "proposals": proposed,
            "proposed_archive": proposed.filter(action=ProposalAction.ARCHIVE),
            "proposed_tombstone": proposed.filter(action=ProposalAction.TOMBSTONE),
            "automatic": lists["automatic"],
            "tombstones": lists["tombstones"],
            "disputes": lists["disputes"],
        }
    )


def queue_context(workspace: Workspace) -> dict[str, Any]:
    """The context of ``live_queue.html`` (``queue``, ``workspace``)."""
    return {"queue": queue_counts(workspace), "workspace": workspace}


def context(request: HttpRequest) -> dict[str, Any]:
    """Template context processor: ``live_queue``, the review counts of the workspace page
    being rendered (``request.console``, set by ``console.access.workspace_page``), computed
    only if a template uses it (a callable: Django's templates call it on first use)."""
    console = getattr(request, "console", None)
    if console is None:
        return {}
    workspace = console.workspace
    found: dict[str, int] = {}

    def counts() -> dict[str, int]:  # the header and the dashboard share one query
        if not found:
            found.update(queue_counts(workspace))
        return found

    return {"live_queue": counts}


def render_runs(workspace_id: int) -> str:
    runs = recent_runs(workspace_id)
    workspace = runs[0].workspace if runs else Workspace.objects.get(pk=workspace_id)
    return render_to_string(RUNS_TEMPLATE, {"runs": runs, "workspace": workspace})


def status_context(workspace: Workspace) -> dict[str, Any]:
    """The context of the dashboard's "Entries by status" (``STATUS_TEMPLATE``): ``counts``
    (status, n) in status order, ``total`` and ``workspace``. One query."""
    counts = status_counts(workspace)
    return {
        "workspace": workspace,
        "counts": [(status, counts.get(status, 0)) for status in Status.values],
        "total": sum(counts.values()),
    }


def render_status_counts(workspace_id: int) -> str:
    workspace = Workspace.objects.get(pk=workspace_id)
    return render_to_string(STATUS_TEMPLATE, {**status_context(workspace), "oob": True})


def render_schedule(workspace_id: int) -> str:
    """The dashboard's "Next scheduled run": a run's start or end moves the next full run and
    the next sweep."""
    workspace = Workspace.objects.get(pk=workspace_id)
    return render_to_string(
        SCHEDULE_TEMPLATE, {"schedule": next_runs(workspace, now=timezone.now()), "oob": True}
    )


def render_queue(workspace_id: int) -> str:
    workspace = Workspace.objects.get(pk=workspace_id)
    return render_to_string(QUEUE_TEMPLATE, {**queue_context(workspace), "pushed": True})


# --- announcing -----------------------------------------------------------------------------------


# Inside ``coalesced()``: the announcements waiting for its end, per workspace (renderers in
# order, each once).
_pending: ContextVar[dict[int, list[Callable[[int], str]]] | None] = ContextVar("live_pending", default=None)


@contextmanager
def coalesced() -> Iterator[None]:
    """Announce once, at the end, what a long operation would announce after each of its
    batches. A whole-run revert commits many batches, and rendering the queue counts reads the
    whole workspace: per batch, that was most of the revert's time (bench/reports/maintenance.md,
    section "Faster backup, restore and revert", the revert). The fragments are
    rendered from committed state at the end — after the last commit, or on failure what the
    committed batches left — so a batch rolled back inside may still be announced: pages then
    show what is, once. Nested blocks announce at the outermost one's end."""
    if _pending.get() is not None:
        yield
        return
    token = _pending.set({})
    try:
        yield
    finally:
        waiting = _pending.get() or {}
        _pending.reset(token)
        for workspace_id, renderers in waiting.items():
            _announce(workspace_id, *renderers)


def _announce(workspace_id: int, *renderers: Callable[[int], str]) -> None:
    """After commit: render the fragments and send them as one message. Never raises."""
    waiting = _pending.get()
    if waiting is not None:
        listed = waiting.setdefault(workspace_id, [])
        listed.extend(r for r in renderers if r not in listed)
        return

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


def on_entries_changed(sender: Any, *, workspace_id: int, **changed: Any) -> None:
    """The receiver of ``memory.signals.entries_changed`` (connected by ``MemoryConfig.ready``):
    entries of the workspace changed status, its open pages show the review counts as they are
    now (the tombstones, the automatic changes a revert would undo, ...)."""
    announce_queue(workspace_id)


def on_run_changed(
    sender: Any, *, run: MaintenanceRun, stage: str, cursor: Any = None, **kwargs: Any
) -> None:
    """The receiver of ``maintenance.signals.run_changed`` (connected by ``ConsoleConfig.ready``).
    Progress told through a cursor of its own (a plan's long transaction) is delivered through
    it at once; the rest after commit."""
    if cursor is not None:
        deliver_aside(run.workspace_id, progress_renderer(run)(run.workspace_id), cursor)
    elif stage == "started":
        run_started(run)
    elif stage == "progress":
        run_progress(run)
    else:
        run_finished(run)


def progress_renderer(run: MaintenanceRun) -> Callable[[int], str]:
    """The run's progress fragment, rendered from the row in hand (no query) at send time."""
    state = {
        "run": {
            "pk": run.pk,
            "status": run.status,
            "dry_run": run.dry_run,
            "started_at": run.started_at,
            "finished_at": run.finished_at,
        },
        "progress": dict(run.progress) if isinstance(run.progress, dict) else {},
        "pushed": True,
    }
    return lambda workspace_id: render_to_string(PROGRESS_TEMPLATE, state)


def run_started(run: MaintenanceRun) -> None:
    """A run was recorded (queued or running) or a queued one started."""
    _announce(run.workspace_id, render_runs, render_schedule, progress_renderer(run))


def run_progress(run: MaintenanceRun) -> None:
    """A run began its next pass (``maintenance.runs.Progress``): its page shows where it is."""
    _announce(run.workspace_id, progress_renderer(run))


def run_finished(run: MaintenanceRun) -> None:
    """A run ended (any status): its row changes, and the queue and the entries by status may
    have too."""
    if run.dry_run or run.status not in ("succeeded", "proposed"):
        _announce(run.workspace_id, render_runs, render_schedule, progress_renderer(run))
    else:
        _announce(
            run.workspace_id,
            render_runs,
            render_schedule,
            render_queue,
            render_status_counts,
            progress_renderer(run),
        )
