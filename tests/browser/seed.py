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

# The layout workspace: every table of the console with values as long as real ones get (long
# titles, many tags, a project path, code anchors with deep paths and full commit hashes, API
# keys named by purpose), for the layout tests to measure against the card.
LONG_NOTES = [
    (
        "Nightly reconciliation batch exhausts the Postgres connection pool when the ledger export overlaps",
        [
            "postgresql",
            "connection-pooling",
            "incident-2024-11-07-ledger-export-overlap",
            "payments-platform",
            "on-call-runbook",
        ],
    ),
    (
        "Staging certificates are rotated with the vault CLI; then the ingress controller pods restart",
        ["certificates", "kubernetes-ingress", "vault", "staging-environment"],
    ),
    (
        "The search index rebuild (elasticsearch-reindex-nightly) takes about four minutes and blocks writes",
        ["search", "elasticsearch", "maintenance-window", "write-availability"],
    ),
    (
        "Feature flags for the checkout redesign live in LaunchDarkly under payments/checkout-v2-rollout",
        ["feature-flags", "checkout-redesign", "launchdarkly"],
    ),
]
LONG_OLD_NOTES = [
    "Quarterly capacity review notes: the reporting replica ran at 85% CPU for most of the month-end close",
    "Retired: the legacy SOAP endpoint https://legacy-billing.internal.example.test/ws/InvoiceService?wsdl",
    "Temporary workaround for the flaky integration test test_reconcile_ledger_snapshot_across_timezones",
]
LONG_PROPOSED = [
    "Old sprint retrospective: the deploy pipeline's container image cache was cold after the runner upgrade",
    "Superseded on-call rota https://docs.example.test/spreadsheets/d/1a2B3c4D5e6F7g8H9i0J/edit#gid=0",
]
COMMIT = "9f4c2e7a1b3d5f6e8a0c2b4d6f8e0a1c3b5d7f9e"


def seed(password: str) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from maintenance.models import Dispute
    from maintenance.run_start import run_maintenance
    from memory import accounts, entry_changes, new_entries
    from memory.models import Entry
    from memory.policy_model import MaintenancePolicy

    now = timezone.now()
    user = get_user_model().objects.create_user(USERNAME, password=password)
    get_user_model().objects.create_superuser(ADMIN_USERNAME, password=password)

    def workspace(slug: str, name: str, review_mode: str = "apply") -> Any:
        # Apply mode unless a scenario is about approval: most scenarios review what a run did.
        ws = accounts.workspace_create(slug=slug, name=name, review_mode=review_mode)
        accounts.membership_set(workspace=ws, user=user, role="operator")
        for text in KEEPERS:
            new_entries.entry_create(workspace=ws, content=f"{text} ({slug})", source="operator")
        return ws

    def old_notes(ws: Any) -> list[int]:
        return [
            new_entries.entry_create(workspace=ws, content=text, created_at=now - timedelta(days=400 + i)).pk
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
        new_entries.entry_create(workspace=hyg, content=text, created_at=now - timedelta(days=40)).pk
        for text in JUNK
    ]

    pager = workspace("pager", "Pager")  # two pages of hygiene candidates (25 a page)
    for i in range(30):
        new_entries.entry_create(workspace=pager, content=f"wip {i}...", created_at=now - timedelta(days=40))

    rev = workspace("revert", "Revert")
    archives_old_notes(rev)
    out["revert_entries"] = old_notes(rev)
    out["revert_run"] = run_maintenance(workspace=rev, trigger="cli")

    tomb = workspace("tombstone", "Tombstone")
    gone = new_entries.entry_create(workspace=tomb, content="The old VPN endpoint is vpn1.example.test")
    entry_changes.entry_tombstone(workspace=tomb, entry_id=gone.pk, actor=f"user:{USERNAME}")
    out["tombstoned"] = gone.pk

    dis = workspace("dispute", "Dispute")
    a = new_entries.entry_create(workspace=dis, content="Always use tabs for indentation", entry_type="rule")
    b = new_entries.entry_create(workspace=dis, content="Never use tabs for indentation", entry_type="rule")
    dispute = Dispute.objects.create(
        workspace=dis, entry_a_id=a.pk, entry_b_id=b.pk, detected_by="sweep", similarity=0.8
    )
    out["dispute"] = {"id": dispute.pk, "a": a.pk, "b": b.pk}

    # Propose mode: a run proposes to tombstone the five old notes (decay) and to archive a
    # stale runbook; nothing is changed until an operator approves.
    appr = workspace("approve", "Approve", review_mode="propose")
    out["approve_cold"] = old_notes(appr)
    runbook = new_entries.entry_create(
        workspace=appr,
        title="Runbook: rotate the staging certificates",
        content="Rotate the staging certificates with the vault CLI, then restart the ingress pods.",
        created_at=now - timedelta(days=500),
        now=now - timedelta(days=500),
    )
    Entry.objects.filter(pk=runbook.pk).update(status="stale", status_changed_at=now - timedelta(days=200))
    out["approve_stale"] = runbook.pk
    out["approve_run"] = run_maintenance(workspace=appr, trigger="cli")

    out.update(layout(workspace, now))

    # Apply mode: a run tombstoned the old notes; the browser restores one and runs again.
    held = workspace("holds", "Holds")
    out["holds_entries"] = old_notes(held)
    out["holds_run"] = run_maintenance(workspace=held, trigger="cli")
    return out


def layout(workspace: Any, now: Any) -> dict[str, Any]:
    """The "layout" workspace: long, realistic values in every table of every console page
    (entries, the entry page's anchors, links, versions and history, runs with a backup, the
    review tabs, API keys). ``workspace`` makes a workspace as seed() does."""
    from maintenance.models import Dispute
    from maintenance.run_start import run_maintenance
    from memory import accounts, entry_changes, holds, new_entries
    from memory.models.choices import HoldReason
    from memory.policy_model import MaintenancePolicy

    ws = workspace("layout", "Payments platform (long values)")
    policy = MaintenancePolicy.objects.get(workspace=ws)
    policy.exclude_tags = ["do-not-expire", "compliance-retention-7y", "legal-hold-2024-q3"]
    policy.save()
    project = "payments-platform/reconciliation-service"
    notes = [
        new_entries.entry_create(
            workspace=ws,
            title=title,
            content=f"{title}.\n\nSeen again on 2024-11-07 by the on-call engineer; see the runbook.",
            tags=tags,
            project=project,
            entry_type="observation",
            source="agent",
            pinned=i == 0,
        )
        for i, (title, tags) in enumerate(LONG_NOTES)
    ]
    entry = new_entries.entry_create(
        workspace=ws,
        title="Ledger snapshot writer retries: back off exponentially, never more than five attempts",
        content=(
            "The ledger snapshot writer retries a failed COPY with an exponential back-off.\n"
            "Config: services/reconciliation/internal/ledger/snapshot_writer_postgres.py (RETRY_POLICY)\n"
            f"Introduced in commit {COMMIT}; the dashboard is at "
            "https://grafana.example.test/d/reconciliation-ledger/ledger-snapshot-writer?orgId=1&var-env=production"
        ),
        tags=["reconciliation", "retries", "postgresql", "snapshot-writer", "incident-2024-11-07"],
        project=project,
        session_key="claude-code/session/7f3c9a2e-1b4d-4e8f-9a6c-2d5e8f1b3c7a",
        external_id="jira:PAYMENTS-4821/comment/998877",
        entry_type="decision",
        anchors=[
            {
                "repo": "github.com/acme-corp/payments-platform-monorepo",
                "path": "services/reconciliation/internal/ledger/snapshot_writer_postgres.py",
                "commit": COMMIT,
                "line_start": 120,
                "line_end": 188,
            },
            {
                "repo": "github.com/acme-corp/payments-platform-monorepo",
                "path": "deploy/helm/charts/reconciliation-service/templates/cronjob-ledger-export.yaml",
                "commit": COMMIT[::-1],
                "line_start": 1,
                "line_end": 64,
            },
        ],
        links=[{"to_id": n.pk} for n in notes[:3]],
    )
    for step in ("five attempts", "five attempts, then page the on-call engineer"):
        entry = entry_changes.entry_update(
            workspace=ws,
            entry_id=entry.pk,
            content=f"{entry.content}\nAmended: {step}.",
            actor="user:steward",
        ).entry
    for i in range(3):
        new_entries.entry_create(
            workspace=ws,
            content=f"Deploy freeze window {i + 1} of the payments platform: no schema migrations on Fridays",
            tags=["deploy-freeze", "schema-migrations", f"release-train-2024-w{45 + i}"],
            project="payments-platform/release-engineering",
            entry_type="development_note",
            tier="constitutional" if i == 0 else "procedural",
        )
    for text in JUNK:
        new_entries.entry_create(workspace=ws, content=text, created_at=now - timedelta(days=40))
    a = new_entries.entry_create(
        workspace=ws,
        entry_type="rule",
        content="Always run the ledger export after the reconciliation batch has released its connections",
    )
    b = new_entries.entry_create(
        workspace=ws,
        entry_type="rule",
        content="Never run the ledger export while any reconciliation batch is still scheduled for the night",
    )
    Dispute.objects.create(
        workspace=ws, entry_a_id=a.pk, entry_b_id=b.pk, detected_by="sweep", similarity=0.83
    )
    for i, text in enumerate(LONG_OLD_NOTES):
        new_entries.entry_create(workspace=ws, content=text, created_at=now - timedelta(days=400 + i))
    # Decay tombstones the old notes, after a backup: automatic changes, tombstones, a backup file.
    first = run_maintenance(workspace=ws, trigger="cli")
    # An operator's hold on one of them: its badge names who, since when and why.
    held = first["affected"]["tombstoned"][:1]
    holds.hold(ws, held, reason=HoldReason.REJECT, actor="user:steward", now=now)
    run_maintenance(workspace=ws, trigger="ui", dry_run=True, actor="user:steward")
    run_maintenance(workspace=ws, kind="hygiene", trigger="schedule")
    # Then the workspace reviews first: a later run's proposals wait on the pending tab.
    MaintenancePolicy.objects.filter(workspace=ws).update(review_mode="propose")
    for i, text in enumerate(LONG_PROPOSED):
        new_entries.entry_create(workspace=ws, content=text, created_at=now - timedelta(days=420 + i))
    agent, _ = accounts.api_key_create(
        workspace=ws, name="claude-code-agent-payments-platform-reconciliation", role="operator"
    )
    proposing = run_maintenance(workspace=ws, trigger="api", actor=accounts.actor_for_key(agent))
    for name, role in (
        ("ci-pipeline-nightly-ledger-export-to-data-warehouse", "agent"),
        ("grafana-dashboard-readonly-observability", "viewer"),
    ):
        accounts.api_key_create(workspace=ws, name=name, role=role, actor="user:steward")
    revoked, _ = accounts.api_key_create(workspace=ws, name="old-laptop-cli-2023", role="agent")
    accounts.api_key_revoke(workspace=ws, key_id=revoked.pk)
    return {
        "layout_entry": entry.pk,
        "layout_run": first["run_id"],
        "layout_proposed_run": proposing["run_id"],
    }


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
