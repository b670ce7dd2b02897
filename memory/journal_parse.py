"""Reading journal JSONL: the format of the shared flask corpus, validated record by record.

One JSON object per line. ``id`` becomes ``external_id`` (the key that keeps a re-import
idempotent), ``created_at`` is kept, ``anchors`` become CodeAnchors, issue references become
tags and commit references become links (reverts → caused, fixes → resolved, anything else →
references). Any writer-settable Entry field present in a record is taken too; journal
fields without an Entry column (sha, author, parents, ...) are kept in ``Entry.metadata``.
An invalid record is skipped and reported with its line number.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from memory import write_input
from memory.errors import InvalidInput
from memory.models.choices import (
    CONTENT_MAX,
    AnchorStatus,
    EntryType,
    RelationshipType,
    Source,
    StagedClass,
    Status,
)
from memory.write_input import (
    ANCHORS_PER_ENTRY_MAX,
    AnchorIn,
    clean_tag_names,
    valid_choice,
    valid_text,
    validate_writable,
)

ERRORS_KEPT = 20
LINE_MAX = 2_147_483_647


# Writer-settable Entry fields taken from a record as they are (validated by memory.write_input).
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
