"""Journal import: the records ``memory.journal_parse`` read, written in bulk.

A few statements per batch, never one query per record; a record whose ``id`` already names a
latest entry is either unchanged (same content) or becomes a new version through
:func:`memory.entry_changes.entry_update`. Nothing of an invalid record is written. Nothing
here prints: the management commands present the counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from memory import entry_changes
from memory.bulk_insert import NewEntry, chunks, insert_entries
from memory.errors import ServiceError
from memory.journal_parse import (
    ImportCounts,
    JournalRecord,
    Progress,
    read_records,
)
from memory.models import Entry, Relationship, Tag, Workspace
from memory.models.choices import StagedClass, Status
from memory.new_entries import STAGED_TTL_DAYS
from memory.scoring_db import refresh_scores
from memory.writes import SYSTEM_ACTOR

SAMPLE_PATH = Path(__file__).resolve().parent / "sample_data" / "flask_journal_sample.jsonl"

BATCH_SIZE = 500


EVENT_REASON = "import"


def import_journal(
    *,
    workspace: Workspace,
    path: str | Path,
    now: datetime | None = None,
    actor: str = SYSTEM_ACTOR,
    progress: Progress | None = None,
) -> ImportCounts:
    """Import a journal JSONL file into ``workspace`` (which must exist). Idempotent."""
    path = Path(path)
    with path.open("rb") as handle:
        total = sum(1 for _ in handle) if progress is not None else 0
        handle.seek(0)
        return import_lines(
            workspace=workspace,
            lines=handle,
            name=str(path),
            now=now,
            actor=actor,
            progress=progress,
            total=total,
        )


def import_lines(
    *,
    workspace: Workspace,
    lines: Iterable[bytes | str],
    name: str = "",
    now: datetime | None = None,
    actor: str = SYSTEM_ACTOR,
    progress: Progress | None = None,
    total: int = 0,
) -> ImportCounts:
    now = now or timezone.now()
    counts = ImportCounts(workspace=workspace.slug, file=name)
    records = read_records(lines, counts, now=now, progress=progress, total=total)

    with transaction.atomic():
        _write(workspace, records, counts, now=now, actor=actor, progress=progress)
    return counts


def _write(
    workspace: Workspace,
    records: list[JournalRecord],
    counts: ImportCounts,
    *,
    now: datetime,
    actor: str,
    progress: Progress | None,
) -> None:
    tags_before = Tag.objects.filter(workspace=workspace).count()
    latest = _latest_by_external_id(workspace)
    # Entries without an external id are matched on content among those that have none.
    hashes_without_id = set(
        Entry.objects.filter(workspace=workspace, is_latest=True, external_id__isnull=True).values_list(
            "content_hash", flat=True
        )
    )

    new: list[JournalRecord] = []
    later: list[JournalRecord] = []  # an id that an earlier line of this file creates
    seen_new: set[str] = set()
    for rec in records:
        if rec.external_id is None:
            if rec.content_hash in hashes_without_id:
                counts.unchanged += 1
            else:
                hashes_without_id.add(rec.content_hash)
                new.append(rec)
        elif rec.external_id in seen_new or rec.external_id in latest:
            later.append(rec)
        else:
            seen_new.add(rec.external_id)
            new.append(rec)

    created = _create(workspace, new, now=now, actor=actor, progress=progress)
    counts.created = len(created)
    counts.anchors_created = sum(len(rec.anchors) for rec in new)

    sources: list[tuple[JournalRecord, int]] = list(zip(new, created, strict=True))
    if later:
        latest = _latest_by_external_id(workspace)
        for rec in later:
            assert rec.external_id is not None
            pk, hash_, status = latest[rec.external_id]
            if hash_ == rec.content_hash:
                counts.unchanged += 1
                if status != Status.TOMBSTONED:
                    sources.append((rec, pk))
                continue
            # Only what the record sets changes (an operator's entry must not turn into a
            # managed import by default); tags are added to the entry's own, never dropped.
            fields = {k: v for k, v in rec.fields.items() if k in rec.given}
            if "entry_type" in rec.given:
                fields["entry_type"] = rec.entry_type
            own_tags = Tag.objects.filter(workspace=workspace, entries__pk=pk).values_list("name", flat=True)
            try:
                result = entry_changes.entry_update(
                    workspace=workspace,
                    entry_id=pk,
                    actor=actor,
                    now=now,
                    content=rec.content,
                    tags=[*own_tags, *rec.tags],
                    anchors=[asdict(a) for a in rec.anchors],
                    **fields,
                )
            except ServiceError as exc:
                counts.error(rec.line, exc.detail)
                continue
            counts.updated += 1
            counts.anchors_created += len(rec.anchors)
            latest[rec.external_id] = (result.entry.pk, rec.content_hash, result.entry.status)
            sources.append((rec, result.entry.pk))

    if progress is not None:
        progress("linking", 0, 1)
    _link(workspace, sources, counts, now=now, actor=actor)
    counts.tags_created = Tag.objects.filter(workspace=workspace).count() - tags_before
    if progress is not None:
        progress("scoring", 0, 1)
    refresh_scores(workspace, now=now)
    if progress is not None:
        progress("scoring", 1, 1)


def _latest_by_external_id(workspace: Workspace) -> dict[str, tuple[int, str, str]]:
    rows = Entry.objects.filter(workspace=workspace, is_latest=True, external_id__isnull=False).values_list(
        "external_id", "pk", "content_hash", "status"
    )
    return {ext: (pk, hash_, status) for ext, pk, hash_, status in rows if ext is not None}


def _create(
    workspace: Workspace,
    records: list[JournalRecord],
    *,
    now: datetime,
    actor: str,
    progress: Progress | None,
) -> list[int]:
    """Insert new entries with their tags, anchors and creation events; returns their ids."""
    new = [
        NewEntry(
            row=_entry_row(workspace, rec, now),
            event={"reason": EVENT_REASON, "actor": actor, "details": {"line": rec.line}},
            tags=rec.tags,
            anchors=[
                {
                    "repo": a.repo,
                    "path": a.path,
                    "commit": a.commit,
                    "line_start": a.line_start,
                    "line_end": a.line_end,
                    "content_hash": a.content_hash,
                    "status": a.status,
                }
                for a in rec.anchors
            ],
        )
        for rec in records
    ]
    told = None if progress is None else (lambda done: progress("writing", done, len(records)))
    return insert_entries(workspace, new, now=now, batch=BATCH_SIZE, progress=told)


def _entry_row(workspace: Workspace, rec: JournalRecord, now: datetime) -> dict[str, Any]:
    status_changed_at = rec.created_at
    ttl_expires_at = None
    if rec.status == Status.STAGED:
        assert rec.staged_class is not None
        ttl_expires_at = rec.created_at + timedelta(days=STAGED_TTL_DAYS[StagedClass(rec.staged_class)])
    elif rec.status in (Status.STALE, Status.ARCHIVED):
        # It entered that status here and now: ages that move it further start at the import.
        status_changed_at = now
    return {
        **rec.fields,
        "workspace_id": workspace.pk,
        "content": rec.content,
        "content_hash": rec.content_hash,
        "external_id": rec.external_id,
        "entry_type": rec.entry_type,
        "status": rec.status,
        "status_changed_at": status_changed_at,
        "archived_at": now if rec.status == Status.ARCHIVED else None,
        "staged_class": rec.staged_class,
        "ttl_expires_at": ttl_expires_at,
        "lineage_id": None,
        "supersedes_id": None,
        "is_latest": True,
        "created_at": rec.created_at,
        "updated_at": now,
    }


def _link(
    workspace: Workspace,
    sources: list[tuple[JournalRecord, int]],
    counts: ImportCounts,
    *,
    now: datetime,
    actor: str,
) -> None:
    """Links of every imported record to entries of this workspace named by external id."""
    if not any(rec.links for rec, _ in sources):
        return
    targets = {ext: (pk, status) for ext, (pk, _, status) in _latest_by_external_id(workspace).items()}
    wanted: dict[tuple[int, int, str], None] = {}
    for rec, from_pk in sources:
        for ref, type_ in rec.links:
            target = targets.get(ref)
            if target is None or target[1] == Status.TOMBSTONED:
                counts.links_unresolved += 1
            elif target[0] != from_pk:
                wanted.setdefault((from_pk, target[0], type_), None)
    if not wanted:
        return
    existing: set[tuple[int, int, str]] = set()
    from_ids = sorted({f for f, _, _ in wanted})
    for chunk in chunks(from_ids, BATCH_SIZE):
        existing.update(
            Relationship.objects.filter(workspace=workspace, from_entry_id__in=chunk).values_list(
                "from_entry_id", "to_entry_id", "type"
            )
        )
    new = [triple for triple in wanted if triple not in existing]
    Relationship.objects.bulk_create(
        [
            Relationship(
                workspace=workspace,
                from_entry_id=f,
                to_entry_id=t,
                type=type_,
                created_at=now,
                created_by=actor,
            )
            for f, t, type_ in new
        ],
        batch_size=BATCH_SIZE,
        ignore_conflicts=True,
    )
    counts.links_created = len(new)
