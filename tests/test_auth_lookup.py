"""The bearer-key lookup (memory.auth._live_key): one query returns the key, its workspace and
the workspace's policy as it is now. Policy values are converted once per distinct row, so a
change to the row must show on the very next lookup."""

import pytest

from memory import accounts, auth
from memory.policy import PolicyValues
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db


def lookup(raw):
    return auth._live_key(accounts.hash_key(raw))


def test_the_lookup_returns_the_key_its_workspace_and_the_policy_as_stored(workspace):
    key, raw = accounts.api_key_create(workspace=workspace, name="agent", role="agent")
    found = lookup(raw)
    assert found.pk == key.pk and found.role == "agent"
    assert found.workspace.pk == workspace.pk and found.workspace.slug == workspace.slug
    assert found.workspace.policy_at_auth == MaintenancePolicy.for_workspace(workspace)


def test_a_policy_change_shows_on_the_next_lookup(workspace, other_workspace):
    _key, raw = accounts.api_key_create(workspace=workspace, name="agent", role="agent")
    _other, other_raw = accounts.api_key_create(workspace=other_workspace, name="agent", role="agent")
    before = lookup(raw).workspace.policy_at_auth

    policy = MaintenancePolicy.objects.get(workspace=workspace)
    policy.decay_lambda = before.decay_lambda * 2
    policy.exclude_tags = ["keep", "pinned"]
    policy.save()
    after = lookup(raw).workspace.policy_at_auth
    assert after.decay_lambda == pytest.approx(before.decay_lambda * 2)
    assert after.exclude_tags == ("keep", "pinned")
    assert after == MaintenancePolicy.for_workspace(workspace)
    # Another workspace's policy is its own, whatever was converted before.
    assert lookup(other_raw).workspace.policy_at_auth == MaintenancePolicy.for_workspace(other_workspace)

    policy.exclude_tags = []
    policy.save()
    assert lookup(raw).workspace.policy_at_auth.exclude_tags == ()


def test_a_workspace_without_a_policy_row_has_the_defaults(workspace):
    _key, raw = accounts.api_key_create(workspace=workspace, name="agent", role="agent")
    MaintenancePolicy.objects.filter(workspace=workspace).delete()
    assert lookup(raw).workspace.policy_at_auth == PolicyValues()


def test_a_revoked_or_unknown_key_is_not_found(workspace):
    key, raw = accounts.api_key_create(workspace=workspace, name="agent", role="agent")
    accounts.api_key_revoke(workspace=workspace, key_id=key.pk)
    assert lookup(raw) is None
    assert lookup("not-a-key") is None
