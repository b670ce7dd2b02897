"""What a writer may send, validated before anything is written: text, choices, numbers,
tags, anchors and links, each refused with an ``InvalidInput`` naming the field."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from memory.errors import InvalidInput, NotFound
from memory.models import CodeAnchor, Entry
from memory.models.choices import (
    ID_MAX,
    TITLE_MAX,
    AnchorStatus,
    EntryType,
    RelationshipType,
    SignificanceType,
    Source,
    Tier,
    ValidationStatus,
)

TAG_MAX = 100
TAGS_PER_ENTRY_MAX = 50
ANCHORS_PER_ENTRY_MAX = 100
LINKS_PER_WRITE_MAX = 100
INT32_MAX = 2_147_483_647  # PositiveIntegerField on PostgreSQL


def normalise_content(text: str) -> str:
    """The form content is hashed in: NFC, Unix newlines, no trailing spaces, trimmed."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip()


def content_hash(text: str) -> str:
    return hashlib.sha256(normalise_content(text).encode("utf-8")).hexdigest()


def valid_choice(value: Any, choices: Iterable[str], field: str, *, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or value not in set(choices):
        raise InvalidInput(f"{field}: {value!r} is not one of {sorted(choices)}")
    return value


def _unit(value: Any, field: str, low: float = 0.0, high: float = 1.0) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{field}: must be a number between {low} and {high}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise InvalidInput(f"{field}: is outside {low}..{high}") from None
    if not (low <= number <= high):
        raise InvalidInput(f"{field}: {value} is outside {low}..{high}")
    return number


def valid_text(value: Any, field: str, max_len: int, *, required: bool = False) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InvalidInput(f"{field}: must be a string")
    if "\x00" in value:
        raise InvalidInput(f"{field}: must not contain NUL characters")
    if required and not value.strip():
        raise InvalidInput(f"{field}: must not be empty")
    if len(value) > max_len:
        raise InvalidInput(f"{field}: {len(value)} characters, at most {max_len} allowed")
    return value


def clean_tag_names(tags: Iterable[Any] | None) -> list[str]:
    names: dict[str, None] = {}
    for raw in tags or []:
        if not isinstance(raw, str):
            raise InvalidInput("tags: every tag must be a string")
        name = raw.strip()
        if "\x00" in name:
            raise InvalidInput("tags: must not contain NUL characters")
        if not name:
            continue
        if len(name) > TAG_MAX:
            raise InvalidInput(f"tags: {name[:20]!r}… is longer than {TAG_MAX} characters")
        names.setdefault(name, None)
    if len(names) > TAGS_PER_ENTRY_MAX:
        raise InvalidInput(f"tags: at most {TAGS_PER_ENTRY_MAX} per entry")
    return list(names)


@dataclass(frozen=True)
class AnchorIn:
    path: str
    repo: str = ""
    commit: str = ""
    line_start: int | None = None
    line_end: int | None = None
    content_hash: str = ""
    status: str = AnchorStatus.VALID

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> AnchorIn:
        if not isinstance(data, Mapping):
            raise InvalidInput("anchors: each anchor must be an object")
        path = valid_text(data.get("path"), "anchors.path", 1000, required=True)
        lines = []
        for name in ("line_start", "line_end"):
            value = data.get(name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT32_MAX
            ):
                raise InvalidInput(f"anchors.{name}: must be a positive integer")
            lines.append(value)
        if lines[0] is not None and lines[1] is not None and lines[1] < lines[0]:
            raise InvalidInput("anchors: line_end is before line_start")
        return cls(
            path=path,
            repo=valid_text(data.get("repo"), "anchors.repo", 300),
            commit=valid_text(data.get("commit"), "anchors.commit", 64),
            line_start=lines[0],
            line_end=lines[1],
            content_hash=valid_text(data.get("content_hash"), "anchors.content_hash", 64),
            status=valid_choice(
                data.get("status") or AnchorStatus.VALID, AnchorStatus.values, "anchors.status"
            ),
        )

    def row(self, entry: Entry) -> CodeAnchor:
        return CodeAnchor(
            workspace_id=entry.workspace_id,
            entry=entry,
            repo=self.repo,
            path=self.path,
            commit=self.commit,
            line_start=self.line_start,
            line_end=self.line_end,
            content_hash=self.content_hash,
            status=self.status,
        )


# Fields a writer may set, with their validators.
def validate_writable(data: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    validators: dict[str, Any] = {
        "title": lambda v: valid_text(v, "title", TITLE_MAX),
        "project": lambda v: valid_text(v, "project", 200),
        "session_key": lambda v: valid_text(v, "session_key", 200),
        "external_id": lambda v: None if v is None else valid_text(v, "external_id", 200, required=True),
        "entry_type": lambda v: valid_choice(v, EntryType.values, "entry_type"),
        "tier": lambda v: valid_choice(v, Tier.values, "tier"),
        "source": lambda v: valid_choice(v, Source.values, "source"),
        "impact_score": lambda v: _unit(v, "impact_score"),
        "trust_score": lambda v: _unit(v, "trust_score"),
        "validation_status": lambda v: valid_choice(v, ValidationStatus.values, "validation_status"),
        "significance_type": lambda v: valid_choice(
            v or None, SignificanceType.values, "significance_type", allow_none=True
        ),
        "salience": lambda v: _unit(v, "salience", 0.25, 2.0),
        "pinned": lambda v: valid_bool(v, "pinned"),
        "expires_at": lambda v: _datetime(v, "expires_at"),
        "metadata": lambda v: _mapping(v, "metadata"),
    }
    for name, value in data.items():
        if name not in validators:
            raise InvalidInput(f"{name}: not a writable field")
        out[name] = validators[name](value)
    return out


def valid_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{field}: must be true or false")
    return value


def _datetime(value: Any, field: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInput(f"{field}: must be a datetime")
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value.astimezone(UTC)  # as the database gives it back


def _mapping(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{field}: must be an object")
    # PostgreSQL's jsonb refuses NUL characters anywhere in the document.
    if "\\u0000" in json.dumps(value):
        raise InvalidInput(f"{field}: must not contain NUL characters")
    return dict(value)


def valid_entry_id(value: Any, field: str) -> int:
    """An entry id given in a request body; one no row can have is not found (not an error of
    the database driver)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{field}: must be an entry id")
    if not 0 < value <= ID_MAX:
        raise NotFound(f"entry {value} not found")
    return value


@dataclass(frozen=True)
class LinkIn:
    to_id: int
    type: str = RelationshipType.REFERENCES

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> LinkIn:
        if not isinstance(data, Mapping):
            raise InvalidInput("links: each link must be an object")
        to_id = valid_entry_id(data.get("to_id"), "links.to_id")
        return cls(
            to_id=to_id,
            type=valid_choice(data.get("type") or "references", RelationshipType.values, "links.type"),
        )
