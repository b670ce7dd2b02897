"""The demo workspace of `make run`: loaded once, recent enough that maintenance does work, and
in propose mode, so its first run's changes wait for an operator's approval."""

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from maintenance import proposals
from maintenance.models import Proposal
from maintenance.run_start import run_maintenance
from memory.models import Entry, LifecycleEvent, Membership, Workspace
from memory.policy_model import MaintenancePolicy

pytestmark = pytest.mark.django_db


def test_the_demo_is_created_once_with_an_operator_who_can_log_in(settings, tmp_path):
    settings.BACKUP_DIR = tmp_path
    first, second = StringIO(), StringIO()
    call_command("setup_demo", stdout=first)
    call_command("setup_demo", stdout=second)
    password = first.getvalue().split("with password: ")[1].split()[0]
    user = get_user_model().objects.get(username="operator")
    assert user.check_password(password)
    assert password not in second.getvalue()
    workspace = Workspace.objects.get(slug="demo")
    assert Entry.objects.filter(workspace=workspace).count() == 300
    assert Membership.objects.get(user=user, workspace=workspace).role == "admin"


def test_the_demos_first_run_proposes_and_archives_or_tombstones_nothing(settings, tmp_path):
    settings.BACKUP_DIR = tmp_path
    out = StringIO()
    call_command("setup_demo", stdout=out)
    assert "manage.py proposals --workspace demo" in out.getvalue()
    workspace = Workspace.objects.get(slug="demo")
    assert MaintenancePolicy.for_workspace(workspace).review_mode == "propose"

    result = run_maintenance(workspace=workspace)

    # What a newcomer sees first: changes waiting for approval, not a thinned-out workspace.
    assert result["status"] == "proposed"
    assert result["counts"]["evicted"] > 0 and result["counts"]["low_quality_archived"] > 0
    assert result["affected"]["archived"] == result["affected"]["tombstoned"] == []
    assert not Entry.objects.filter(workspace=workspace, status__in=["archived", "tombstoned"]).exists()
    assert not LifecycleEvent.objects.filter(
        workspace=workspace, to_status__in=["archived", "tombstoned"]
    ).exists()
    assert proposals.open_count(workspace) == result["proposed"]["archive"] + result["proposed"]["tombstone"]
    assert {g["reason"] for g in proposals.counts_by_reason(workspace)} >= {"evicted", "low_quality_archived"}
    # Stale marking still applies in propose mode: the demo shows real work.
    assert result["counts"]["stale_marked"] > 0
    # Approving everything at once stays below the circuit breaker: no --force for a newcomer.
    assert not result["breaker"]["would_trip"]
    approved = proposals.approve(workspace, all=True, actor="user:operator")
    assert len(approved["applied"]) == Proposal.objects.filter(status="approved").count() > 0
    assert (
        Entry.objects.filter(workspace=workspace, status="tombstoned").count() == result["counts"]["evicted"]
    )
