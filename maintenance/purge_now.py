"""An operator's "purge now" of a tombstoned entry: the one hard delete outside a run."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from maintenance import backups
from maintenance.passes import purge_lineages
from memory.errors import Conflict
from memory.models import Entry, Tombstone, Workspace


def entry_purge(
    *, workspace: Workspace, entry: Entry, actor: str, now: datetime | None = None
) -> dict[str, Any]:
    """The one hard delete outside maintenance (an operator's "purge now" of a tombstoned
    entry): a backup first, then the lineage goes exactly as in the purge pass. The tombstone
    is locked and re-checked after the backup, so a restore that raced the backup wins and
    nothing is deleted."""
    open_tombstones = Tombstone.objects.filter(
        workspace=workspace,
        lineage_ref=entry.lineage_id or entry.pk,
        restored_at__isnull=True,
        purged_at__isnull=True,
        entry__isnull=False,
    )
    if not open_tombstones.exists():
        raise Conflict(f"entry {entry.pk} is not tombstoned; only tombstoned entries can be purged")
    now = now or timezone.now()
    backup = backups.write_backup(workspace, reason="pre-prune", now=now)
    with transaction.atomic():
        rows = list(open_tombstones.select_for_update(of=("self",)).values("pk", "entry_ref", "lineage_ref"))
        if not rows:
            raise Conflict(f"entry {entry.pk} was restored or purged meanwhile; nothing was purged")
        purge_lineages(workspace, rows, now, actor=actor, automatic=False)
    return {
        "purged": True,
        "entry_id": rows[0]["entry_ref"],
        "lineage_id": rows[0]["lineage_ref"],
        "backup_file": backup.file_name,
    }
