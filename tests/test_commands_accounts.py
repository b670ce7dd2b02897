"""create_workspace (with --review-mode), add_member, create_api_key and revoke_api_key."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.forms.models import model_to_dict

from memory import accounts
from memory.models import ApiKey, Membership, Workspace
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db

User = get_user_model()
STRONG = "correct-horse-battery-staple-42"


@pytest.fixture(autouse=True)
def fast_hasher(settings):
    # The default hasher takes about a second per password; these tests hash a dozen.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def run(*args: Any, **options: Any) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


def run_json(*args: Any, **options: Any) -> dict[str, Any]:
    return json.loads(run(*args, "--json", **options))


# --- create_workspace ---------------------------------------------------------------------


def test_it_creates_a_workspace_with_its_policy():
    output = run("create_workspace", "initech", "--name", "Initech")

    workspace = Workspace.objects.get(slug="initech")
    assert workspace.name == "Initech"
    assert MaintenancePolicy.objects.filter(workspace=workspace).exists()
    assert "initech" in output


def test_it_prints_the_workspace_as_json():
    data = run_json("create_workspace", "initech")

    workspace = Workspace.objects.get(slug="initech")
    assert data == {"slug": "initech", "name": "initech", "id": workspace.pk, "review_mode": "propose"}
    assert list(data) == ["slug", "name", "id", "review_mode"]


def test_a_new_workspace_proposes_unless_asked_to_apply():
    # A new workspace's review mode: propose is the default; apply must be asked for.
    output = run("create_workspace", "initech")
    assert MaintenancePolicy.for_workspace(Workspace.objects.get(slug="initech")).review_mode == "propose"
    assert "manage.py proposals --workspace initech" in output
    output = run("create_workspace", "globex", "--review-mode", "apply")
    assert MaintenancePolicy.for_workspace(Workspace.objects.get(slug="globex")).review_mode == "apply"
    assert "revert_run" in output
    assert run_json("create_workspace", "umbrella", "--review-mode", "propose")["review_mode"] == "propose"


def test_it_refuses_an_unknown_review_mode():
    with pytest.raises(CommandError, match="review-mode"):
        run("create_workspace", "initech", "--review-mode", "later")
    assert not Workspace.objects.exists()


def test_it_refuses_an_existing_slug(workspace):
    with pytest.raises(CommandError, match="already exists"):
        run("create_workspace", workspace.slug)
    assert Workspace.objects.filter(slug=workspace.slug).count() == 1


def test_it_refuses_an_invalid_slug():
    with pytest.raises(CommandError, match="slug"):
        run("create_workspace", "not a slug!")
    assert not Workspace.objects.exists()


def test_a_refused_slug_exits_with_status_one(workspace, capsys):
    # Through the real command line, not call_command: the user sees a message, not a traceback.
    from django.core.management import ManagementUtility

    with pytest.raises(SystemExit) as exit_info:
        ManagementUtility(["manage.py", "create_workspace", workspace.slug]).execute()
    assert exit_info.value.code == 1
    assert "already exists" in capsys.readouterr().err


# --- add_member ---------------------------------------------------------------------------


def test_it_creates_the_user_with_a_generated_password_that_works(workspace):
    data = run_json("add_member", workspace="acme", username="alice", role="operator")

    assert list(data) == ["username", "workspace", "role", "created_user", "password"]
    assert data["username"] == "alice"
    assert data["workspace"] == "acme"
    assert data["role"] == "operator"
    assert data["created_user"] is True
    assert len(data["password"]) >= 16
    user = authenticate(username="alice", password=data["password"])
    assert user is not None
    assert not user.is_staff
    assert not user.is_superuser
    assert Membership.objects.get(user=user, workspace=workspace).role == "operator"


def test_it_prints_the_generated_password_once(workspace):
    output = run("add_member", workspace="acme", username="alice", role="viewer")

    user = User.objects.get(username="alice")
    passwords = [word for word in output.split() if user.check_password(word)]
    assert len(passwords) == 1
    assert output.count(passwords[0]) == 1
    assert "printed once" in output


def test_it_sets_the_given_password(workspace):
    data = run_json("add_member", workspace="acme", username="bob", role="admin", password=STRONG)

    assert data["created_user"] is True
    assert data["password"] is None
    assert authenticate(username="bob", password=STRONG) is not None


def test_it_only_changes_the_role_of_an_existing_user(workspace):
    user = User.objects.create_user(username="carol", password=STRONG)
    accounts.membership_set(workspace=workspace, user=user, role="viewer")

    data = run_json("add_member", workspace="acme", username="carol", role="operator")

    assert data["created_user"] is False
    assert data["password"] is None
    assert Membership.objects.get(user=user, workspace=workspace).role == "operator"
    assert Membership.objects.filter(user=user).count() == 1
    assert authenticate(username="carol", password=STRONG) is not None


def test_it_adds_an_existing_user_to_a_second_workspace(workspace, other_workspace):
    run("add_member", workspace="acme", username="dave", role="viewer", password=STRONG)
    run("add_member", workspace="globex", username="dave", role="admin")

    roles = dict(Membership.objects.filter(user__username="dave").values_list("workspace__slug", "role"))
    assert roles == {"acme": "viewer", "globex": "admin"}


def test_it_changes_an_existing_users_password_when_given(workspace):
    User.objects.create_user(username="erin", password=STRONG)

    run("add_member", workspace="acme", username="erin", role="viewer", password="another-long-passphrase-7")

    assert authenticate(username="erin", password=STRONG) is None
    assert authenticate(username="erin", password="another-long-passphrase-7") is not None


def test_it_rejects_a_weak_password_and_creates_nothing(workspace):
    with pytest.raises(CommandError, match="password"):
        run("add_member", workspace="acme", username="frank", role="viewer", password="123")
    assert not User.objects.filter(username="frank").exists()
    assert not Membership.objects.exists()


def test_it_rejects_an_unknown_role(workspace):
    with pytest.raises(CommandError, match="role"):
        run("add_member", workspace="acme", username="gina", role="owner")
    assert not User.objects.filter(username="gina").exists()


def test_it_rejects_an_invalid_username(workspace):
    with pytest.raises(CommandError, match="username"):
        run("add_member", workspace="acme", username="no spaces please", role="viewer")
    assert not User.objects.exists()


def test_add_member_reports_an_unknown_workspace():
    with pytest.raises(CommandError, match="not found"):
        run("add_member", workspace="nope", username="hank", role="viewer")
    assert not User.objects.exists()


# --- create_api_key -----------------------------------------------------------------------


def test_it_prints_the_key_once_with_a_warning(workspace):
    output = run("create_api_key", workspace="acme", role="agent", name="ci bot")

    key = ApiKey.objects.get(workspace=workspace)
    raw = next(word for word in output.split() if word.startswith(key.prefix) and len(word) > 20)
    assert output.count(raw) == 1
    assert key.secret_hash == accounts.hash_key(raw)
    assert "cannot be shown again" in output


def test_it_prints_the_key_as_json_with_exactly_four_fields(workspace):
    data = run_json("create_api_key", workspace="acme", role="operator", name="console")

    assert list(data) == ["key", "prefix", "role", "workspace"]
    key = ApiKey.objects.get(workspace=workspace)
    assert data["prefix"] == key.prefix
    assert data["key"].startswith(key.prefix)
    assert data["role"] == "operator"
    assert data["workspace"] == "acme"
    assert key.name == "console"
    assert key.revoked_at is None


def test_it_stores_only_the_hash_of_the_key(workspace):
    data = run_json("create_api_key", workspace="acme", role="admin", name="ops")

    key = ApiKey.objects.get(workspace=workspace)
    stored = " ".join(str(value) for value in model_to_dict(key).values())
    stored += f" {key.secret_hash} {key.prefix} {key.created_by}"
    assert data["key"] not in stored
    assert key.secret_hash == accounts.hash_key(data["key"])


def test_it_rejects_an_unknown_key_role(workspace):
    with pytest.raises(CommandError, match="role"):
        run("create_api_key", workspace="acme", role="owner", name="x")
    assert not ApiKey.objects.exists()


def test_a_viewer_key_reads_and_cannot_write(workspace, client):
    raw = run_json("create_api_key", workspace="acme", role="viewer", name="dashboard", json=True)["key"]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    assert client.get("/api/v1/stats", **auth).status_code == 200
    refused = client.post("/api/v1/entries", {"content": "x"}, content_type="application/json", **auth)
    assert refused.status_code == 403 and "needs the agent role" in refused.json()["detail"]
    assert not workspace.entries.exists()


def test_it_rejects_an_empty_key_name(workspace):
    with pytest.raises(CommandError, match="name"):
        run("create_api_key", workspace="acme", role="agent", name="  ")
    assert not ApiKey.objects.exists()


def test_create_api_key_reports_an_unknown_workspace():
    with pytest.raises(CommandError, match="not found"):
        run("create_api_key", workspace="nope", role="agent", name="x")


# --- revoke_api_key -----------------------------------------------------------------------


def test_revoking_sets_revoked_at(workspace):
    key, _ = accounts.api_key_create(workspace=workspace, name="bot", role="agent")

    data = run_json("revoke_api_key", key.prefix, workspace="acme")

    key.refresh_from_db()
    assert key.revoked_at is not None
    assert data["prefix"] == key.prefix
    assert data["workspace"] == "acme"
    assert data["revoked_at"] == key.revoked_at.isoformat()


def test_revoking_twice_keeps_the_first_time(workspace):
    key, _ = accounts.api_key_create(workspace=workspace, name="bot", role="agent")
    run("revoke_api_key", key.prefix, workspace="acme")
    key.refresh_from_db()
    first = key.revoked_at

    output = run("revoke_api_key", key.prefix, workspace="acme")

    key.refresh_from_db()
    assert key.revoked_at == first
    assert "Revoked" in output


def test_another_workspaces_key_prefix_is_not_found(workspace, other_workspace):
    key, _ = accounts.api_key_create(workspace=other_workspace, name="theirs", role="admin")

    with pytest.raises(CommandError, match="not found"):
        run("revoke_api_key", key.prefix, workspace="acme")

    key.refresh_from_db()
    assert key.revoked_at is None


def test_an_unknown_prefix_is_not_found(workspace):
    with pytest.raises(CommandError, match="not found"):
        run("revoke_api_key", "msk_nothing", workspace="acme")
