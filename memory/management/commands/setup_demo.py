"""Create the demo workspace, its sample memories and a local operator login (idempotent).

`make run` calls this on every start: the first time it prints a generated password once;
afterwards it only says the demo is already there.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from memory import journal, services
from memory.models import Role, Workspace

DEMO_SLUG = "demo"


class Command(BaseCommand):
    help = "Create the demo workspace with the bundled flask journal sample and an operator login."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="operator")

    def handle(self, *args: object, **options: object) -> None:
        username = str(options["username"])
        with transaction.atomic():
            workspace = Workspace.objects.filter(slug=DEMO_SLUG).first()
            if workspace is None:
                workspace = services.workspace_create(slug=DEMO_SLUG, name="Demo workspace")
                counts = journal.import_journal(workspace=workspace, path=journal.SAMPLE_PATH)
                self.stdout.write(
                    f"Created workspace '{DEMO_SLUG}' with {counts.created} memories "
                    f"from the bundled flask journal sample."
                )
            User = get_user_model()
            user = User.objects.filter(username=username).first()
            password = None
            if user is None:
                password = secrets.token_urlsafe(12)
                # The local owner of an embedded install: may use the admin and every console action.
                user = User.objects.create_superuser(username=username, email="", password=password)
            services.membership_set(workspace=workspace, user=user, role=Role.ADMIN)
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
