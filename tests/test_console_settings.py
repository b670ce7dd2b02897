"""The console settings page: every member sees the policy and the keys; only admins
edit them, checked by the server (viewers' and operators' POSTs are 403 and change nothing);
the policy is clamped on save and a bad residue pattern is a 422; a new key's secret is shown
once; keys of another workspace are never touched; CSRF is enforced."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from memory import accounts
from memory.models import ApiKey, Workspace
from memory.policy import LIMITS
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db

User = get_user_model()


def member(workspace: Workspace, role: str, username: str | None = None) -> Any:
    user = User.objects.create_user(username=username or f"{role}-{workspace.slug}")
    accounts.membership_set(workspace=workspace, user=user, role=role)
    return user


def as_role(client: Client, workspace: Workspace, role: str) -> Client:
    client.force_login(member(workspace, role))
    return client


def url(workspace: Workspace, name: str = "settings") -> str:
    return reverse(f"console:{name}", kwargs={"slug": workspace.slug})


def policy_data(workspace: Workspace, **changes: Any) -> dict[str, Any]:
    """The form as the page submits it: every current value, plus ``changes``."""
    row = MaintenancePolicy.objects.get(workspace=workspace)
    data: dict[str, Any] = {name: getattr(row, name) for name in LIMITS}
    data["review_mode"] = row.review_mode
    data["exclude_tags"] = ", ".join(row.exclude_tags)
    data["residue_patterns"] = "\n".join(row.residue_patterns or [])
    data.update(changes)
    return data


def policy_snapshot(workspace: Workspace) -> dict[str, Any]:
    row = MaintenancePolicy.objects.get(workspace=workspace)
    return {name: getattr(row, name) for name in ["review_mode", *LIMITS, "exclude_tags", "residue_patterns"]}


# --- read-only for viewers and operators --------------------------------------------------


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_non_admin_sees_the_page_without_forms(client: Client, workspace: Workspace, role: str) -> None:
    key, _ = accounts.api_key_create(workspace=workspace, name="agent-one", role="agent")
    response = as_role(client, workspace, role).get(url(workspace))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Maintenance policy" in html
    assert "decay_lambda" in html or "Decay lambda" in html
    assert key.prefix in html and "agent-one" in html
    assert url(workspace, "settings_policy") not in html
    assert url(workspace, "settings_keys") not in html
    assert "<form" not in html.split("<main>", 1)[1]


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_non_admin_posts_are_403_and_change_nothing(client: Client, workspace: Workspace, role: str) -> None:
    key, _ = accounts.api_key_create(workspace=workspace, name="agent-one", role="agent")
    before = policy_snapshot(workspace)
    as_role(client, workspace, role)
    response = client.post(url(workspace, "settings_policy"), policy_data(workspace, decay_lambda="0.5"))
    assert response.status_code == 403
    response = client.post(
        url(workspace, "settings_keys"), {"action": "create", "name": "x", "role": "admin"}
    )
    assert response.status_code == 403
    response = client.post(url(workspace, "settings_keys"), {"action": "revoke", "key_id": key.pk})
    assert response.status_code == 403
    assert policy_snapshot(workspace) == before
    assert ApiKey.objects.filter(workspace=workspace).count() == 1
    key.refresh_from_db()
    assert key.revoked_at is None


def test_non_member_gets_404(client: Client, workspace: Workspace, other_workspace: Workspace) -> None:
    as_role(client, other_workspace, "admin")
    assert client.get(url(workspace)).status_code == 404
    response = client.post(url(workspace, "settings_policy"), policy_data(workspace, decay_lambda="0.5"))
    assert response.status_code == 404
    assert MaintenancePolicy.objects.get(workspace=workspace).decay_lambda == LIMITS["decay_lambda"].default


def test_anonymous_is_sent_to_login(client: Client, workspace: Workspace) -> None:
    response = client.get(url(workspace))
    assert response.status_code == 302
    assert "login" in response["Location"]


# --- the policy ---------------------------------------------------------------------------


def test_admin_sees_the_forms(client: Client, workspace: Workspace) -> None:
    html = as_role(client, workspace, "admin").get(url(workspace)).content.decode()
    assert url(workspace, "settings_policy") in html and url(workspace, "settings_keys") in html
    assert "csrfmiddlewaretoken" in html
    assert "clamped" in html


def test_admin_changes_a_setting(client: Client, workspace: Workspace) -> None:
    as_role(client, workspace, "admin")
    data = policy_data(
        workspace, decay_lambda="0.05", exclude_tags="keep, pinned ,keep", residue_patterns="TODO\n\n^wip"
    )
    response = client.post(url(workspace, "settings_policy"), data)
    assert response.status_code == 303
    assert response["Location"] == url(workspace)
    row = MaintenancePolicy.objects.get(workspace=workspace)
    assert row.decay_lambda == 0.05
    assert row.exclude_tags == ["keep", "pinned"]
    assert row.residue_patterns == ["TODO", "^wip"]
    assert row.stale_after_days == LIMITS["stale_after_days"].default
    page = client.get(response["Location"]).content.decode()
    assert "Policy saved" in page


def test_admin_switches_the_review_mode_both_ways(client: Client, workspace: Workspace) -> None:
    as_role(client, workspace, "admin")
    for mode in ("propose", "apply"):
        before = MaintenancePolicy.objects.get(workspace=workspace).review_mode
        assert before != mode
        page = client.get(url(workspace)).content.decode()
        assert re.search(rf'<input type="radio" name="review_mode" value="{before}"[^>]*checked', page)
        response = client.post(url(workspace, "settings_policy"), policy_data(workspace, review_mode=mode))
        assert response.status_code == 303
        assert MaintenancePolicy.objects.get(workspace=workspace).review_mode == mode
        assert "Policy saved (review_mode" in client.get(url(workspace)).content.decode()


def test_a_page_without_the_review_mode_control_keeps_the_mode(client: Client, workspace: Workspace) -> None:
    as_role(client, workspace, "admin")
    data = policy_data(workspace, decay_lambda="0.05")
    del data["review_mode"]  # a page loaded before the control existed
    assert client.post(url(workspace, "settings_policy"), data).status_code == 303
    row = MaintenancePolicy.objects.get(workspace=workspace)
    assert (row.review_mode, row.decay_lambda) == ("apply", 0.05)


def test_a_viewer_reads_the_review_mode(client: Client, workspace: Workspace) -> None:
    MaintenancePolicy.objects.filter(workspace=workspace).update(review_mode="apply")
    html = as_role(client, workspace, "viewer").get(url(workspace)).content.decode()
    assert re.search(r'id="policy-review_mode">apply: maintenance archives and tombstones at once', html)


def test_out_of_range_values_are_clamped(client: Client, workspace: Workspace) -> None:
    as_role(client, workspace, "admin")
    data = policy_data(workspace, decay_lambda="7", stale_after_days="1", backups_keep="5000")
    assert client.post(url(workspace, "settings_policy"), data).status_code == 303
    row = MaintenancePolicy.objects.get(workspace=workspace)
    assert row.decay_lambda == LIMITS["decay_lambda"].high
    assert row.stale_after_days == LIMITS["stale_after_days"].low
    assert row.backups_keep == LIMITS["backups_keep"].high


@pytest.mark.parametrize(
    "changes",
    [
        {"residue_patterns": "fine\n([unclosed"},
        {"decay_lambda": "lots"},
        {"decay_sigma": "nan"},
        {"stale_after_days": ""},
        {"review_mode": "yolo"},
    ],
)
def test_invalid_input_is_422_and_changes_nothing(
    client: Client, workspace: Workspace, changes: dict[str, str]
) -> None:
    as_role(client, workspace, "admin")
    before = policy_snapshot(workspace)
    data = policy_data(workspace, **{"decay_mu": "0.05", **changes})
    response = client.post(url(workspace, "settings_policy"), data)
    assert response.status_code == 422
    assert 'class="error"' in response.content.decode()
    assert policy_snapshot(workspace) == before


def test_bad_regex_error_names_the_pattern(client: Client, workspace: Workspace) -> None:
    as_role(client, workspace, "admin")
    response = client.post(
        url(workspace, "settings_policy"), policy_data(workspace, residue_patterns="([unclosed")
    )
    assert response.status_code == 422
    assert "not a valid regular expression" in response.content.decode()


def test_only_changed_settings_are_written(client: Client, workspace: Workspace) -> None:
    """A page loaded before another admin's change does not overwrite it with the old value."""
    as_role(client, workspace, "admin")
    shown = policy_data(workspace)
    stale = {**shown, **{f"initial-{name}": value for name, value in shown.items()}, "decay_mu": "0.1"}
    MaintenancePolicy.objects.filter(workspace=workspace).update(decay_lambda=0.3)  # the other admin
    assert client.post(url(workspace, "settings_policy"), stale).status_code == 303
    row = MaintenancePolicy.objects.get(workspace=workspace)
    assert (row.decay_lambda, row.decay_mu) == (0.3, 0.1)


def test_page_carries_the_values_it_shows(client: Client, workspace: Workspace) -> None:
    html = as_role(client, workspace, "admin").get(url(workspace)).content.decode()
    assert 'name="initial-decay_lambda"' in html


def test_policy_get_is_405_for_admin(client: Client, workspace: Workspace) -> None:
    as_role(client, workspace, "admin")
    assert client.get(url(workspace, "settings_policy")).status_code == 405
    assert client.get(url(workspace, "settings_keys")).status_code == 405


# --- keys ---------------------------------------------------------------------------------


def test_admin_creates_a_key_shown_once(client: Client, workspace: Workspace) -> None:
    as_role(client, workspace, "admin")
    response = client.post(
        url(workspace, "settings_keys"), {"action": "create", "name": "bot", "role": "operator"}
    )
    assert response.status_code == 200
    assert "no-store" in response.get("Cache-Control", "")
    html = response.content.decode()
    match = re.search(r'id="new-key-secret">(msk_[^<]+)<', html)
    assert match is not None
    raw = match.group(1)
    key = ApiKey.objects.get(workspace=workspace, name="bot")
    assert key.role == "operator"
    assert key.secret_hash == accounts.hash_key(raw)
    assert raw not in (key.secret_hash, key.prefix, key.name)
    assert raw.startswith(key.prefix)
    page = client.get(url(workspace)).content.decode()
    assert raw not in page
    assert key.prefix in page and "bot" in page


@pytest.mark.parametrize("data", [{"name": "", "role": "agent"}, {"name": "x", "role": "root"}])
def test_invalid_key_is_422(client: Client, workspace: Workspace, data: dict[str, str]) -> None:
    as_role(client, workspace, "admin")
    response = client.post(url(workspace, "settings_keys"), {"action": "create", **data})
    assert response.status_code == 422
    assert not ApiKey.objects.filter(workspace=workspace).exists()


def test_admin_revokes_a_key(client: Client, workspace: Workspace) -> None:
    key, _ = accounts.api_key_create(workspace=workspace, name="old", role="agent")
    as_role(client, workspace, "admin")
    response = client.post(url(workspace, "settings_keys"), {"action": "revoke", "key_id": key.pk})
    assert response.status_code == 303
    key.refresh_from_db()
    assert key.revoked_at is not None
    page = client.get(url(workspace)).content.decode()
    assert "is revoked" in page
    assert f'name="key_id" value="{key.pk}"' not in page  # no revoke button any more


@pytest.mark.parametrize("key_id", ["other", "abc", "99999999999999999999999", ""])
def test_revoke_of_another_workspace_key_touches_nothing(
    client: Client, workspace: Workspace, other_workspace: Workspace, key_id: str
) -> None:
    theirs, _ = accounts.api_key_create(workspace=other_workspace, name="theirs", role="admin")
    as_role(client, workspace, "admin")
    value = str(theirs.pk) if key_id == "other" else key_id
    response = client.post(url(workspace, "settings_keys"), {"action": "revoke", "key_id": value})
    assert response.status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert "theirs" not in client.get(url(workspace)).content.decode()


def test_unknown_action_changes_nothing(client: Client, workspace: Workspace) -> None:
    as_role(client, workspace, "admin")
    response = client.post(url(workspace, "settings_keys"), {"action": "delete", "key_id": "1"})
    assert response.status_code == 303
    assert not ApiKey.objects.exists()


# --- CSRF ---------------------------------------------------------------------------------


def test_csrf_is_enforced(workspace: Workspace) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(member(workspace, "admin"))
    before = policy_snapshot(workspace)
    response = client.post(url(workspace, "settings_policy"), policy_data(workspace, decay_lambda="0.5"))
    assert response.status_code == 403
    response = client.post(
        url(workspace, "settings_keys"), {"action": "create", "name": "x", "role": "agent"}
    )
    assert response.status_code == 403
    assert policy_snapshot(workspace) == before
    assert not ApiKey.objects.exists()
