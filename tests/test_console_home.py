"""The console home page: a member's workspaces with their entry counts by status."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory import accounts, entry_changes, new_entries
from memory.models import Workspace
from memory.models.choices import Status

pytestmark = pytest.mark.django_db

User = get_user_model()
URL = "/console/"


def make(workspace: Workspace, content: str) -> Any:
    return new_entries.entry_create(workspace=workspace, content=content)


def member_of(*workspaces: Workspace, username: str = "mia") -> Any:
    user = User.objects.create_user(username=username)
    for ws in workspaces:
        accounts.membership_set(workspace=ws, user=user, role="viewer")
    return user


def row_counts(html: str, slug: str) -> dict[str, int]:
    """The status → count cells of the table row that names ``slug``."""
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", html, re.S) if f"<strong>{slug}</strong>" in r)
    cells = [int(n) for n in re.findall(r'<td class="num"[^>]*>(\d+)</td>', row)]
    return dict(zip(Status.values, cells, strict=True))


def test_an_anonymous_visitor_is_sent_to_login(client):
    response = client.get(URL)

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert "next=/console/" in response["Location"]


def test_logging_out_leads_back_to_the_console_login_not_the_admin(client):
    client.force_login(member_of(username="leo"))
    response = client.post("/accounts/logout/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/"
    page = client.get(response["Location"])
    assert page.status_code == 200 and b"Logged out" not in page.content
    assert client.get(URL).status_code == 302  # and the session is gone


def test_the_site_root_leads_to_the_console(client):
    response = client.get("/")

    assert response.status_code == 302
    assert response["Location"] == URL


def test_a_member_sees_only_their_workspaces_with_counts_by_status(client, workspace, other_workspace):
    for i in range(3):
        make(workspace, f"acme note {i}")
    archived = make(workspace, "acme archived")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual"
    )
    gone = make(workspace, "acme gone")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)
    versioned = make(workspace, "acme first words")
    entry_changes.entry_update(workspace=workspace, entry_id=versioned.pk, content="acme second words")
    new_entries.entry_create(workspace=workspace, content="acme staged", staged_class="evidence")
    for i in range(4):
        make(other_workspace, f"globex note {i}")
    client.force_login(member_of(workspace))

    response = client.get(URL)

    assert response.status_code == 200
    html = response.content.decode()
    assert "acme" in html
    assert "globex" not in html
    assert "Globex" not in html
    # Old versions are not counted: the updated entry counts once.
    assert row_counts(html, "acme") == {
        "staged": 1,
        "active": 4,
        "stale": 0,
        "archived": 1,
        "tombstoned": 1,
    }


def test_a_user_without_membership_is_told_how_to_get_one(client, workspace):
    make(workspace, "acme note")
    client.force_login(member_of(username="nina"))

    response = client.get(URL)

    html = response.content.decode()
    assert response.status_code == 200
    assert "acme" not in html
    assert "not a member of any workspace" in html
    assert "--username nina" in html


def test_the_query_count_does_not_grow_with_workspaces(client):
    def setup_workspaces(start: int, stop: int) -> list[Workspace]:
        made = []
        for i in range(start, stop):
            ws = accounts.workspace_create(slug=f"ws-{i}")
            make(ws, f"note in {i}")
            make(ws, f"another note in {i}")
            made.append(ws)
        return made

    user = member_of(*setup_workspaces(0, 2))
    client.force_login(user)
    with CaptureQueriesContext(connection) as few:
        assert client.get(URL).status_code == 200

    for ws in setup_workspaces(2, 10):
        accounts.membership_set(workspace=ws, user=user, role="operator")
    with CaptureQueriesContext(connection) as many:
        response = client.get(URL)

    assert len(response.context["summaries"]) == 10
    assert len(many) == len(few)
