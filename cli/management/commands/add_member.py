"""``manage.py add_member --workspace SLUG --username U --role R [--password P] [--json]``."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser
from django.db import transaction

from cli.management.commands._base import WorkspaceCommand, service_errors
from memory import accounts
from memory.models.choices import Role


class Command(WorkspaceCommand):
    help = (
        "Give a user a role in a workspace, creating the user if missing. A new user without "
        "--password gets a generated one, printed once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--username", required=True)
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument(
            "--password",
            default=None,
            help="Set this password (also for an existing user). Checked by the password validators.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = self.get_workspace(options["workspace"])
        user_model = get_user_model()
        username = self._clean_username(user_model, options["username"])
        password = options["password"]

        if password is not None:
            self._check_password(password, user_model(**{user_model.USERNAME_FIELD: username}))
        with transaction.atomic():
            user = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).first()
            created_user = user is None
            generated = secrets.token_urlsafe(12) if created_user and password is None else None
            if user is None:
                # Members use the console, not the admin: a new user is not staff.
                user = user_model(**{user_model.USERNAME_FIELD: username})
            if password is not None or generated is not None:
                user.set_password(password if password is not None else generated)
                user.save()
            with service_errors():
                membership = accounts.membership_set(workspace=workspace, user=user, role=options["role"])

        if options["json"]:
            self.emit_json(
                {
                    "username": username,
                    "workspace": workspace.slug,
                    "role": membership.role,
                    "created_user": created_user,
                    "password": generated,
                }
            )
            return
        verb = "Created user" if created_user else "User"
        self.stdout.write(
            self.style.SUCCESS(f"{verb} {username!r} is now {membership.role} of {workspace.slug!r}.")
        )
        if generated is not None:
            self.stdout.write(f"Password: {generated}")
            self.stdout.write(self.style.WARNING("This password is printed once; store it now."))

    def _clean_username(self, user_model: Any, raw: str) -> str:
        username = raw.strip()
        field = user_model._meta.get_field(user_model.USERNAME_FIELD)
        try:
            field.clean(username, None)
        except ValidationError as exc:
            raise CommandError("--username rejected: " + " ".join(exc.messages)) from exc
        return username

    def _check_password(self, password: str, user: Any) -> None:
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("--password rejected: " + " ".join(exc.messages)) from exc
