"""The Django admin: every model of memory and maintenance lists, searches and filters; the Entry
bulk actions go through the services (events, tombstones) and skip what they may not change."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from maintenance.models import Backup, Dispute, MaintenanceLease, MaintenanceRun, Proposal, RunDaySummary
from memory import accounts, entry_changes, entry_signals, new_entries, relationships
from memory.models import ApiKey, Entry, LifecycleEvent, Tombstone, Workspace

pytestmark = pytest.mark.django_db

User = get_user_model()

# LiveMessage is the transport of live updates in embedded mode (a short-lived outbox), not
# data an operator manages; nor are the API's stored idempotent answers (24 h), a run's plan
# scores and statuses (temporary tables of one run), the stored hygiene verdicts (a cache of the text
# detectors, recomputed when text or patterns change) or the kept hygiene rank (derived from
# entries and verdicts, with its marks and state).
NOT_DOMAIN = {
    "memory.LiveMessage",
    "memory.IdempotencyKey",
    "maintenance.PlanScore",
    "maintenance.PlanStatus",
    "maintenance.HygieneAssessment",
    "maintenance.HygieneRank",
    "maintenance.HygieneRankDirty",
    "maintenance.HygieneRankState",
    "memory.EntryScore",  # derived scores, shown read-only on the entry's own admin page
}
DOMAIN_MODELS = sorted(
    (
        model
        for model in apps.get_models()
        if model._meta.app_label in ("memory", "maintenance") and model._meta.label not in NOT_DOMAIN
    ),
    key=lambda model: model._meta.label,
)


def changelist_url(model: Any) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def entry_url() -> str:
    return changelist_url(Entry)


def make(workspace: Workspace, content: str, **fields: Any) -> Entry:
    return new_entries.entry_create(workspace=workspace, content=content, **fields)


@pytest.fixture
def superuser(client):
    user = User.objects.create_superuser(username="root", email="root@example.com", password=None)
    client.force_login(user)
    return user


def populate(ws: Workspace) -> None:
    """At least one row of every model of memory and maintenance in ``ws``."""
    first = make(ws, f"{ws.slug} uses postgres", title="db", tags=["infra"], anchors=[{"path": "db.py"}])
    second = make(ws, f"{ws.slug} deploys on fridays", tags=["ops"], anchors=[{"path": "ci.yml"}])
    relationships.relationship_create(workspace=ws, from_id=second.pk, to_id=first.pk)
    entry_signals.entry_record_access(workspace=ws, entry_id=first.pk, actor="agent-1")
    gone = make(ws, f"{ws.slug} scratch note")
    entry_changes.entry_tombstone(workspace=ws, entry_id=gone.pk, actor="user:root")
    accounts.api_key_create(workspace=ws, name=f"{ws.slug} bot", role="agent")
    user = User.objects.create_user(username=f"{ws.slug}-member")
    accounts.membership_set(workspace=ws, user=user, role="viewer")
    run = MaintenanceRun.objects.create(workspace=ws, kind="full", trigger="cli")
    MaintenanceLease.objects.create(workspace=ws, holder="worker-1", run=run)
    Dispute.objects.create(workspace=ws, entry_a=first, entry_b=second, detected_by="sweep")
    Backup.objects.create(workspace=ws, file_name=f"{ws.slug}.jsonl.gz", reason="manual", sha256="0" * 64)
    Proposal.objects.create(
        workspace=ws, run=run, entry=second, entry_ref=second.pk, action="archive", reason="archived"
    )
    for day in (1, 2):
        RunDaySummary.objects.create(
            workspace=ws, day=date(2026, 11, day), kind="decay", status="succeeded", runs=144
        )


@pytest.fixture
def populated(workspace, other_workspace):
    """At least two rows of every model, spread over two workspaces."""
    populate(workspace)
    populate(other_workspace)


def test_every_domain_model_is_registered():
    missing = [model._meta.label for model in DOMAIN_MODELS if model not in admin.site._registry]
    assert missing == []


@pytest.mark.parametrize("model", DOMAIN_MODELS, ids=lambda model: model._meta.label)
def test_each_changelist_lists_searches_and_filters(client, superuser, populated, model):
    url = changelist_url(model)

    response = client.get(url)
    assert response.status_code == 200
    assert response.context["cl"].result_count >= 2

    searched = client.get(url, {"q": "acme"})
    assert searched.status_code == 200

    cl = response.context["cl"]
    if cl.has_filters:
        spec = cl.filter_specs[0]
        # The first choice is "All"; the next one is a real filter value.
        choice = list(spec.choices(cl))[1]
        filtered = client.get(url + choice["query_string"])
        # An unknown filter parameter answers a redirect to ?e=1, not 200.
        assert filtered.status_code == 200, choice["query_string"]


def test_the_entry_changelist_query_count_does_not_grow_with_entries(client, superuser, workspace):
    for i in range(5):
        make(workspace, f"note {i}")
    with CaptureQueriesContext(connection) as few:
        assert client.get(entry_url()).status_code == 200

    for i in range(5, 25):
        make(workspace, f"note {i}", title=f"title {i}")
    with CaptureQueriesContext(connection) as many:
        response = client.get(entry_url())
    assert response.context["cl"].result_count == 25

    assert len(many) == len(few)


@pytest.mark.parametrize("model", DOMAIN_MODELS, ids=lambda model: model._meta.label)
def test_no_changelist_makes_a_query_per_row(client, superuser, populated, model):
    url = changelist_url(model)
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200

    for i in range(3):
        populate(accounts.workspace_create(slug=f"extra-{i}"))
    with CaptureQueriesContext(connection) as many:
        response = client.get(url)
    assert response.context["cl"].result_count >= 5

    assert len(many) == len(few)


def post_action(client: Any, action: str, entries: list[Any], url: str | None = None) -> Any:
    return client.post(
        url or entry_url(),
        {"action": action, "_selected_action": [e.pk for e in entries]},
        follow=True,
    )


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_archive_selected_archives_through_the_service(client, superuser, workspace):
    a = make(workspace, "one")
    b = make(workspace, "two")

    response = post_action(client, "archive_selected", [a, b])

    assert response.status_code == 200
    assert set(Entry.objects.filter(pk__in=[a.pk, b.pk]).values_list("status", flat=True)) == {"archived"}
    events = LifecycleEvent.objects.filter(entry_ref__in=[a.pk, b.pk], to_status="archived")
    assert events.count() == 2
    assert {(e.reason, e.actor, e.automatic) for e in events} == {("manual", "user:root", False)}
    assert any("Archived entries: 2" in m for m in messages_of(response))


def test_archive_skips_a_tombstoned_entry_and_archives_the_rest(client, superuser, workspace):
    live = make(workspace, "live")
    gone = make(workspace, "gone")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)

    response = post_action(client, "archive_selected", [live, gone])

    assert response.status_code == 200
    live.refresh_from_db()
    gone.refresh_from_db()
    assert live.status == "archived"
    assert gone.status == "tombstoned"
    assert not LifecycleEvent.objects.filter(entry_ref=gone.pk, to_status="archived").exists()
    assert any(f"Skipped 1 — #{gone.pk}" in m for m in messages_of(response))


def test_actions_work_on_each_entry_in_its_own_workspace(client, superuser, workspace, other_workspace):
    ours = make(workspace, "ours")
    theirs = make(other_workspace, "theirs")

    post_action(client, "archive_selected", [ours, theirs])

    events = dict(
        LifecycleEvent.objects.filter(to_status="archived").values_list("entry_ref", "workspace__slug")
    )
    assert events == {ours.pk: "acme", theirs.pk: "globex"}


def test_restore_selected_restores_and_skips_an_active_entry(client, superuser, workspace):
    archived = make(workspace, "archived")
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=archived.pk, status="archived", reason="manual"
    )
    tombstoned = make(workspace, "tombstoned")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=tombstoned.pk)
    active = make(workspace, "active")

    response = post_action(client, "restore_selected", [archived, tombstoned, active])

    statuses = dict(
        Entry.objects.filter(pk__in=[archived.pk, tombstoned.pk, active.pk]).values_list("pk", "status")
    )
    assert statuses == {archived.pk: "active", tombstoned.pk: "active", active.pk: "active"}
    assert Tombstone.objects.get(entry=tombstoned).restored_at is not None
    assert LifecycleEvent.objects.filter(reason="restore", actor="user:root").count() == 2
    assert any(f"Skipped 1 — #{active.pk}" in m for m in messages_of(response))


def test_pin_and_unpin_selected(client, superuser, workspace):
    a = make(workspace, "one")
    b = make(workspace, "two")

    post_action(client, "pin_selected", [a, b])
    assert set(Entry.objects.filter(pk__in=[a.pk, b.pk]).values_list("pinned", flat=True)) == {True}

    post_action(client, "unpin_selected", [a])
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.pinned, b.pinned) == (False, True)


def test_tombstone_selected_records_a_tombstone_with_a_future_purge(client, superuser, workspace):
    entry = make(workspace, "to remove")

    response = post_action(client, "tombstone_selected", [entry])

    assert response.status_code == 200
    entry.refresh_from_db()
    assert entry.status == "tombstoned"
    tombstone = Tombstone.objects.get(entry=entry)
    assert tombstone.reason == "manual"
    assert tombstone.actor == "user:root"
    assert tombstone.purge_after > timezone.now()
    event = LifecycleEvent.objects.get(entry_ref=entry.pk, to_status="tombstoned")
    assert event.reason == "manual"


def test_tombstone_skips_old_versions_and_already_tombstoned_entries(client, superuser, workspace):
    old = make(workspace, "first words")
    new = entry_changes.entry_update(workspace=workspace, entry_id=old.pk, content="second words").entry
    gone = make(workspace, "gone")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)

    response = post_action(client, "tombstone_selected", [old, gone])

    assert response.status_code == 200
    new.refresh_from_db()
    assert new.status == "active"
    assert Tombstone.objects.filter(entry=gone).count() == 1
    assert not Tombstone.objects.filter(entry__in=[old, new]).exists()
    assert any("Skipped 2" in m for m in messages_of(response))


def test_the_entry_admin_offers_no_bulk_hard_delete(client, superuser, workspace):
    make(workspace, "one")

    response = client.get(entry_url())

    actions = [value for value, _label in response.context["action_form"].fields["action"].choices]
    assert "delete_selected" not in actions
    assert "tombstone_selected" in actions


def test_revoke_selected_keys(client, superuser, workspace, other_workspace):
    ours, _ = accounts.api_key_create(workspace=workspace, name="ours", role="agent")
    theirs, _ = accounts.api_key_create(workspace=other_workspace, name="theirs", role="admin")
    accounts.api_key_create(workspace=workspace, name="kept", role="agent")

    response = post_action(client, "revoke_selected", [ours, theirs], url=changelist_url(ApiKey))

    assert response.status_code == 200
    revoked = dict(ApiKey.objects.values_list("name", "revoked_at"))
    assert revoked["ours"] is not None
    assert revoked["theirs"] is not None
    assert revoked["kept"] is None


def test_api_keys_cannot_be_added_in_the_admin(client, superuser):
    url = reverse("admin:memory_apikey_add")

    assert client.get(url).status_code == 403


def test_the_api_key_page_does_not_show_the_hash(client, superuser, workspace):
    key, _ = accounts.api_key_create(workspace=workspace, name="bot", role="agent")

    response = client.get(reverse("admin:memory_apikey_change", args=[key.pk]))

    assert response.status_code == 200
    assert key.secret_hash not in response.content.decode()


def test_a_non_staff_member_is_sent_to_the_login_page(client, workspace):
    user = User.objects.create_user(username="member")
    accounts.membership_set(workspace=workspace, user=user, role="admin")
    client.force_login(user)

    for url in (reverse("admin:index"), entry_url()):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))


def test_a_non_staff_member_cannot_run_an_action(client, workspace):
    user = User.objects.create_user(username="member")
    client.force_login(user)
    entry = make(workspace, "keep me")

    response = client.post(entry_url(), {"action": "tombstone_selected", "_selected_action": [entry.pk]})

    assert response.status_code == 302
    entry.refresh_from_db()
    assert entry.status == "active"
