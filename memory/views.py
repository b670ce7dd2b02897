"""Console pages. The full review console is built on these foundations (operator console
issue); for now the home page lists the member's workspaces with their counts."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from memory.models import Status
from memory.selectors import workspace_summaries


@login_required
def console_home(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "memory/console_home.html",
        {"summaries": workspace_summaries(request.user), "statuses": Status.values},
    )
