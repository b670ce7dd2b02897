"""Create the demo workspace, its sample memories and a local operator login (idempotent).

`make run` calls this on every start: the first time it prints a generated password once;
afterwards it only says the demo is already there. The demo proposes: its first
maintenance run archives and tombstones nothing, and a newcomer finds its proposals waiting for
approval on the review page instead of a workspace already thinned out.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from memory import accounts, journal_import
from memory.models import Entry, Workspace
from memory.models.choices import Role
from memory.policy import PROPOSE
from memory.policy_model import MaintenancePolicy
from memory.scoring_db import refresh_scores

DEMO_SLUG = "demo"


def _make_it_recent(workspace: Workspace) -> None:
    """The sample is a year of 2016/17 commits: moved as a block so its newest memory is a day
    old, it looks like a workspace in use today. The demo's policy decays four times slower than
    the default (cold after about 320 days instead of 80), so the first run proposes a share of
    the memories an operator can approve at once, below the circuit breaker."""
    now = timezone.now()
    newest = Entry.objects.filter(workspace=workspace).aggregate(newest=Max("created_at"))["newest"]
    if newest is None:
        return
    shift = now - timedelta(days=1) - newest
    Entry.objects.filter(workspace=workspace).update(
        created_at=F("created_at") + shift,
        updated_at=F("created_at") + shift,
        status_changed_at=F("created_at") + shift,
    )
    MaintenancePolicy.write(workspace, {"decay_lambda": 0.005})
    refresh_scores(workspace, now=now)


class Command(BaseCommand):
    help = "Create the demo workspace with the bundled flask journal sample and an operator login."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="operator")

    def handle(self, *args: object, **options: object) -> None:
        username = str(options["username"])
        with transaction.atomic():
            workspace = Workspace.objects.filter(slug=DEMO_SLUG).first()
            if workspace is None:
                workspace = accounts.workspace_create(
                    slug=DEMO_SLUG, name="Demo workspace", review_mode=PROPOSE
                )
                counts = journal_import.import_journal(workspace=workspace, path=journal_import.SAMPLE_PATH)
                _make_it_recent(workspace)
                self.stdout.write(
                    f"Created workspace '{DEMO_SLUG}' with {counts.created} memories "
                    "from the bundled flask journal sample. It proposes: maintenance archives and "
                    "tombstones nothing until you approve it (Review → Pending approval, or "
                    f"manage.py proposals --workspace {DEMO_SLUG})."
                )
            User = get_user_model()
            user = User.objects.filter(username=username).first()
            password = None
            if user is None:
                password = secrets.token_urlsafe(12)
                # The local owner of an embedded install: may use the admin and every console action.
                user = User.objects.create_superuser(username=username, email="", password=password)
            accounts.membership_set(workspace=workspace, user=user, role=Role.ADMIN)
        if password:
            self.stdout.write(
                self.style.SUCCESS(
                    f"\n  Log in at http://127.0.0.1:{settings.PORT}/console/ as '{username}'"
                    f" with password: {password}\n"
                    "  (printed once; change it with: .venv/bin/python manage.py changepassword "
                    f"{username})\n"
                )
            )
        else:
            self.stdout.write(
                f"Demo ready. Log in as '{username}' (password printed on the first run; "
                f"reset it with: .venv/bin/python manage.py changepassword {username})."
            )
