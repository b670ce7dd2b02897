"""The Content-Security-Policy header: on the console, the admin and the API alike, scripts
and styles from the site's own static files only, no framing, forms posting only here."""

import pytest
from django.contrib.auth import get_user_model

pytestmark = pytest.mark.django_db

EXPECTED = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "frame-ancestors": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
}


def policy(response) -> dict[str, list[str]]:
    header = response.headers["Content-Security-Policy"]
    directives = [part.split() for part in header.split(";") if part.strip()]
    return {name: values for name, *values in directives}


@pytest.fixture
def member(client, workspace):
    from memory import accounts

    user = get_user_model().objects.create_superuser("csp", password="pw-csp-test-1")
    accounts.membership_set(workspace=workspace, user=user, role="operator")
    client.force_login(user)
    return user


@pytest.mark.parametrize(
    "path",
    ["/accounts/login/", "/admin/login/", "/api/v1/health", "/api/v1/docs"],
)
def test_every_page_anonymous_or_not_carries_the_policy(client, path):
    response = client.get(path)
    assert response.status_code in (200, 302), response.status_code
    got = policy(response)
    for name, values in EXPECTED.items():
        assert got.get(name) == values, (name, got)
    for values in got.values():  # nothing weakens it: no inline, no eval, no other host
        assert not {"'unsafe-inline'", "'unsafe-eval'", "*", "http:", "https:", "ws:", "wss:"} & set(values)


def test_console_and_admin_pages_of_a_member_carry_the_policy_and_no_inline_script(client, member, workspace):
    for path in [
        "/console/",
        f"/console/{workspace.slug}/",
        f"/console/{workspace.slug}/review/",
        f"/console/{workspace.slug}/entries/",
        "/admin/",
        "/admin/memory/entry/",
        "/admin/memory/workspace/add/",
    ]:
        response = client.get(path)
        assert response.status_code == 200, path
        assert policy(response)["script-src"] == ["'self'"], path
        html = response.content.decode()
        # Every <script> loads a file; no handler attribute (htmx's hx-on included).
        for tag in html.split("<script")[1:]:
            opening, _, rest = tag.partition(">")
            assert "src=" in opening or "application/json" in opening, (path, opening)
            if "src=" in opening:
                assert rest.partition("</script>")[0].strip() == "", (path, rest[:80])
        assert "hx-on" not in html, path
        assert " onclick=" not in html and " onload=" not in html, path
