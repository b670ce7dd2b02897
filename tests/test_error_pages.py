"""The production 404 and 500 pages (DEBUG off) look like the console: its stylesheet and icon,
no inline script or style (the Content-Security-Policy refuses them), a way back; and with
DEBUG off and collectstatic run, as a deployment does, the icon every page links and the
/favicon.ico that pages without the link ask for are both served."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from django.test import RequestFactory, override_settings
from django.views import defaults

from tests.test_production import ROOT, get, production_env, web_process


def _no_inline_code(html: str) -> None:
    assert "style=" not in html and "<style" not in html
    assert not re.search(r"<script(?![^>]*\bsrc=)", html)


@override_settings(DEBUG=False)
def test_the_404_page_is_the_console_s_own(client):
    response = client.get("/no-such-page/")

    html = response.content.decode()
    assert response.status_code == 404
    assert "Page not found" in html and 'href="/console/"' in html
    assert "css/console.css" in html and "favicon.svg" in html
    _no_inline_code(html)


@pytest.mark.django_db
def test_the_500_page_needs_no_context_and_is_the_console_s_own():
    # Django renders it without a request context: nothing on it may need one.
    response = defaults.server_error(RequestFactory().get("/"))

    html = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong" in html and "css/console.css" in html and "favicon.svg" in html
    _no_inline_code(html)


def _member(client, role: str):
    """``client`` logged in as a member of workspace acme with ``role``."""
    from django.contrib.auth.models import User

    from memory import accounts

    workspace = accounts.workspace_create(slug="acme", name="Acme", review_mode="apply")
    user = User.objects.create(username=f"a-{role}")
    accounts.membership_set(workspace=workspace, user=user, role=role)
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_a_role_below_the_action_s_gets_the_console_s_403_page(client):
    _member(client, "viewer")

    response = client.post("/console/acme/review/hygiene/", {"action": "archive", "ids": ["1"]})

    html = response.content.decode()
    assert response.status_code == 403
    assert "Not allowed" in html and "needs the operator role; yours is viewer" in html
    assert "css/console.css" in html and 'href="/console/"' in html
    _no_inline_code(html)


@pytest.mark.django_db
def test_a_form_without_its_csrf_token_gets_the_console_s_403_page():
    from django.test import Client

    client = _member(Client(enforce_csrf_checks=True), "operator")

    response = client.post("/console/acme/review/hygiene/", {"action": "archive", "ids": ["1"]})

    html = response.content.decode()
    assert response.status_code == 403
    assert "This form has expired" in html and "Nothing was changed" in html
    assert "css/console.css" in html
    _no_inline_code(html)


def test_the_400_page_is_the_console_s_own():
    response = defaults.bad_request(RequestFactory().get("/"), Exception("bad"))

    html = response.content.decode()
    assert response.status_code == 400
    assert "Bad request" in html and "css/console.css" in html
    _no_inline_code(html)


def test_without_debug_the_icon_the_stylesheet_and_the_404_page_are_served(tmp_path):
    env = production_env(tmp_path, STATIC_ROOT=str(tmp_path / "static"))
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, check=True
    )
    https = {"X-Forwarded-Proto": "https"}
    with web_process(env) as base:
        status, _, body = get(f"{base}/no-such-page/", **https)
        page = body.decode()
        assert status == 404 and "Page not found" in page
        icon = re.search(r'<link rel="icon" href="([^"]+)"', page).group(1)
        sheet = re.search(r'<link rel="stylesheet" href="([^"]+)"', page).group(1)
        assert re.search(r"favicon\.[0-9a-f]{12}\.svg$", icon), icon  # the hashed, cacheable name
        status, headers, _ = get(base + icon, **https)
        assert status == 200 and headers["Content-Type"].startswith("image/svg+xml")
        status, headers, _ = get(base + sheet, **https)
        assert status == 200 and headers["Content-Type"].startswith("text/css")
        status, headers, _ = get(f"{base}/favicon.ico", **https)
        assert status == 302 and headers["Location"] == icon
