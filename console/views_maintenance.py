"""Console pages of maintenance: the review queue and the runs.

Each page is one template with named partials. A plain request renders the page; an htmx
request (tab switch, filter, page link) renders only the partial it replaces. Actions are
POSTs by operators (``operator_action``: viewers get 403 before anything runs) that call the
services. Without JavaScript an action answers 303 back to the page with a message; with htmx
it answers only what changed: the rows it handled are deleted out of band, the tab counts and
the notice are re-rendered out of band.

A ``ServiceError`` is never a 500. Without JavaScript, "not found" is a 404 and any other
refusal a message on the page; with htmx the response carries the error's status code, the
notice out of band and ``HX-Reswap: none`` plus ``X-Console-Notice`` (the pages let htmx swap
such a notice although the status is 4xx).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import capfirst

from console import selectors as console_selectors
from console.access import Console, operator_action, workspace_page
from console.selectors_maintenance import (
    AFFECTED_ACTIONS,
    AUTOMATIC_TO,
    REVIEW_TABS,
    automatic_changes,
    automatic_rows,
    clean_ids,
    default_tab,
    dispute_queue,
    hold_days,
    hygiene_queue,
    open_tombstones,
    pending_groups,
    pending_proposals,
    pending_sections,
    pending_totals,
    review_counts,
    run_detail,
    run_rows,
    tombstone_countdown,
    tombstone_rows,
    tombstoned_entry_ids,
)
from maintenance import contradictions, hygiene_actions, proposals, revert
from maintenance.hygiene import candidate_rows
from maintenance.models import DisputeStatus, Resolution, RunKind, RunStatus
from maintenance.selectors import folded_summary, hygiene_reason_codes, run_days, run_list
from memory import entry_changes
from memory.errors import Conflict, InvalidInput, NotFound, ServiceError
from memory.models.choices import ID_MAX, TombstoneReason

PER_PAGE = 25
NOTICE_HEADER = "X-Console-Notice"


# --- helpers ------------------------------------------------------------------------------


def _is_htmx(request: HttpRequest) -> bool:
    """An htmx request that wants a fragment (a boosted link or a history restore wants the page)."""
    htmx = getattr(request, "htmx", None)
    return htmx is not None and bool(htmx) and not htmx.boosted and not htmx.history_restore_request


def _page(request: HttpRequest, template: str, partial: str, context: dict[str, Any]) -> HttpResponse:
    name = f"{template}#{partial}" if _is_htmx(request) else template
    response = render(request, name, context)
    patch_vary_headers(response, ("HX-Request",))  # the same URL answers a page or a fragment
    return response


def _choice(request: HttpRequest, name: str, allowed: Any) -> str:
    value = request.GET.get(name, "")
    return value if value in allowed else ""


def _review_url(console: Console, tab: str) -> str:
    return f"{reverse('console:review', kwargs={'slug': console.workspace.slug})}?tab={tab}"


def _back(request: HttpRequest, console: Console, default: str) -> str:
    """Where a plain POST returns to: the page it came from (``next``), if it is one of this
    workspace's console pages on this site."""
    target = request.POST.get("next", "")
    if (
        target
        and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()})
        and target.startswith(f"/console/{console.workspace.slug}/")
    ):
        return target
    return default


def _see_other(url: str) -> HttpResponse:
    response = HttpResponseRedirect(url)
    response.status_code = 303  # after a POST, GET the page (the browser never re-posts)
    return response


def _ids_text(ids: list[Any]) -> str:
    shown = ", ".join(f"#{i}" for i in ids[:10])
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


def _summary(verb: str, done: list[int], skipped: list[Any], why: str) -> tuple[str, int]:
    """The notice of an action and its message level."""
    noun = "entry" if len(done) == 1 else "entries"
    text = f"{verb} {len(done)} {noun}" + (f" ({_ids_text(done)})." if done else ".")
    if skipped:
        text += f" Skipped {len(skipped)} ({_ids_text(skipped)}): {why}."
    return text, messages.SUCCESS if done else messages.WARNING


def _acted(
    request: HttpRequest,
    console: Console,
    *,
    tab: str,
    text: str,
    level: int,
    removed: list[tuple[str, str]],
    back: str,
) -> HttpResponse:
    """After an action on the review queue: with htmx, the handled rows go (``removed`` holds
    (tag, element id) pairs), the tab counts and the notice are redrawn; without, 303 back."""
    if _is_htmx(request):
        context = {
            "removed": removed,
            "tab": tab,
            "counts": review_counts(console.workspace),
            "notice": text,
            "notice_level": messages.DEFAULT_TAGS[level],
            "oob": True,
        }
        response = render(request, "console/review.html#action_result", context)
        if tab != "pending":
            response["HX-Trigger"] = "review-changed"  # the panel reloads its summary and rows
        return response
    messages.add_message(request, level, text)
    return _see_other(back)


def _refused(request: HttpRequest, exc: ServiceError, back: str) -> HttpResponse:
    """A refusal on the page: the API's message, as a sentence."""
    if _is_htmx(request):
        context = {"notice": capfirst(exc.detail), "notice_level": "error", "oob": True}
        response = render(request, "console/review.html#notice", context, status=exc.status_code)
        response["HX-Reswap"] = "none"
        response[NOTICE_HEADER] = "1"
        return response
    if isinstance(exc, NotFound):
        raise Http404(exc.detail)
    messages.error(request, capfirst(exc.detail))
    return _see_other(back)


def _selected(request: HttpRequest) -> tuple[list[int], list[str]]:
    ids, bad = clean_ids(request.POST.getlist("ids"))
    if not ids:
        raise InvalidInput("select at least one entry")
    return ids, bad


# --- the review queue ---------------------------------------------------------------------


def _pending_tab(request: HttpRequest, console: Console) -> dict[str, Any]:
    reason = _choice(request, "reason", proposals.ACTIONS)
    groups = pending_groups(console.workspace)
    page = Paginator(pending_proposals(console.workspace, reason=reason), PER_PAGE).get_page(
        request.GET.get("page")
    )
    totals = pending_totals(groups)
    decayed = any(g["reason"] == "evicted" for g in groups)
    return {
        # Decay proposals quote retention: the tab then says what it is (one more query).
        "cold_threshold": console_selectors.cold_threshold(console.workspace) if decayed else None,
        "known": {"pending": totals["all"]},
        "page": page,
        "sections": pending_sections(page.object_list, groups),
        "groups": groups,
        "totals": totals,
        "filters": {"reason": reason},
    }


def _hygiene_tab(request: HttpRequest, console: Console) -> dict[str, Any]:
    recommendation = _choice(request, "recommendation", ("archive", "review"))
    reason = _choice(request, "reason", hygiene_reason_codes())
    page = hygiene_queue(
        console.workspace,
        recommendation=recommendation,
        reason=reason,
        page=request.GET.get("page"),
        per_page=PER_PAGE,
    )
    filtered = recommendation or reason
    return {
        "known": {} if filtered else {"hygiene": page.paginator.count},
        "page": page,
        "rows": candidate_rows(list(page.object_list)),
        "filters": {"recommendation": recommendation, "reason": reason},
        "reason_codes": hygiene_reason_codes(),
    }


def _automatic_tab(request: HttpRequest, console: Console) -> dict[str, Any]:
    run = request.GET.get("run", "")
    run_id = int(run) if run.isdigit() and int(run) <= ID_MAX else None
    to_status = _choice(request, "to_status", AUTOMATIC_TO)
    events = automatic_changes(console.workspace, run_id=run_id, to_status=to_status or None)
    rows = automatic_rows(events, hold_days=hold_days(console.workspace))
    page = Paginator(rows, PER_PAGE).get_page(request.GET.get("page"))
    filtered = run_id is not None or bool(to_status)
    return {
        "known": {} if filtered else {"automatic": page.paginator.count},
        "page": page,
        "filters": {"run": run_id or "", "to_status": to_status},
    }


def _tombstones_tab(request: HttpRequest, console: Console) -> dict[str, Any]:
    reason = _choice(request, "reason", TombstoneReason.values)
    tombstones = tombstone_rows(
        open_tombstones(console.workspace, reason=reason or None), hold_days=hold_days(console.workspace)
    )
    page = Paginator(tombstones, PER_PAGE).get_page(request.GET.get("page"))
    return {
        "known": {} if reason else {"tombstones": page.paginator.count},
        "page": page,
        "rows": tombstone_countdown(page.object_list, timezone.now()),
        "filters": {"reason": reason},
        "reasons": TombstoneReason.values,
    }


def _disputes_tab(request: HttpRequest, console: Console) -> dict[str, Any]:
    status = _choice(request, "status", DisputeStatus.values) or DisputeStatus.OPEN
    detected_by = _choice(request, "detected_by", ("sweep", "write"))
    disputes = dispute_queue(console.workspace, status=status, detected_by=detected_by or None)
    page = Paginator(disputes, PER_PAGE).get_page(request.GET.get("page"))
    unfiltered = status == DisputeStatus.OPEN and not detected_by
    return {
        "known": {"disputes": page.paginator.count} if unfiltered else {},
        "page": page,
        "filters": {"status": status, "detected_by": detected_by},
    }


TABS = {
    "pending": _pending_tab,
    "hygiene": _hygiene_tab,
    "automatic": _automatic_tab,
    "tombstones": _tombstones_tab,
    "disputes": _disputes_tab,
}


def _review_context(request: HttpRequest, console: Console, tab: str) -> dict[str, Any]:
    context: dict[str, Any] = {
        "console": console,
        "tab": tab,
        "here": request.get_full_path() if request.method == "GET" else _review_url(console, tab),
    }
    context.update(TABS[tab](request, console))
    context["counts"] = review_counts(console.workspace, known=context.pop("known"))
    return context


@workspace_page()
def review(request: HttpRequest, console: Console) -> HttpResponse:
    """The review queue: one tab at a time, every tab's count in the tab bar. Pending approval
    is the default while it has rows. An htmx request aimed at ``#pending-panel`` (the live
    refresh after another door changed the proposal set) gets only that panel."""
    tab = request.GET.get("tab", "")
    tab = tab if tab in REVIEW_TABS else default_tab(console.workspace)
    context = _review_context(request, console, tab)
    htmx: Any = getattr(request, "htmx", None)
    if tab == "pending" and _is_htmx(request) and htmx.target == "pending-panel":
        return _page(request, "console/review.html", "pending", context)
    return _page(request, "console/review.html", "review", context)


# --- pending approval: approve, reject -------------------------------------------------------


def _proposal_scope(request: HttpRequest) -> tuple[dict[str, Any], list[str]]:
    """What an approve/reject names: ``scope=all`` (with an optional ``reason``: a whole reason
    group) or the selected ``ids``; and the values that were no ids."""
    if request.POST.get("scope") == "all":
        reason = request.POST.get("reason", "")
        return {"all": True, "reason": reason or None}, []
    ids, bad = _selected(request)
    return {"ids": ids}, bad


def _skipped_text(skipped: list[dict[str, Any]], bad: list[str]) -> str:
    if not skipped and not bad:
        return ""
    shown = "; ".join(f"#{s['id']} {s['why']}" for s in skipped[:5])
    more = len(skipped) - 5
    text = f" Skipped {len(skipped) + len(bad)}: {shown}" if skipped else f" Skipped {len(bad)}"
    if more > 0:
        text += f"; and {more} more"
    if bad:
        text += f" ({len(bad)} not entry ids)"
    return text + "."


def _pending_acted(
    request: HttpRequest,
    console: Console,
    *,
    text: str,
    level: int,
    handled: list[int],
    before: list[dict[str, Any]],
    back: str,
) -> HttpResponse:
    """After an approve/reject: with htmx the handled rows go and the counts (tab, summary,
    reason groups) are redrawn; a group left empty goes. Without JavaScript, 303 back."""
    if not _is_htmx(request):
        messages.add_message(request, level, text)
        return _see_other(back)
    groups = pending_groups(console.workspace)
    after = {g["reason"]: g["count"] for g in groups}
    context = {
        "console": console,
        "removed": [("tr", f"pending-row-{i}") for i in handled],
        "tab": "pending",
        "counts": review_counts(console.workspace, known={"pending": sum(after.values())}),
        "notice": text,
        "notice_level": messages.DEFAULT_TAGS[level],
        "regrouped": [(g["reason"], after.get(g["reason"], 0)) for g in before],
        "totals": pending_totals(groups),
        "oob": True,
    }
    return render(request, "console/review.html#pending_result", context)


def _breaker(request: HttpRequest, console: Console, exc: ServiceError, back: str) -> HttpResponse:
    """The circuit breaker refused an approval: its message, and a form that repeats the same
    approval with ``force`` (confirmed)."""
    retry = {
        "scope": request.POST.get("scope", ""),
        "reason": request.POST.get("reason", ""),
        "ids": request.POST.getlist("ids"),
        "next": back,
    }
    context: dict[str, Any] = {
        "console": console,
        "notice": exc.detail,
        "notice_level": "error",
        "breaker": retry,
    }
    if _is_htmx(request):
        response = render(request, "console/review.html#notice", {**context, "oob": True}, status=409)
        response["HX-Reswap"] = "none"
        response[NOTICE_HEADER] = "1"
        return response
    context.update(_review_context(request, console, "pending"))
    context["notice"], context["notice_level"], context["breaker"] = exc.detail, "error", retry
    return render(request, "console/review.html", context, status=409)


@operator_action
def approve_proposals(request: HttpRequest, console: Console) -> HttpResponse:
    """Approve open proposals: one or a selection (``ids``), a reason group (``scope=all`` and
    ``reason``) or all (``scope=all``); ``force=1`` passes the circuit breaker."""
    back = _back(request, console, _review_url(console, "pending"))
    before = pending_groups(console.workspace)
    try:
        scope, bad = _proposal_scope(request)
        result = proposals.approve(
            console.workspace, **scope, actor=console.actor, force=request.POST.get("force") == "1"
        )
    except Conflict as exc:
        if exc.detail.startswith("circuit breaker"):
            return _breaker(request, console, exc, back)
        return _refused(request, exc, back)
    except ServiceError as exc:
        return _refused(request, exc, back)
    applied, skipped = result["applied"], result["skipped"]
    noun = "change" if len(applied) == 1 else "changes"
    text = f"Approved {len(applied)} {noun}" + (f" ({_ids_text(applied)})." if applied else ".")
    if result.get("backup_file"):
        # The approval is no run: the backup it wrote first is named here (and in Admin → Backups).
        text += f" A pre-prune backup was written first: {result['backup_file']}."
    text += _skipped_text(skipped, bad)
    level = messages.SUCCESS if applied else messages.WARNING
    handled = [*applied, *(s["id"] for s in skipped)]
    return _pending_acted(request, console, text=text, level=level, handled=handled, before=before, back=back)


@operator_action
def reject_proposals(request: HttpRequest, console: Console) -> HttpResponse:
    """Reject open proposals (the same choices as approve): each entry gets an operator hold."""
    back = _back(request, console, _review_url(console, "pending"))
    before = pending_groups(console.workspace)
    try:
        scope, bad = _proposal_scope(request)
        result = proposals.reject(console.workspace, **scope, actor=console.actor)
    except ServiceError as exc:
        return _refused(request, exc, back)
    rejected, skipped = result["rejected"], result["skipped"]
    noun = "change" if len(rejected) == 1 else "changes"
    text = f"Rejected {len(rejected)} {noun}" + (f" ({_ids_text(rejected)})" if rejected else "")
    if len(rejected) == 1:
        text += "; the entry is held: automation leaves it alone until released."
    elif rejected:
        text += "; the entries are held: automation leaves them alone until released."
    else:
        text += "."
    text += _skipped_text(skipped, bad)
    level = messages.SUCCESS if rejected else messages.WARNING
    handled = [*rejected, *(s["id"] for s in skipped)]
    return _pending_acted(request, console, text=text, level=level, handled=handled, before=before, back=back)


@operator_action
def release_holds(request: HttpRequest, console: Console) -> HttpResponse:
    """Release the operator hold of the selected entries (from a queue row: ``tab`` says which)."""
    tab = request.POST.get("tab", "")
    tab = tab if tab in REVIEW_TABS else "automatic"
    back = _back(request, console, _review_url(console, tab))
    try:
        ids, bad = _selected(request)
    except ServiceError as exc:
        return _refused(request, exc, back)
    done: list[int] = []
    for entry_id in ids:
        try:
            entry_changes.entry_release(workspace=console.workspace, entry_id=entry_id, actor=console.actor)
        except ServiceError:
            continue  # not held (released meanwhile), or not this workspace's entry
        done.append(entry_id)
    text, level = _summary("Released", done, [*(i for i in ids if i not in done), *bad], "not held")
    removed = [("span", f"hold-{i}") for i in done]
    return _acted(request, console, tab=tab, text=text, level=level, removed=removed, back=back)


@operator_action
def hygiene_action(request: HttpRequest, console: Console) -> HttpResponse:
    """Archive or keep one or more hygiene candidates (``action``, ``ids``)."""
    back = _back(request, console, _review_url(console, "hygiene"))
    action = request.POST.get("action", "")
    try:
        if action not in ("archive", "keep"):
            raise InvalidInput("action: must be archive or keep")
        ids, bad = _selected(request)
    except ServiceError as exc:
        return _refused(request, exc, back)
    if action == "archive":
        done = hygiene_actions.apply(console.workspace, ids, actor=console.actor)["archived"]
        text, level = _summary("Archived", done, [*(i for i in ids if i not in done), *bad], "not candidates")
    else:
        done = hygiene_actions.keep(console.workspace, ids, actor=console.actor)["kept"]
        text, level = _summary("Kept", done, [*(i for i in ids if i not in done), *bad], "not found")
    removed = [("tr", f"hygiene-row-{i}") for i in done]
    return _acted(request, console, tab="hygiene", text=text, level=level, removed=removed, back=back)


@operator_action
def revert_entries(request: HttpRequest, console: Console) -> HttpResponse:
    """Revert the newest automatic transition of each selected entry."""
    back = _back(request, console, _review_url(console, "automatic"))
    try:
        ids, bad = _selected(request)
    except ServiceError as exc:
        return _refused(request, exc, back)
    done = revert.revert_selection(console.workspace, ids, actor=console.actor)["reverted"]
    skipped = [*(i for i in ids if i not in done), *bad]
    text, level = _summary("Reverted", done, skipped, "nothing automatic left to revert")
    removed = [("tr", f"auto-row-{i}") for i in done]
    return _acted(request, console, tab="automatic", text=text, level=level, removed=removed, back=back)


@operator_action
def restore_tombstones(request: HttpRequest, console: Console) -> HttpResponse:
    """Restore tombstoned entries (before their purge) to their previous live status."""
    back = _back(request, console, _review_url(console, "tombstones"))
    try:
        ids, bad = _selected(request)
    except ServiceError as exc:
        return _refused(request, exc, back)
    done: list[int] = []
    for entry_id in tombstoned_entry_ids(console.workspace, ids):
        try:
            entry_changes.entry_restore(workspace=console.workspace, entry_id=entry_id, actor=console.actor)
        except ServiceError:
            continue  # changed meanwhile (a new version, or restored by someone else): skipped
        done.append(entry_id)
    skipped = [*(i for i in ids if i not in done), *bad]
    text, level = _summary("Restored", done, skipped, "no open tombstone")
    removed = [("tr", f"tomb-row-{i}") for i in done]
    return _acted(request, console, tab="tombstones", text=text, level=level, removed=removed, back=back)


@operator_action
def resolve_dispute(request: HttpRequest, console: Console, dispute_id: int) -> HttpResponse:
    """Resolve an open dispute: ``resolution`` (keep_both, keep_first, keep_second, supersede)
    and, for supersede, ``winner_id``."""
    back = _back(request, console, _review_url(console, "disputes"))
    winner = request.POST.get("winner_id", "").strip()
    try:
        if winner and not (winner.isdigit() and int(winner) <= ID_MAX):
            raise InvalidInput("winner_id: must be the id of one of the two entries")
        result = contradictions.resolve(
            console.workspace,
            dispute_id,
            request.POST.get("resolution", ""),
            actor=console.actor,
            winner_id=int(winner) if winner else None,
        )
    except ServiceError as exc:
        return _refused(request, exc, back)
    dispute = result["dispute"]
    text = f"Dispute #{dispute.pk} resolved: {Resolution(dispute.resolution).label}."
    if result["archived"]:
        text += f" Archived {_ids_text(result['archived'])}."
    if result["relationship"]:
        text += f" #{result['winner']} now supersedes the other entry."
    removed = [("article", f"dispute-{dispute.pk}")]
    return _acted(
        request, console, tab="disputes", text=text, level=messages.SUCCESS, removed=removed, back=back
    )


# --- runs ---------------------------------------------------------------------------------


@workspace_page()
def runs(request: HttpRequest, console: Console) -> HttpResponse:
    """The run history, newest first, filtered by kind and status."""
    kind = _choice(request, "kind", RunKind.values)
    status = _choice(request, "status", RunStatus.values)
    history = run_list(console.workspace, kind=kind or None, status=status or None)
    page = Paginator(history, PER_PAGE).get_page(request.GET.get("page"))
    # Runs that changed nothing, folded into a count per day a week after they ran: one query
    # for the totals, one more for a page of days when there are any.
    folded, day_rows = folded_summary(console.workspace, kind=kind or None, status=status or None)
    days = Paginator(run_days(console.workspace, kind=kind or None, status=status or None), PER_PAGE)
    days.__dict__["count"] = day_rows  # Paginator.count is a cached_property: counted above
    context = {
        "console": console,
        "page": page,
        "rows": run_rows(page.object_list),
        "days": days.get_page(request.GET.get("days_page")) if folded else None,
        "folded": folded,
        "filters": {"kind": kind, "status": status},
        "kinds": RunKind.values,
        "statuses": RunStatus.values,
    }
    return _page(request, "console/runs.html", "runs", context)


def _run_context(request: HttpRequest, console: Console, run_id: int) -> dict[str, Any]:
    pages = {action: request.GET.get(f"{action}_page") for action in AFFECTED_ACTIONS}
    try:
        detail = run_detail(console.workspace, run_id, pages=pages)
    except NotFound as exc:
        raise Http404(exc.detail) from None
    here = reverse("console:run", kwargs={"slug": console.workspace.slug, "run_id": run_id})
    return {"console": console, "detail": detail, "run": detail.run, "here": here}


@workspace_page()
def run(request: HttpRequest, console: Console, run_id: int) -> HttpResponse:
    """One run: parameters, counts, backup, affected entries, revert."""
    return _page(request, "console/run.html", "run", _run_context(request, console, run_id))


@operator_action
def revert_run(request: HttpRequest, console: Console, run_id: int) -> HttpResponse:
    """Undo what a run archived or tombstoned (not purged). From the run page (``origin=run``)
    htmx redraws the run; from the review queue the run's rows go."""
    default = reverse("console:run", kwargs={"slug": console.workspace.slug, "run_id": run_id})
    back = _back(request, console, default)
    try:
        result = revert.revert_run(console.workspace, run_id, actor=console.actor)
    except ServiceError as exc:
        return _refused(request, exc, back)
    done, skipped = result["reverted"], result["skipped"]
    text, level = _summary(f"Run #{run_id} reverted:", done, skipped, "changed since the run")
    text += (
        f" Links restored: {result['links_restored']}."
        f" Summaries archived: {len(result['summaries_archived'])}."
    )
    if _is_htmx(request) and request.POST.get("origin") == "run":
        context = _run_context(request, console, run_id)
        context.update(notice=text, notice_level=messages.DEFAULT_TAGS[level])
        return render(request, "console/run.html#run", context)
    removed = [("tbody", f"auto-run-{run_id}")]
    return _acted(request, console, tab="automatic", text=text, level=level, removed=removed, back=back)
