"""Seeds the database of the browser tests' server (run as a script in its own process, with
``DATABASE_URL`` naming a migrated SQLite file): one operator account, member of one
workspace per scenario, so the tests never see each other's changes. Prints JSON: the ids the
tests need.

    python tests/browser/seed.py --password P
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

USERNAME = "steward"
ADMIN_USERNAME = "admin"  # a superuser with the same password: the admin pages' tests
OLD_NOTES = [
    "Lunch menu of the offsite in spring: pasta, salad and fruit",
    "The coffee machine on the third floor was descaled on a Monday",
    "Somebody asked whether the wiki has a dark mode; it does not",
    "Parking permits for visitors are handed out at the reception desk",
    "The quarterly all-hands moved from Thursday to Friday afternoon",
]
KEEPERS = [
    "Connection pool exhaustion under load was fixed by lowering the idle timeout to thirty seconds",
    "Deploys need the staging key in the vault before the pipeline starts",
    "The search index is rebuilt nightly; a manual rebuild takes about four minutes",
]
JUNK = ["wip...", "todo: (fix the", "tmp note..."]


def seed(password: str) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from maintenance.models import Dispute, MaintenancePolicy
    from maintenance.runs import run_maintenance
    from memory import services
    from memory.models import Entry

    now = timezone.now()
    user = get_user_model().objects.create_user(USERNAME, password=password)
    get_user_model().objects.create_superuser(ADMIN_USERNAME, password=password)

    def workspace(slug: str, name: str, review_mode: str = "apply") -> Any:
        # Apply mode unless a scenario is about approval: most scenarios review what a run did.
        ws = services.workspace_create(slug=slug, name=name, review_mode=review_mode)
        services.membership_set(workspace=ws, user=user, role="operator")
        for text in KEEPERS:
            services.entry_create(workspace=ws, content=f"{text} ({slug})", source="operator")
        return ws

    def old_notes(ws: Any) -> list[int]:
        return [
            services.entry_create(workspace=ws, content=text, created_at=now - timedelta(days=400 + i)).pk
            for i, text in enumerate(OLD_NOTES)
        ]

    def archives_old_notes(ws: Any) -> None:
        policy = MaintenancePolicy.objects.get(workspace=ws)
        policy.archive_older_than_days = 30
        policy.prune_older_than_days = 3650
        policy.save()

    out: dict[str, Any] = {"username": USERNAME, "admin": ADMIN_USERNAME}

    workspace("live", "Live updates")
    queue = workspace("queue", "Live queue")
    archives_old_notes(queue)
    old_notes(queue)
    dry = workspace("dryrun", "Dry run")
    old_notes(dry)
    # "Run now" queues a run; its page follows the worker doing it.
    run_now = workspace("runnow", "Run now")
    archives_old_notes(run_now)
    old_notes(run_now)

    hyg = workspace("hygiene", "Hygiene")
    out["hygiene"] = [
        services.entry_create(workspace=hyg, content=text, created_at=now - timedelta(days=40)).pk
        for text in JUNK
    ]

    pager = workspace("pager", "Pager")  # two pages of hygiene candidates (25 a page)
    for i in range(30):
        services.entry_create(workspace=pager, content=f"wip {i}...", created_at=now - timedelta(days=40))

    rev = workspace("revert", "Revert")
    archives_old_notes(rev)
    out["revert_entries"] = old_notes(rev)
    out["revert_run"] = run_maintenance(workspace=rev, trigger="cli")

    tomb = workspace("tombstone", "Tombstone")
    gone = services.entry_create(workspace=tomb, content="The old VPN endpoint is vpn1.example.test")
    services.entry_tombstone(workspace=tomb, entry_id=gone.pk, actor=f"user:{USERNAME}")
    out["tombstoned"] = gone.pk

    dis = workspace("dispute", "Dispute")
    a = services.entry_create(workspace=dis, content="Always use tabs for indentation", entry_type="rule")
    b = services.entry_create(workspace=dis, content="Never use tabs for indentation", entry_type="rule")
    dispute = Dispute.objects.create(
        workspace=dis, entry_a_id=a.pk, entry_b_id=b.pk, detected_by="sweep", similarity=0.8
    )
    out["dispute"] = {"id": dispute.pk, "a": a.pk, "b": b.pk}

    # Propose mode: a run proposes to tombstone the five old notes (decay) and to archive a
    # stale runbook; nothing is changed until an operator approves.
    appr = workspace("approve", "Approve", review_mode="propose")
    out["approve_cold"] = old_notes(appr)
    runbook = services.entry_create(
        workspace=appr,
        title="Runbook: rotate the staging certificates",
        content="Rotate the staging certificates with the vault CLI, then restart the ingress pods.",
        created_at=now - timedelta(days=500),
        now=now - timedelta(days=500),
    )
    Entry.objects.filter(pk=runbook.pk).update(status="stale", status_changed_at=now - timedelta(days=200))
    out["approve_stale"] = runbook.pk
    out["approve_run"] = run_maintenance(workspace=appr, trigger="cli")

    # Apply mode: a run tombstoned the old notes; the browser restores one and runs again.
    held = workspace("holds", "Holds")
    out["holds_entries"] = old_notes(held)
    out["holds_run"] = run_maintenance(workspace=held, trigger="cli")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--password", required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    print(json.dumps(seed(args.password), default=str))


if __name__ == "__main__":
    main()
