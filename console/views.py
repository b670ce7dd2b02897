"""Console pages: the workspaces home, a workspace's dashboard, its entries and one
entry. Views are thin: access is checked by ``console.access`` (viewers see, operators act; a
partial or an htmx request goes through the same check), reads come from
``console.selectors`` and every write goes through a service.

The same URL renders the whole page or, for an htmx request, only the partial that changed;
every action is also a plain form POST answered with a 303 redirect, so the pages work
without JavaScript.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers

from console import charts, live
from console import selectors as console_selectors
from console.access import Console, operator_action, workspace_page
from maintenance.models import MaintenanceRun, RunKind, RunTrigger
from maintenance.run_start import run_maintenance, runs_inline
from maintenance.selectors import run_get
from maintenance.tasks import submit_run
from memory import entry_changes
from memory.errors import NotFound, ServiceError, Unavailable
from memory.models.choices import ID_MAX, LISTED_STATUSES, EntryType, Status, Tier, TombstoneReason
from memory.selectors import ENTRY_SORTS, workspace_summaries


class SeeOther(HttpResponseRedirect):
    """303: after a POST the browser GETs the page again (no resubmission on reload)."""

    status_code = 303


def _partial_or_page(
    request: HttpRequest, template: str, partial: str, context: dict[str, Any]
) -> HttpResponse:
    name = f"{template}#{partial}" if request.htmx else template  # type: ignore[attr-defined]
    response = render(request, name, context)
    patch_vary_headers(response, ["HX-Request"])  # one URL, two bodies: caches must tell them apart
    return response


def _known_id(pk: int) -> int:
    # Ids beyond 64 bits exist in neither database (SQLite would even raise on them).
    if not 0 < pk <= ID_MAX:
        raise Http404("no such id")
    return pk


# --- home and dashboard -----------------------------------------------------------------------


@login_required
def console_home(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "memory/console_home.html",
        {"summaries": workspace_summaries(request.user), "statuses": Status.values},
    )


def _dashboard_context(console: Console, result: MaintenanceRun | None) -> dict[str, Any]:
    workspace = console.workspace
    unit, growth = console_selectors.growth(workspace)
    histogram = console_selectors.importance_histogram(workspace)
    return {
        "console": console,
        # "Entries by status": the same rows, through the same function, as a run's end pushes.
        **live.status_context(workspace),
        "growth_chart": charts.responsive(
            charts.time_series,
            [(p.label, p.total) for p in growth],
            chart_id="growth-chart",
            title="Memories created over time (cumulative)",
            x_label=f"{unit} starting",
            y_label="memories",
        ),
        "growth_unit": unit,
        "histogram_chart": charts.responsive(
            charts.bar_chart,
            list(zip(histogram.labels, histogram.counts, strict=True)),
            chart_id="importance-chart",
            title="Importance of live memories",
            x_label=f"stored importance (bins of {histogram.width:g}, by start)",
            y_label="memories (log scale)" if histogram.skewed else "memories",
            log_scale=histogram.skewed,
        ),
        "histogram": histogram,
        # The same rows, through the same function, as the live update pushes.
        **live.runs_context(workspace),
        "schedule": console_selectors.next_runs(workspace, now=timezone.now()),
        "result": result,
    }


@workspace_page()
def dashboard(request: HttpRequest, console: Console) -> HttpResponse:
    context = _dashboard_context(console, _run_or_none(console, request.GET.get("ran")))
    return render(request, "console/dashboard.html", context)


def _run_or_none(console: Console, run_id: str | None) -> MaintenanceRun | None:
    """The run named by ``?ran=`` (where a no-JavaScript "run now" lands), if it is this
    workspace's."""
    try:
        return run_get(console.workspace, _known_id(int(run_id or "")))
    except (ValueError, Http404, NotFound):
        return None


@operator_action
def run_now(request: HttpRequest, console: Console) -> HttpResponse:
    """Start a full run now. Anything but ``dry_run=0`` is a dry run: a form that lost its
    field must not change data. A real run — and a dry run of a large workspace (the API's
    rule, ``maintenance.run_start.runs_inline``) — is queued for the worker, and the browser goes to
    its run page (303; for htmx, ``HX-Redirect``), which follows it live; if another run holds
    the workspace's lease, the run is recorded ``skipped`` and its page says so. A dry run of a
    small workspace runs in this request: for htmx, the result replaces the result area; the
    runs table is refreshed by the live update the run itself announces."""
    dry_run = request.POST.get("dry_run") != "0"
    args: dict[str, Any] = {
        "workspace": console.workspace,
        "kind": RunKind.FULL,
        "trigger": RunTrigger.UI,
        "dry_run": dry_run,
        "actor": console.actor,
    }
    if not runs_inline(console.workspace, dry_run=dry_run):
        try:
            run_id = submit_run(**args).run.pk
        except Unavailable as exc:  # the broker refused the task: the run's page says so
            run_id = exc.fields["run_id"]
        url = reverse("console:run", kwargs={"slug": console.workspace.slug, "run_id": run_id})
        if request.htmx:  # type: ignore[attr-defined]
            response = HttpResponse(status=204)
            response["HX-Redirect"] = url
            return response
        return SeeOther(url)
    result = run_maintenance(**args)
    if not request.htmx:  # type: ignore[attr-defined]
        url = reverse("console:dashboard", args=[console.workspace.slug])
        return SeeOther(f"{url}?{urlencode({'ran': result['run_id']})}#run-result")
    run = run_get(console.workspace, result["run_id"])
    context = {"console": console, "workspace": console.workspace, "result": run}
    return render(request, "console/dashboard.html#run-result", context)


# --- entries ----------------------------------------------------------------------------------


def _choices(values: Any) -> list[tuple[str, str]]:
    return [("", "any"), *((v, v) for v in values)]


class EntryFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="Text")
    status = forms.ChoiceField(required=False, choices=_choices(LISTED_STATUSES))
    entry_type = forms.ChoiceField(required=False, choices=_choices(EntryType.values), label="Type")
    tier = forms.ChoiceField(required=False, choices=_choices(Tier.values))
    tag = forms.CharField(required=False, max_length=100)
    project = forms.CharField(required=False, max_length=200)
    sort = forms.ChoiceField(required=False, choices=[(k, k) for k in ENTRY_SORTS])

    def filters(self) -> dict[str, Any]:
        """The valid filters (an invalid one is dropped and reported, never a 500)."""
        self.is_valid()
        data = getattr(self, "cleaned_data", {})
        found = {k: v for k, v in data.items() if v and k != "sort"}
        return {**found, "sort": data.get("sort") or "importance"}


@workspace_page()
def entries(request: HttpRequest, console: Console) -> HttpResponse:
    form = EntryFilterForm(request.GET)
    listed = console_selectors.entry_page_list(console.workspace, **form.filters())
    page = console_selectors.paginate(listed, request.GET.get("page"), console_selectors.ENTRIES_PER_PAGE)
    context = {
        "console": console,
        "workspace": console.workspace,
        "form": form,
        "page": page,
        "cold_threshold": console_selectors.cold_threshold(console.workspace),
    }
    return _partial_or_page(request, "console/entries.html", "entry-list", context)


def _entry_context(console: Console, entry_id: int, request: HttpRequest) -> dict[str, Any]:
    try:
        page = console_selectors.entry_page(
            console.workspace, _known_id(entry_id), now=timezone.now(), events_page=request.GET.get("events")
        )
    except NotFound:
        raise Http404("no such entry in this workspace") from None
    return {
        "console": console,
        "workspace": console.workspace,
        "page": page,
        "entry": page.entry,
        "cold_threshold": page.cold_threshold,
    }


@workspace_page()
def entry(request: HttpRequest, console: Console, entry_id: int) -> HttpResponse:
    context = _entry_context(console, entry_id, request)
    return _partial_or_page(request, "console/entry.html", "entry-history", context)


def _pin(pinned: bool) -> Callable[[Console, int], Any]:
    return lambda console, entry_id: entry_changes.entry_set_pinned(
        workspace=console.workspace, entry_id=entry_id, pinned=pinned, actor=console.actor
    )


ENTRY_ACTIONS: dict[str, Callable[[Console, int], Any]] = {
    "pin": _pin(True),
    "unpin": _pin(False),
    "restore": lambda console, entry_id: entry_changes.entry_restore(
        workspace=console.workspace, entry_id=entry_id, actor=console.actor
    ),
    "release": lambda console, entry_id: entry_changes.entry_release(
        workspace=console.workspace, entry_id=entry_id, actor=console.actor
    ),
    "tombstone": lambda console, entry_id: entry_changes.entry_tombstone(
        workspace=console.workspace, entry_id=entry_id, reason=TombstoneReason.MANUAL, actor=console.actor
    ),
}


@operator_action
def entry_action(request: HttpRequest, console: Console, entry_id: int, action: str) -> HttpResponse:
    """Pin, unpin, restore, release (its operator hold) or tombstone one entry. A refusal (an
    old version, an entry already in that state) is shown on the page with its status code;
    for htmx the refreshed header carries the message with 200, because htmx does not swap
    error responses and the page the operator acted on was evidently out of date."""
    act = ENTRY_ACTIONS.get(action)
    if act is None:
        raise Http404(f"no action {action!r}")
    error: ServiceError | None = None
    try:
        act(console, _known_id(entry_id))
    except NotFound:
        raise Http404("no such entry in this workspace") from None
    except ServiceError as exc:
        error = exc
    if not request.htmx and error is None:  # type: ignore[attr-defined]
        return SeeOther(reverse("console:entry", args=[console.workspace.slug, entry_id]))
    context = {**_entry_context(console, entry_id, request), "error": error}
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "console/entry.html#action-result", {**context, "oob": True})
    assert error is not None
    return render(request, "console/entry.html", context, status=error.status_code)
