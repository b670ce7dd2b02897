"""The demo workspace of `make run`: loaded once, recent enough that maintenance does work."""

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from maintenance.runs import run_maintenance
from memory.models import Entry, Membership, Workspace

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


def test_the_demo_gets_a_real_first_run_not_a_blocked_one(settings, tmp_path):
    settings.BACKUP_DIR = tmp_path
    call_command("setup_demo", stdout=StringIO())
    result = run_maintenance(workspace=Workspace.objects.get(slug="demo"), dry_run=True)
    assert result["status"] == "succeeded"
    assert result["counts"]["evicted"] > 0
    assert result["counts"]["stale_marked"] > 0
