"""The django-q2 schedules of Memory Steward, declared once in code.

``sync_schedules()`` upserts them by name into django-q2's ``Schedule`` table. It runs after
every ``migrate`` (a ``post_migrate`` handler, see ``maintenance.signals``) and from
``manage.py sync_schedules``; running it twice changes nothing the second time.

Every schedule we own has a name starting with ``maintenance.``; a row with that prefix that is
no longer declared here is removed, so renaming or dropping a schedule in code cannot leave a
ghost behind in the database. Rows with other names (an operator's own schedules made in the
admin) are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils import timezone
from django_q.models import Schedule

NAME_PREFIX = "maintenance."


@dataclass(frozen=True)
class ScheduleSpec:
    name: str  # unique key of the upsert; must start with NAME_PREFIX
    func: str  # dotted path of the task
    minutes: int  # period of a MINUTES schedule
    schedule_type: str = Schedule.MINUTES
    repeats: int = -1  # forever

    def fields(self) -> dict[str, Any]:
        """The columns this declaration owns. A declared schedule takes no arguments, hook or
        cron: a hand edit in the admin adding some is undone by the next sync."""
        return {
            "func": self.func,
            "schedule_type": self.schedule_type,
            "minutes": self.minutes,
            "repeats": self.repeats,
            "args": None,
            "kwargs": None,
            "hook": None,
            "cron": None,
        }

    def differs_from(self, row: Schedule) -> list[str]:
        """Names of the columns of ``row`` that do not match this declaration ("" counts as
        None: the admin saves empty text fields as "")."""
        return [
            name
            for name, value in self.fields().items()
            if (getattr(row, name) if getattr(row, name) != "" else None) != value
        ]


SCHEDULES: tuple[ScheduleSpec, ...] = (
    # Decides, per workspace and from the run history in the database, which maintenance is due
    # and enqueues it. Cheap when nothing is due, so it can run often; the policy intervals
    # (decay_interval_seconds >= 60 s, maintenance_interval_hours >= 1 h) decide the real pace.
    ScheduleSpec(
        name="maintenance.dispatch",
        func="maintenance.tasks.dispatch_due_maintenance",
        minutes=2,
    ),
    # Makes the hygiene verdicts that are missing (new or edited entries, new residue patterns)
    # off the request path, at most HYGIENE_BUDGET_SECONDS per call (maintenance.tasks).
    ScheduleSpec(
        name="maintenance.hygiene_verdicts",
        func="maintenance.tasks.assess_hygiene_verdicts",
        minutes=5,
    ),
)


def sync_schedules(
    schedules: Sequence[ScheduleSpec] = SCHEDULES, *, using: str = DEFAULT_DB_ALIAS
) -> dict[str, list[str]]:
    """Make django-q2's schedule table match ``schedules``; return what changed, by name.

    A new schedule is due at once (``next_run`` = now), so a fresh installation gets its first
    dispatch as soon as the cluster starts. An updated one keeps its ``next_run``: re-syncing
    must not shift the cadence. Duplicate rows of one name (two processes migrating at once)
    are collapsed to the oldest one.
    """
    result: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": [], "removed": []}
    declared = {spec.name: spec for spec in schedules}
    for name in declared:
        if not name.startswith(NAME_PREFIX):
            raise ValueError(f"schedule {name!r} must be named {NAME_PREFIX}…")
    if len(declared) != len(schedules):
        raise ValueError("schedule names must be unique")

    with transaction.atomic(using=using):
        rows = list(
            Schedule.objects.using(using)
            .select_for_update()
            .filter(name__startswith=NAME_PREFIX)
            .order_by("pk")
        )
        seen: set[str] = set()
        for row in rows:
            name = row.name or ""
            spec = declared.get(name)
            if spec is None or name in seen:
                row.delete(using=using)
                result["removed"].append(name)
                continue
            seen.add(name)
            changed = spec.differs_from(row)
            if row.next_run is None:  # the scheduler never picks up a row without next_run
                row.next_run = timezone.now()
                changed.append("next_run")
            if not changed:
                result["unchanged"].append(name)
                continue
            for field, value in spec.fields().items():
                setattr(row, field, value)
            row.save(using=using, update_fields=changed)
            result["updated"].append(name)
        for name, spec in declared.items():
            if name in seen:
                continue
            Schedule.objects.using(using).create(
                name=name,
                next_run=timezone.now(),
                **spec.fields(),
            )
            result["created"].append(name)
    return result
