"""Journal JSONL import and export: the format of the shared flask corpus.

One JSON object per line. ``id`` becomes ``external_id`` (the key that keeps a re-import
idempotent), ``created_at`` is kept, ``anchors`` become CodeAnchors, issue references become
tags and commit references become links (reverts → caused, fixes → resolved, anything else →
references). Any writer-settable Entry field present in a record is taken too; journal
fields without an Entry column (sha, author, parents, ...) are kept in ``Entry.metadata``.

New records are written in bulk (a few statements per batch, never one query per record); a
record whose ``id`` already names a latest entry is either unchanged (same content) or becomes
a new version through :func:`memory.entry_changes.entry_update`. An invalid record is skipped and
reported with its line number; nothing of it is written.

:func:`export_journal` writes the same format, so export → import → export is byte-identical.
Nothing here prints: the management commands present the counts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from django.db import connection, models, transaction
from django.db.models import F, Max
from django.utils import timezone

from memory import entry_changes, write_input, writes
from memory.errors import InvalidInput, ServiceError
from memory.models import (
    CONTENT_MAX,
    AnchorStatus,
    CodeAnchor,
    Entry,
    EntryType,
    LifecycleEvent,
    Relationship,
    RelationshipType,
    Source,
    StagedClass,
    Status,
    Tag,
    Workspace,
)
from memory.new_entries import STAGED_TTL_DAYS
from memory.scoring_db import refresh_scores
from memory.write_input import (
    ANCHORS_PER_ENTRY_MAX,
    AnchorIn,
    clean_tag_names,
    valid_choice,
    valid_text,
    validate_writable,
)
from memory.writes import SYSTEM_ACTOR

SAMPLE_PATH = Path(__file__).resolve().parent / "sample_data" / "flask_journal_sample.jsonl"

BATCH_SIZE = 500
ERRORS_KEPT = 20
LINE_MAX = 2_147_483_647
EVENT_REASON = "import"

# Writer-settable Entry fields taken from a record as they are (validated by services).
WRITABLE_FIELDS = (
    "title",
    "tier",
    "source",
    "pinned",
    "impact_score",
    "trust_score",
    "validation_status",
    "significance_type",
    "salience",
    "expires_at",
    "project",
    "session_key",
    "metadata",
)
# Fields that have a default and no "unset" value: null in a record means "use the default".
_NULL_MEANS_DEFAULT = ("tier", "source", "validation_status", "pinned", "metadata")
# Everything else a record carries (sha, author, committed_at, files_changed, parents,
# is_merge, source_repo, ...) is kept in Entry.metadata.
_CONSUMED_FIELDS = frozenset(
    {
        "id",
        "created_at",
        "entry_type",
        "content",
        "tags",
        "anchors",
        "references",
        "reference_details",
        "links",
        "status",
        "staged_class",
        *WRITABLE_FIELDS,
    }
)

# Commit reference relation → link type, and back for export.
RELATION_TO_LINK: dict[str, str] = {"reverts": RelationshipType.CAUSED, "fixes": RelationshipType.RESOLVED}
LINK_TO_RELATION: dict[str, str] = {
    RelationshipType.CAUSED: "reverts",
    RelationshipType.RESOLVED: "fixes",
    RelationshipType.REFERENCES: "mentions",
}
# Statuses a record may bring besides staged (round trips of our own exports).
_IMPORTABLE_STATUSES = (Status.ACTIVE, Status.STALE, Status.ARCHIVED)
# git --name-status letters: the file exists at that commit unless it was deleted.
_GIT_CHANGE = re.compile(r"([AMDRCT])\d*")
_HEX_COMMIT = re.compile(r"[0-9a-fA-F]{7,40}")

Progress = Callable[[str, int, int], None]

# Enum values as sets: TextChoices.values builds a new list on every access.
_ENTRY_TYPES = frozenset(EntryType.values)
_ANCHOR_STATUSES = frozenset(AnchorStatus.values)
_STAGED_CLASSES = frozenset(StagedClass.values)
_RELATIONSHIP_TYPES = frozenset(RelationshipType.values)

# Columns whose Python value the database drivers take as it is.
_PLAIN_FIELDS = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.FloatField,
    models.BooleanField,
    models.ForeignKey,
)


@dataclass
class ImportCounts:
    workspace: str
    file: str
    records: int = 0
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    invalid: int = 0
    links_created: int = 0
    links_unresolved: int = 0
    anchors_created: int = 0
    tags_created: int = 0
    errors: list[str] = field(default_factory=list)

    def error(self, line: int, detail: str) -> None:
        self.invalid += 1
        if len(self.errors) < ERRORS_KEPT:
            self.errors.append(f"line {line}: {detail}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class JournalRecord:
    """One validated record, ready to write."""

    line: int
    external_id: str | None
    content: str
    content_hash: str
    created_at: datetime
    entry_type: str
    tags: list[str]
    anchors: list[AnchorIn]
    # (target external id, relationship type), in record order without repeats.
    links: list[tuple[str, str]]
    fields: dict[str, Any]  # writable fields, defaults filled in (for a new entry)
    given: frozenset[str]  # the fields the record itself set (an update changes only these)
    status: str
    staged_class: str | None


# --- parsing -------------------------------------------------------------------------------


def parse_datetime(value: Any, name: str) -> datetime:
    """An ISO-8601 date-time (any offset; none means UTC) as an aware UTC datetime."""
    if isinstance(value, datetime):
        dt = value
    else:
        if not isinstance(value, str) or not value.strip():
            raise InvalidInput(f"{name}: must be an ISO-8601 date-time")
        try:
            dt = datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidInput(f"{name}: {value!r} is not an ISO-8601 date-time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    try:
        return dt.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(f"{name}: {value!r} is out of range") from None


def _list(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput(f"{name}: must be a list")
    return value


def _anchor(raw: Any, source_repo: str) -> AnchorIn:
    if not isinstance(raw, Mapping):
        raise InvalidInput("anchors: each anchor must be an object")
    data = dict(raw)
    status = data.get("status")
    if isinstance(status, str) and status not in _ANCHOR_STATUSES:
        git = _GIT_CHANGE.fullmatch(status.strip().upper())
        if git:
            data["status"] = AnchorStatus.INVALIDATED if git.group(1) == "D" else AnchorStatus.VALID
    if not data.get("repo"):
        data["repo"] = source_repo
    for name in ("line_start", "line_end"):
        line = data.get(name)
        if isinstance(line, int) and line > LINE_MAX:  # the column is a 32-bit integer
            raise InvalidInput(f"anchors.{name}: at most {LINE_MAX}")
    return AnchorIn.parse(data)


def _references(record: Mapping[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
    """Issue/PR tags and (commit ref, link type) pairs of a record."""
    issues: list[str] = []
    commits: list[tuple[str, str]] = []
    details = record.get("reference_details")
    if details is not None:
        for item in _list(details, "reference_details"):
            if not isinstance(item, Mapping):
                raise InvalidInput("reference_details: each reference must be an object")
            ref = item.get("ref")
            if not isinstance(ref, str) or not ref.strip():
                raise InvalidInput("reference_details.ref: must be a non-empty string")
            kind = item.get("kind")
            if kind == "issue":
                issues.append(ref.strip())
            elif kind == "commit":
                relation = item.get("relation")
                link_type = RELATION_TO_LINK.get(relation if isinstance(relation, str) else "")
                commits.append((ref.strip(), link_type or RelationshipType.REFERENCES))
            # other kinds carry nothing this model stores
        return issues, commits
    for ref in _list(record.get("references"), "references"):
        if not isinstance(ref, str):
            raise InvalidInput("references: each reference must be a string")
        ref = ref.strip()
        if "#" in ref:
            issues.append(ref)
        elif _HEX_COMMIT.fullmatch(ref) and not ref.isdigit():
            commits.append((ref, RelationshipType.REFERENCES))
    return issues, commits


def _explicit_links(value: Any) -> list[tuple[str, str]]:
    out = []
    for item in _list(value, "links"):
        if not isinstance(item, Mapping):
            raise InvalidInput("links: each link must be an object")
        to = item.get("to")
        if not isinstance(to, str) or not to.strip():
            raise InvalidInput("links.to: must be the external id of an entry")
        type_ = valid_choice(
            item.get("type") or RelationshipType.REFERENCES, _RELATIONSHIP_TYPES, "links.type"
        )
        out.append((to.strip(), type_))
    return out


def _reject_unstorable(record: dict[str, Any]) -> None:
    """Text no database column can hold: NUL characters (PostgreSQL refuses them anywhere,
    metadata and tags included) and unpaired surrogates (not encodable as UTF-8).

    Both can only come from a ``\\u`` escape of the JSON line (raw control characters are not
    valid JSON, and the line was decoded as strict UTF-8), so lines without one skip this."""
    text = json.dumps(record, ensure_ascii=False)
    if "\\u0000" in text:
        raise InvalidInput("NUL characters are not allowed")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("contains an unpaired surrogate (not valid Unicode)") from None


def parse_record(record: Any, line: int, now: datetime) -> JournalRecord:
    """Validate one decoded journal record with the rules of memory.write_input.

    Raises InvalidInput for anything a write through the services would refuse. A record
    without ``created_at`` is dated ``now``.
    """
    if not isinstance(record, dict):
        raise InvalidInput("not a JSON object")
    content = valid_text(record.get("content"), "content", CONTENT_MAX, required=True)

    raw_id = record.get("id")
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        raw_id = str(raw_id)
    external_id = None if raw_id is None else valid_text(raw_id, "id", 200, required=True).strip()

    raw_created = record.get("created_at")
    created_at = now if raw_created is None else parse_datetime(raw_created, "created_at")

    extra_tags: list[str] = []
    raw_type = record.get("entry_type")
    if raw_type is None or raw_type == "":
        entry_type: str = EntryType.OBSERVATION
    elif not isinstance(raw_type, str):
        raise InvalidInput("entry_type: must be a string")
    elif raw_type in _ENTRY_TYPES:
        entry_type = raw_type
    else:  # revert and anything this model has no type for: kept as a tag
        entry_type = EntryType.OTHER
        extra_tags.append(raw_type)

    issues, commit_links = _references(record)
    tags = clean_tag_names([*_list(record.get("tags"), "tags"), *extra_tags, *issues])

    source_repo = record.get("source_repo")
    source_repo = source_repo if isinstance(source_repo, str) else ""
    anchors = [_anchor(a, source_repo) for a in _list(record.get("anchors"), "anchors")]
    if len(anchors) > ANCHORS_PER_ENTRY_MAX:
        raise InvalidInput(f"anchors: at most {ANCHORS_PER_ENTRY_MAX} per entry")

    links = list(dict.fromkeys([*commit_links, *_explicit_links(record.get("links"))]))

    given = {name: record[name] for name in WRITABLE_FIELDS if name in record}
    for name in _NULL_MEANS_DEFAULT:
        if given.get(name, ...) is None:
            del given[name]
    if given.get("expires_at") is not None:
        given["expires_at"] = parse_datetime(given["expires_at"], "expires_at")
    fields = validate_writable(given)
    given_names = set(fields)
    if raw_type is not None:
        given_names.add("entry_type")
    fields.setdefault("source", Source.IMPORT)
    metadata = dict(fields.get("metadata") or {})
    for name, value in record.items():
        if name not in _CONSUMED_FIELDS:
            metadata.setdefault(name, value)
            given_names.add("metadata")
    fields["metadata"] = metadata

    staged_class = record.get("staged_class") or None
    if staged_class is not None:
        valid_choice(staged_class, _STAGED_CLASSES, "staged_class")
    raw_status = record.get("status")
    status: str
    if raw_status == Status.STAGED and staged_class:
        status = Status.STAGED
    elif raw_status in _IMPORTABLE_STATUSES:
        status = str(raw_status)
    else:
        status = Status.ACTIVE

    return JournalRecord(
        line=line,
        external_id=external_id,
        content=content,
        content_hash=write_input.content_hash(content),
        created_at=created_at,
        entry_type=entry_type,
        tags=tags,
        anchors=anchors,
        links=links,
        fields=fields,
        given=frozenset(given_names),
        status=status,
        staged_class=staged_class,
    )


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def read_records(
    lines: Iterable[bytes | str],
    counts: ImportCounts,
    *,
    now: datetime,
    progress: Progress | None = None,
    total: int = 0,
) -> list[JournalRecord]:
    """Decode and validate every non-blank line; invalid ones are counted in ``counts``."""
    records = []
    for number, raw in enumerate(lines, start=1):
        if progress is not None:
            progress("reading", number, total)
        try:
            text = (raw.decode("utf-8") if isinstance(raw, bytes) else raw).rstrip("\r\n")
        except UnicodeDecodeError:
            counts.records += 1
            counts.error(number, "not valid UTF-8")
            continue
        if number == 1:
            text = text.removeprefix("\ufeff")
        if not text.strip():
            continue
        counts.records += 1
        try:
            data = json.loads(text, parse_constant=_no_constants)
        except json.JSONDecodeError as exc:
            counts.error(number, f"not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        except ValueError as exc:
            counts.error(number, f"not valid JSON ({exc})")
            continue
        try:
            if "\\u" in text:
                _reject_unstorable(data)
            records.append(parse_record(data, number, now))
        except InvalidInput as exc:
            counts.error(number, exc.detail)
        except (TypeError, ValueError) as exc:  # e.g. a list where a choice was expected
            counts.error(number, f"invalid value ({exc})")
    return records


# --- import --------------------------------------------------------------------------------


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


# --- export --------------------------------------------------------------------------------


@dataclass
class ExportCounts:
    workspace: str
    entries: int = 0
    anchors: int = 0
    links: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _sorted_json(value: Any) -> Any:
    """Dicts with sorted keys all the way down, so output does not depend on the database."""
    if isinstance(value, dict):
        return {k: _sorted_json(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_json(v) for v in value]
    return value


def export_id(entry_pk: int, external_id: str | None) -> str:
    return external_id or f"entry-{entry_pk}"


def export_records(workspace: Workspace, counts: ExportCounts | None = None) -> Iterator[dict[str, Any]]:
    """Every latest, not tombstoned entry of the workspace as a journal record, oldest first."""
    entries = list(
        Entry.objects.filter(workspace=workspace, is_latest=True)
        .exclude(status=Status.TOMBSTONED)
        .order_by("created_at", "id")
    )
    ids = {e.pk: export_id(e.pk, e.external_id) for e in entries}

    tags: dict[int, list[str]] = {}
    for entry_id, name in Entry.tags.through.objects.filter(
        entry__workspace=workspace, entry__is_latest=True, tag__workspace=workspace
    ).values_list("entry_id", "tag__name"):
        tags.setdefault(entry_id, []).append(name)

    anchors: dict[int, list[dict[str, Any]]] = {}
    for a in (
        CodeAnchor.objects.filter(workspace=workspace, entry__is_latest=True)
        .order_by("entry_id", "id")
        .values("entry_id", "path", "commit", "repo", "status", "line_start", "line_end", "content_hash")
    ):
        row: dict[str, Any] = dict(a)
        anchors.setdefault(row.pop("entry_id"), []).append(row)

    refs: dict[int, list[dict[str, str]]] = {}
    links: dict[int, list[dict[str, str]]] = {}
    for from_id, to_id, type_ in Relationship.objects.filter(
        workspace=workspace, pruned_at__isnull=True
    ).values_list("from_entry_id", "to_entry_id", "type"):
        if from_id not in ids or to_id not in ids:
            continue
        relation = LINK_TO_RELATION.get(type_)
        if relation is None:
            links.setdefault(from_id, []).append({"to": ids[to_id], "type": type_})
        else:
            refs.setdefault(from_id, []).append({"kind": "commit", "ref": ids[to_id], "relation": relation})

    for e in entries:
        details = sorted(refs.get(e.pk, []), key=lambda d: (d["ref"], d["relation"]))
        entry_links = sorted(links.get(e.pk, []), key=lambda d: (d["to"], d["type"]))
        entry_anchors = anchors.get(e.pk, [])
        if counts is not None:
            counts.entries += 1
            counts.anchors += len(entry_anchors)
            counts.links += len(details) + len(entry_links)
        yield {
            "id": ids[e.pk],
            "created_at": _iso(e.created_at),
            "entry_type": e.entry_type,
            "content": e.content,
            "tags": sorted(tags.get(e.pk, [])),
            "anchors": entry_anchors,
            "references": list(dict.fromkeys(d["ref"] for d in details)),
            "reference_details": details,
            "links": entry_links,
            "title": e.title,
            "tier": e.tier,
            "source": e.source,
            "pinned": e.pinned,
            "impact_score": e.impact_score,
            "trust_score": e.trust_score,
            "validation_status": e.validation_status,
            "significance_type": e.significance_type,
            "salience": e.salience,
            "expires_at": _iso(e.expires_at),
            "project": e.project,
            "session_key": e.session_key,
            "status": e.status,
            "staged_class": e.staged_class,
            "metadata": _sorted_json(e.metadata or {}),
        }


class Writer(Protocol):
    def write(self, text: str, /) -> object: ...


def export_journal(*, workspace: Workspace, out: Writer) -> ExportCounts:
    """Write the workspace as journal JSONL to ``out``; returns what was written."""
    counts = ExportCounts(workspace=workspace.slug)
    for record in export_records(workspace, counts):
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return counts
