"""Journal import: the records ``memory.journal_parse`` read, written in bulk.

A few statements per batch, never one query per record; a record whose ``id`` already names a
latest entry is either unchanged (same content) or becomes a new version through
:func:`memory.entry_changes.entry_update`. Nothing of an invalid record is written. Nothing
here prints: the management commands present the counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from django.db import connection, models, transaction
from django.db.models import F, Max
from django.utils import timezone

from memory import entry_changes, writes
from memory.errors import ServiceError
from memory.journal_parse import (
    ImportCounts,
    JournalRecord,
    Progress,
    read_records,
)
from memory.models import CodeAnchor, Entry, LifecycleEvent, Relationship, Tag, Workspace
from memory.models.choices import StagedClass, Status
from memory.new_entries import STAGED_TTL_DAYS
from memory.scoring_db import refresh_scores
from memory.writes import SYSTEM_ACTOR

SAMPLE_PATH = Path(__file__).resolve().parent / "sample_data" / "flask_journal_sample.jsonl"

BATCH_SIZE = 500


EVENT_REASON = "import"


# Columns whose Python value the database drivers take as it is.
_PLAIN_FIELDS = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.FloatField,
    models.BooleanField,
    models.ForeignKey,
)


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


def _chunks(items: list[Any], size: int = BATCH_SIZE) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _columns(model: type[models.Model]) -> list[tuple[models.Field[Any, Any], Callable[[Any], Any] | None]]:
    """Every concrete column but the primary key, with the adapter that turns a Python value
    into what the database driver takes (as the field's get_db_prep_save would). Plain scalars
    need none, which is what makes the insert fast."""
    ops = connection.ops
    out: list[tuple[models.Field[Any, Any], Callable[[Any], Any] | None]] = []
    for f in model._meta.concrete_fields:
        if f.primary_key:
            continue
        adapter: Callable[[Any], Any] | None
        if isinstance(f, models.DateTimeField):
            adapter = ops.adapt_datetimefield_value
        elif isinstance(f, models.JSONField):
            adapter = partial(ops.adapt_json_value, encoder=f.encoder)
        elif isinstance(f, _PLAIN_FIELDS):
            adapter = None
        else:
            adapter = partial(f.get_db_prep_save, connection=connection)
        out.append((f, adapter))
    return out


def _insert_rows(model: type[models.Model], rows: list[dict[str, Any]]) -> None:
    """INSERT rows given as {attname: value}; a missing column takes the field's default.

    One prepared statement run with executemany: the ORM's bulk_create prepares every value of
    every row through the field machinery, which made a 5,000-record import take seconds.
    """
    if not rows:
        return
    columns = _columns(model)
    defaults = {f.attname: f.get_default() for f, _ in columns}
    qn = connection.ops.quote_name
    sql = (
        f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f, _ in columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))})"
    )
    params = []
    for row in rows:
        values = []
        for f, adapter in columns:
            value = row[f.attname] if f.attname in row else defaults[f.attname]
            values.append(value if adapter is None or value is None else adapter(value))
        params.append(values)
    with connection.cursor() as cursor:
        for chunk in _chunks(params, 1000):
            cursor.executemany(sql, chunk)


def _create(
    workspace: Workspace,
    records: list[JournalRecord],
    *,
    now: datetime,
    actor: str,
    progress: Progress | None,
) -> list[int]:
    """Insert new entries with their tags, anchors and creation events; returns their ids."""
    if not records:
        return []
    last_id = Entry.objects.aggregate(last=Max("id"))["last"] or 0
    for done, batch in enumerate(_chunks(records), start=1):
        _insert_rows(Entry, [_entry_row(workspace, rec, now) for rec in batch])
        if progress is not None:
            progress("writing", min(done * BATCH_SIZE, len(records)), len(records))
    # executemany returns no ids. The new rows are the ones of this workspace above the old
    # maximum id that have no lineage yet (every committed entry has one; SQLite holds the
    # write lock and PostgreSQL hides other transactions' rows), in insert order; the check
    # below makes any surprise abort the whole import instead of mis-attributing rows.
    fresh = Entry.objects.filter(workspace=workspace, lineage_id__isnull=True, pk__gt=last_id)
    found = list(fresh.order_by("pk").values_list("pk", "external_id"))
    if [ext for _, ext in found] != [rec.external_id for rec in records]:
        raise RuntimeError("could not identify the inserted entries; nothing was imported")
    ids = [pk for pk, _ in found]
    fresh.update(lineage_id=F("id"))

    names = sorted({n for rec in records for n in rec.tags})
    tag_ids: dict[str, int] = {}
    for chunk in _chunks(names):
        tag_ids.update({t.name: t.pk for t in writes.tags_for_names(workspace, chunk)})
    _insert_rows(
        Entry.tags.through,
        [
            {"entry_id": pk, "tag_id": tag_ids[name]}
            for rec, pk in zip(records, ids, strict=True)
            for name in rec.tags
        ],
    )
    _insert_rows(
        CodeAnchor,
        [
            {
                "workspace_id": workspace.pk,
                "entry_id": pk,
                "repo": a.repo,
                "path": a.path,
                "commit": a.commit,
                "line_start": a.line_start,
                "line_end": a.line_end,
                "content_hash": a.content_hash,
                "status": a.status,
                "created_at": now,
            }
            for rec, pk in zip(records, ids, strict=True)
            for a in rec.anchors
        ],
    )
    _insert_rows(
        LifecycleEvent,
        [
            {
                "workspace_id": workspace.pk,
                "entry_id": pk,
                "entry_ref": pk,
                "from_status": "",
                "to_status": rec.status,
                "reason": EVENT_REASON,
                "actor": actor,
                "automatic": False,
                "created_at": now,
                "details": {"line": rec.line},
            }
            for rec, pk in zip(records, ids, strict=True)
        ],
    )
    return ids


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
    for chunk in _chunks(from_ids):
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
