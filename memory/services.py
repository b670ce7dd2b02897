"""Every write to memories goes through these functions.

Each is keyword-only, runs in one transaction, scopes every lookup to the workspace it is
given (another workspace's id is simply not found), changes a status only through
``memory.lifecycle`` (its LifecycleEvent, Tombstone and announcement with it), and refreshes the
stored scores of every entry whose score inputs it changed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import secrets
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from memory import holds, lifecycle, rawsql, scoring
from memory.errors import Conflict, InvalidInput, NotFound
from memory.models import (
    CAUSAL_TYPES,
    CONTENT_MAX,
    EXTERNAL_ID_UNIQUE,
    ID_MAX,
    LIVE_STATUSES,
    TITLE_MAX,
    VISIBLE_STATUSES,
    AnchorStatus,
    ApiKey,
    CodeAnchor,
    Entry,
    EntryAccess,
    EntryScore,
    EntryType,
    FeedbackSignal,
    HoldReason,
    KeyRole,
    LifecycleEvent,
    Membership,
    Relationship,
    RelationshipType,
    Role,
    SignificanceType,
    Source,
    StagedClass,
    Status,
    Tag,
    Tier,
    Tombstone,
    TombstoneReason,
    ValidationStatus,
    Workspace,
)
from memory.policy import PROPOSE, PolicyValues
from memory.policy_model import MaintenancePolicy
from memory.scoring import step_salience
from memory.scoring_db import rescore

SYSTEM_ACTOR = "system"

# Days a staged trace lives before it expires.
STAGED_TTL_DAYS = {
    StagedClass.PROCEDURAL: 60,
    StagedClass.CONCEPTUAL: 60,
    StagedClass.REFERENCE: 45,
    StagedClass.ANALOGICAL: 30,
    StagedClass.EVIDENCE: 14,
}
TAG_MAX = 100
TAGS_PER_ENTRY_MAX = 50
ANCHORS_PER_ENTRY_MAX = 100
LINKS_PER_WRITE_MAX = 100
INT32_MAX = 2_147_483_647  # PositiveIntegerField on PostgreSQL


# --- small helpers ------------------------------------------------------------------------


def normalise_content(text: str) -> str:
    """The form content is hashed in: NFC, Unix newlines, no trailing spaces, trimmed."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip()


def content_hash(text: str) -> str:
    return hashlib.sha256(normalise_content(text).encode("utf-8")).hexdigest()


def actor_for_user(user: Any) -> str:
    return f"user:{user.get_username()}"


def actor_for_key(key: ApiKey) -> str:
    return f"key:{key.prefix}"


def _now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


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


def tags_for_names(workspace: Workspace, names: Sequence[str]) -> list[Tag]:
    """The workspace's Tag rows for ``names`` (by name), creating missing ones: one query when
    all exist, three when some are new."""
    found = _existing_tags(workspace, names)
    return found if found is not None else _create_missing_tags(workspace, names)


def _existing_tags(workspace: Workspace, names: Sequence[str]) -> list[Tag] | None:
    """The workspace's Tag rows for ``names`` (by name) if all exist, else None: one
    statement, written once per vendor (every write runs it)."""
    if not names:
        return []
    match, params = rawsql.in_values(list(dict.fromkeys(names)))
    with connection.cursor() as cursor:
        cursor.execute(_existing_tags_sql(connection.vendor, match), [workspace.pk, *params])
        rows = cursor.fetchall()
    if len(rows) != len(set(names)):
        return None
    return [
        rawsql.instance(Tag, ["id", "workspace_id", "name"], [pk, workspace.pk, name]) for pk, name in rows
    ]


@functools.lru_cache(maxsize=64)
def _existing_tags_sql(vendor: str, match: str) -> str:
    pk, name = rawsql.quote("id"), rawsql.column(Tag, "name")
    return (
        f"SELECT {pk}, {name} FROM {rawsql.table(Tag)} WHERE {rawsql.column(Tag, 'workspace')} = %s"
        f" AND {name} {match} ORDER BY {name}"
    )


def _create_missing_tags(workspace: Workspace, names: Sequence[str]) -> list[Tag]:
    """Tag rows for ``names`` after a read found some missing: the missing ones are inserted
    (a concurrent writer's are kept) and all are read back (two queries)."""
    Tag.objects.bulk_create([Tag(workspace=workspace, name=n) for n in names], ignore_conflicts=True)
    return list(Tag.objects.filter(workspace=workspace, name__in=names))


def _reserve_entry_id() -> int | None:
    """On PostgreSQL the next id of memory_entry, so a new lineage's first row is written with
    ``lineage_id`` = its id in its INSERT: an UPDATE after it would write the row and its
    thirteen index entries twice. None on SQLite, which has no sequence to draw from."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id'))", [Entry._meta.db_table])
        return int(cursor.fetchone()[0])


def new_event(
    entry: Entry,
    *,
    from_status: str,
    to_status: str,
    reason: str,
    actor: str,
    now: datetime,
    run: Any = None,
    automatic: bool = False,
    details: Mapping[str, Any] | None = None,
) -> LifecycleEvent:
    """The lifecycle event of a change of ``entry`` (not saved)."""
    return LifecycleEvent(
        workspace_id=entry.workspace_id,
        entry=entry,
        entry_ref=entry.pk,
        from_status=from_status,
        to_status=to_status,
        reason=reason,
        actor=actor,
        run=run,
        automatic=automatic,
        created_at=now,
        details=dict(details or {}),
    )


def record_event(entry: Entry, **event: Any) -> LifecycleEvent:
    recorded = new_event(entry, **event)
    recorded.save(force_insert=True)
    return recorded


def write_policy(workspace: Workspace) -> PolicyValues:
    """The workspace's policy for a write's scores: as the request's API key lookup read it
    (``memory.auth``, the same request: fresh, and no second query), else read now."""
    read = workspace.__dict__.get("policy_at_auth")
    return read if isinstance(read, PolicyValues) else MaintenancePolicy.for_workspace(workspace)


def _rescore(workspace: Workspace, ids: Iterable[int], now: datetime) -> None:
    rescore(workspace, ids, now=now, params=write_policy(workspace).decay_params)


def link_partners(entry_ids: Iterable[int]) -> set[int]:
    """Ids at the other end of every link touching ``entry_ids`` — these entries included where
    they are linked to each other. One statement, each half an index lookup with the ids as one
    array: an OR of two 2,000-id lists took 75 ms a batch in a whole-run revert."""
    ids = list(entry_ids)
    if not ids:
        return set()
    out = Relationship.objects.filter(from_entry_id__any_of=ids).values_list("to_entry_id", flat=True)
    inc = Relationship.objects.filter(to_entry_id__any_of=ids).values_list("from_entry_id", flat=True)
    return set(out.union(inc, all=True))


def neighbour_ids(entry_ids: Iterable[int]) -> set[int]:
    """Ids at the other end of every link touching ``entry_ids`` (their importance counts them)."""
    ids = list(entry_ids)
    return link_partners(ids) - set(ids)


# --- workspaces, members and keys ---------------------------------------------------------


def workspace_create(*, slug: str, name: str = "", review_mode: str | None = None) -> Workspace:
    """A workspace with its policy row. ``review_mode`` defaults to propose: nothing
    is archived or tombstoned before an operator has approved it."""
    from django.core.exceptions import ValidationError
    from django.core.validators import validate_slug

    try:
        validate_slug(slug)
    except ValidationError:
        raise InvalidInput(f"slug: {slug!r} may contain only letters, digits, '-' and '_'") from None
    with transaction.atomic():
        if Workspace.objects.filter(slug=slug).exists():
            raise Conflict(f"workspace {slug!r} already exists")
        workspace = Workspace.objects.create(slug=slug, name=name or slug)
        MaintenancePolicy.objects.create(workspace=workspace, review_mode=review_mode or PROPOSE)
    return workspace


def workspace_get(slug: str) -> Workspace:
    try:
        return Workspace.objects.get(slug=slug)
    except Workspace.DoesNotExist:
        raise NotFound(f"workspace {slug!r} not found") from None


def membership_set(*, workspace: Workspace, user: Any, role: str) -> Membership:
    valid_choice(role, Role.values, "role")
    membership, _ = Membership.objects.update_or_create(
        user=user, workspace=workspace, defaults={"role": role}
    )
    return membership


def api_key_create(
    *, workspace: Workspace, name: str, role: str, actor: str = SYSTEM_ACTOR
) -> tuple[ApiKey, str]:
    """Create a key and return it with its secret, which is never stored and never shown again."""
    valid_choice(role, KeyRole.values, "role")
    valid_text(name, "name", 100, required=True)
    raw = "msk_" + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        workspace=workspace,
        name=name,
        role=role,
        prefix=raw[:12],
        secret_hash=hash_key(raw),
        created_by=actor,
    )
    return key, raw


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def api_key_revoke(*, workspace: Workspace, key_id: int, now: datetime | None = None) -> ApiKey:
    key = ApiKey.objects.filter(workspace=workspace, pk=key_id).first()
    if key is None:
        raise NotFound(f"api key {key_id} not found")
    if key.revoked_at is None:
        key.revoked_at = _now(now)
        key.save(update_fields=["revoked_at"])
    return key


# --- entries ------------------------------------------------------------------------------


def entry_get(*, workspace: Workspace, entry_id: Any) -> Entry:
    """Any version of an entry of this workspace; another workspace's id is not found."""
    try:
        pk = int(entry_id)
    except (TypeError, ValueError):
        raise NotFound(f"entry {entry_id!r} not found") from None
    entry = Entry.objects.filter(workspace=workspace, pk=pk).first()
    if entry is None:
        raise NotFound(f"entry {pk} not found")
    return entry


def _latest_for_write(workspace: Workspace, entry_id: Any) -> Entry:
    entry = entry_get(workspace=workspace, entry_id=entry_id)
    if not entry.is_latest:
        latest = Entry.objects.filter(
            workspace=workspace, lineage_id=entry.lineage_id, is_latest=True
        ).first()
        raise Conflict(f"entry {entry.pk} is an old version; the latest is {latest.pk if latest else 'gone'}")
    return entry


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
        "pinned": lambda v: _bool(v, "pinned"),
        "expires_at": lambda v: _datetime(v, "expires_at"),
        "metadata": lambda v: _mapping(v, "metadata"),
    }
    for name, value in data.items():
        if name not in validators:
            raise InvalidInput(f"{name}: not a writable field")
        out[name] = validators[name](value)
    return out


def _bool(value: Any, field: str) -> bool:
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


def _entry_id(value: Any, field: str) -> int:
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
        to_id = _entry_id(data.get("to_id"), "links.to_id")
        return cls(
            to_id=to_id,
            type=valid_choice(data.get("type") or "references", RelationshipType.values, "links.type"),
        )


def entry_create(
    *,
    workspace: Workspace,
    content: str,
    actor: str = SYSTEM_ACTOR,
    tags: Iterable[str] | None = None,
    anchors: Iterable[Mapping[str, Any]] | None = None,
    links: Iterable[Mapping[str, Any]] | None = None,
    staged_class: str | None = None,
    now: datetime | None = None,
    created_at: datetime | None = None,
    **fields: Any,
) -> Entry:
    """Create an entry (a new lineage) with its tags, anchors and outgoing links.

    ``staged_class`` makes it a staged trace with the class TTL; ``fields`` are the entry
    fields a writer may set. Nothing is written if any part is invalid.
    """
    now = _now(now)
    content = valid_text(content, "content", CONTENT_MAX, required=True)
    values = validate_writable(fields)
    tag_names = clean_tag_names(tags)
    anchor_list = [AnchorIn.parse(a) for a in (anchors or [])]
    link_list = [LinkIn.parse(link) for link in (links or [])]
    if len(anchor_list) > ANCHORS_PER_ENTRY_MAX:
        raise InvalidInput(f"anchors: at most {ANCHORS_PER_ENTRY_MAX} per entry")
    if len(link_list) > LINKS_PER_WRITE_MAX:
        raise InvalidInput(f"links: at most {LINKS_PER_WRITE_MAX} per write")
    if staged_class is not None:
        valid_choice(staged_class, StagedClass.values, "staged_class")
    created = created_at or now

    # PostgreSQL: the reads run before the write (READ COMMITTED: inside its transaction they
    # would see the same). SQLite: reads and write share one IMMEDIATE transaction, under the
    # write lock, so no writer changes a target in between.
    with contextlib.nullcontext() if connection.vendor == "postgresql" else transaction.atomic():
        external_id = values.get("external_id")
        if (
            external_id
            and Entry.objects.filter(workspace=workspace, external_id=external_id, is_latest=True).exists()
        ):
            raise Conflict(f"external_id {external_id!r} already exists in this workspace")
        targets = _link_targets(workspace, [link.to_id for link in link_list])
        # Each (latest target, type) once: two ids of one lineage, or a link given twice, make
        # one link (an identical link is not duplicated).
        new_links = list(dict.fromkeys((targets[link.to_id].pk, link.type) for link in link_list))
        linked = sorted({target_id for target_id, _ in new_links})  # rescored with the write
        # A new entry's scores depend on its own fields and on the links it is created with (each
        # target is a live latest entry, so each counts): computed here and written with the
        # INSERT (the parity tests prove Python and SQL agree) instead of an UPDATE with the
        # relationship subqueries — most of the cost of a write.
        scores = _new_entry_scores(workspace, values, anchor_list, created, now, [t for _, t in new_links])
        entry = Entry(
            workspace=workspace,
            content=content,
            content_hash=content_hash(content),
            status=Status.STAGED if staged_class else Status.ACTIVE,
            staged_class=staged_class,
            ttl_expires_at=created + timedelta(days=STAGED_TTL_DAYS[StagedClass(staged_class)])
            if staged_class
            else None,
            created_at=created,
            updated_at=now,
            status_changed_at=created,
            importance=scores["importance"],
            **values,
        )
        entry.score = EntryScore(retention=scores["retention"], scored_at=now)
        tags_found = _existing_tags(workspace, tag_names)
        event = {"from_status": "", "to_status": entry.status, "reason": "create", "actor": actor, "now": now}
        try:
            if _in_one_statement(entry, tags_found):
                # Atomic by itself; inside a caller's transaction, or followed by the targets'
                # rescore, it runs in a transaction (a savepoint inside a caller's, as the ORM
                # route's atomic() takes), so a failure leaves nothing and the caller usable.
                with (
                    transaction.atomic()
                    if new_links or connection.in_atomic_block
                    else contextlib.nullcontext()
                ):
                    _insert_in_one_statement(
                        entry, tags_found or [], anchor_list, _new_links(entry, new_links, actor, now), event
                    )
                    if linked:
                        _rescore(workspace, linked, now)
                disputes: list[Any] = []
            else:
                with transaction.atomic():
                    tag_rows = (
                        _create_missing_tags(workspace, tag_names) if tags_found is None else tags_found
                    )
                    _insert(entry, tag_rows, anchor_list, event)
                    if new_links:
                        Relationship.objects.bulk_create(_new_links(entry, new_links, actor, now))
                        _rescore(workspace, linked, now)
                    disputes = _check_contradictions(entry, now)
        except IntegrityError as exc:  # a concurrent writer took the external id first
            if external_id and _violates_external_id(exc):
                raise Conflict(f"external_id {external_id!r} already exists in this workspace") from None
            raise
    entry.disputes = disputes  # type: ignore[attr-defined]  # named by the API response
    return entry


def _violates_external_id(exc: IntegrityError) -> bool:
    """The error is the unique external id's: by constraint name on PostgreSQL, by columns on
    SQLite (whose message names them)."""
    diag = getattr(exc.__cause__, "diag", None)
    if diag is not None:
        return bool(diag.constraint_name == EXTERNAL_ID_UNIQUE)
    return str(exc).endswith("memory_entry.workspace_id, memory_entry.external_id")


def _in_one_statement(entry: Entry, tags_found: list[Tag] | None) -> bool:
    """The common write on PostgreSQL (no new tags, nothing to check for contradictions) is
    one statement; the rest goes through the ORM in a transaction."""
    return connection.vendor == "postgresql" and tags_found is not None and not checked_on_write(entry)


def checked_on_write(entry: Entry) -> bool:
    """A write of this entry is checked for contradictions before it returns: a live latest
    constitutional entry, or a rule an operator wrote."""
    return (
        entry.is_latest
        and entry.status in VISIBLE_STATUSES
        and (
            entry.tier == Tier.CONSTITUTIONAL
            or (entry.source == Source.OPERATOR and entry.entry_type == EntryType.RULE)
        )
    )


class WriteCheck(Protocol):
    """What checks a written rule against the workspace's others: returns the open disputes
    the entry is part of."""

    def check_on_write(self, entry: Entry, *, now: datetime | None = None) -> list[Any]: ...


# The contradiction check of ``checked_on_write`` entries. The detector and its disputes belong
# to maintenance, which installs it when the app is ready (``MaintenanceConfig.ready``): the
# domain calls it without importing maintenance. Without one installed nothing is checked.
_write_checks: list[WriteCheck] = []


def install_write_check(check: WriteCheck) -> None:
    if check not in _write_checks:
        _write_checks.append(check)


def _insert(
    entry: Entry, tag_rows: Sequence[Tag], anchors: Sequence[AnchorIn], event: dict[str, Any]
) -> None:
    """A new entry's row, tag links, anchors and creation event, through the ORM (inside the
    caller's transaction)."""
    entry.pk = entry.lineage_id = _reserve_entry_id()
    entry.save(force_insert=entry.pk is not None)
    if entry.lineage_id is None:  # SQLite: the id is known once the row exists
        entry.lineage_id = entry.pk
        Entry.objects.filter(pk=entry.pk).update(lineage_id=entry.pk)
    entry.score.entry = entry
    entry.score.save(force_insert=True)
    if tag_rows:  # a new entry has no tags yet: insert the links without tags.set()'s diff
        Entry.tags.through.objects.bulk_create(
            [Entry.tags.through(entry_id=entry.pk, tag_id=tag.pk) for tag in tag_rows]
        )
    entry.__dict__["_tag_names"] = [tag.name for tag in tag_rows]
    if anchors:
        CodeAnchor.objects.bulk_create([a.row(entry) for a in anchors])
    record_event(entry, **event)


def _insert_in_one_statement(
    entry: Entry,
    tag_rows: Sequence[Tag],
    anchors: Sequence[AnchorIn],
    links: Sequence[Relationship],
    event: dict[str, Any],
) -> None:
    """PostgreSQL: what ``_insert`` and the links' INSERT write, as one statement
    (data-modifying CTEs: the row with an id drawn from the sequence, which is also its
    lineage; its tag links, anchors, outgoing links and creation event), atomic by itself:
    no BEGIN/COMMIT round trips (unless links follow with their targets' rescore) and nothing
    for the ORM to compile. Every value is prepared as the ORM prepares it
    (``rawsql.insert_values``); ``tests/test_services.py`` proves both routes write the same
    rows."""
    q = rawsql.quote
    drawn = "(SELECT id FROM n)"
    columns, values, params = rawsql.insert_values(entry, {"id": drawn, "lineage_id": drawn})
    parts = [
        f"n AS (SELECT nextval(pg_get_serial_sequence('{Entry._meta.db_table}', 'id')) AS id)",
        f"e AS (INSERT INTO {rawsql.table(Entry)} ({', '.join(columns)}) VALUES ({', '.join(values)})"
        f" RETURNING {q('id')})",
    ]
    if tag_rows:
        through = Entry.tags.through
        parts.append(
            f"t AS (INSERT INTO {rawsql.table(through)}"
            f" ({rawsql.column(through, 'entry')}, {rawsql.column(through, 'tag')})"
            f" SELECT e.{q('id')}, unnest(%s::bigint[]) FROM e)"
        )
        params.append([tag.pk for tag in tag_rows])
    created = "(SELECT id FROM e)"
    # One INSERT per table, its rows in the order given (the anchors keep their order).
    groups: list[tuple[list[Any], dict[str, str]]] = [
        ([a.row(entry) for a in anchors], {"entry_id": created}),
        (list(links), {"from_entry_id": created}),
        ([new_event(entry, **event)], {"entry_id": created, "entry_ref": created}),
        ([entry.score], {"entry_id": created}),
    ]
    for i, (rows, computed) in enumerate(group for group in groups if group[0]):
        tuples = []
        for row in rows:
            row_columns, row_values, row_params = rawsql.insert_values(row, computed)
            tuples.append(f"({', '.join(row_values)})")
            params.extend(row_params)
        parts.append(
            f"r{i} AS (INSERT INTO {rawsql.table(type(rows[0]))} ({', '.join(row_columns)})"
            f" VALUES {', '.join(tuples)})"
        )
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(parts)} SELECT {q('id')} FROM e", params)
        entry.pk = entry.lineage_id = int(cursor.fetchone()[0])
    entry._state.adding = False
    entry._state.db = connection.alias
    entry.__dict__["_tag_names"] = [tag.name for tag in tag_rows]


def _new_links(
    entry: Entry, new_links: Sequence[tuple[int, str]], actor: str, now: datetime
) -> list[Relationship]:
    """The links a new entry is created with (not saved). None of them can exist yet, nor be
    made concurrently (no other transaction sees the entry): inserted at once, without _link's
    checks."""
    return [
        Relationship(
            workspace_id=entry.workspace_id,
            from_entry_id=entry.pk,
            to_entry_id=target_id,
            type=type_,
            created_at=now,
            created_by=actor,
        )
        for target_id, type_ in new_links
    ]


def _new_entry_scores(
    workspace: Workspace,
    values: Mapping[str, Any],
    anchors: Sequence[AnchorIn],
    created: datetime,
    now: datetime,
    link_types: Sequence[str] = (),
) -> dict[str, Any]:
    """Stored scores of a new entry (never accessed) created with links of ``link_types``,
    each to a distinct live latest target: its importance and its retention."""
    worst = scoring.worst_anchor(a.status for a in anchors)
    age = (now - created).total_seconds() / 86400
    params = write_policy(workspace).decay_params
    return {
        "importance": scoring.importance(
            impact_score=values.get("impact_score"),
            significance_type=values.get("significance_type"),
            relationship_count=len(link_types),
            causal_count=sum(1 for t in link_types if t in CAUSAL_TYPES),
            age_days=age,
            trust_score=values.get("trust_score"),
            validation_status=values.get("validation_status") or ValidationStatus.NONE,
            anchor_status=worst,
        ),
        "retention": scoring.retention(
            age_days=age,
            access_count=0,
            days_since_access=None,
            salience=values.get("salience"),
            readers=0,
            params=params,
        ),
    }


_TARGET_FIELDS = ("id", "workspace_id", "lineage_id", "is_latest", "status")  # what a link needs


@functools.lru_cache(maxsize=64)
def _link_targets_sql(vendor: str, match: str) -> str:
    """Each asked id of the workspace with its lineage's latest version (none if the lineage
    has none): one statement whatever the ids, written once (compiling its ORM twin on every
    linked write cost more than running it)."""
    e, pk = rawsql.table(Entry), rawsql.quote("id")

    def c(name: str, alias: str) -> str:
        return f"{alias}.{rawsql.column(Entry, name)}"

    latest = ", ".join(c(name, "l") for name in _target_fields())
    return (
        f"SELECT x.{pk}, {latest} FROM {e} x LEFT JOIN {e} l"
        f" ON {c('lineage_id', 'l')} = {c('lineage_id', 'x')}"
        f" AND {c('workspace', 'l')} = {c('workspace', 'x')} AND {c('is_latest', 'l')}"
        f" WHERE {c('workspace', 'x')} = %s AND x.{pk} {match}"
    )


def _target_fields() -> list[str]:
    """``_TARGET_FIELDS`` in the model's field order (as ``Model.from_db`` takes them)."""
    return [f.attname for f in Entry._meta.concrete_fields if f.attname in _TARGET_FIELDS]


def _link_targets(workspace: Workspace, ids: Sequence[int]) -> dict[int, Entry]:
    """Latest versions for the given ids (an old version's id resolves to its lineage's
    latest), as Entry objects holding only what a link needs."""
    if not ids:
        return {}
    match, params = rawsql.in_values(sorted(set(ids)))
    with connection.cursor() as cursor:
        cursor.execute(_link_targets_sql(connection.vendor, match), [workspace.pk, *params])
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    missing = [i for i in ids if rows.get(i, (None,))[0] is None]
    if missing:  # every id is checked for existence before any for its state
        raise NotFound(f"entry {missing[0]} not found")
    names = _target_fields()
    found: dict[int, Entry] = {}
    for i in ids:
        target = rawsql.instance(Entry, names, rows[i])
        if target.status == Status.TOMBSTONED:
            raise Conflict(f"entry {i} is tombstoned; restore it before linking")
        found[i] = target
    return found


def _link(
    source: Entry, target: Entry, type_: str, *, actor: str, now: datetime
) -> tuple[Relationship, bool]:
    if source.pk == target.pk:
        raise InvalidInput("a memory cannot link to itself")
    existing = Relationship.objects.filter(from_entry=source, to_entry=target, type=type_).first()
    if existing is not None:
        if existing.pruned_at is not None:
            existing.pruned_at = None
            existing.save(update_fields=["pruned_at"])
        return existing, False
    try:
        with transaction.atomic():
            rel = Relationship.objects.create(
                workspace_id=source.workspace_id,
                from_entry=source,
                to_entry=target,
                type=type_,
                created_at=now,
                created_by=actor,
            )
    except IntegrityError:  # a concurrent writer made the same link first
        return Relationship.objects.get(from_entry=source, to_entry=target, type=type_), False
    return rel, True


def _check_contradictions(entry: Entry, now: datetime) -> list[Any]:
    """On write, a constitutional entry or an operator's rule is checked for contradictions
    before the write returns; the open disputes it is part of are returned."""
    if not checked_on_write(entry):
        return []
    return [dispute for check in _write_checks for dispute in check.check_on_write(entry, now=now)]


@dataclass(frozen=True)
class UpdateResult:
    entry: Entry
    new_version: bool
    supersedes: int | None
    disputes: tuple[Any, ...] = ()  # open disputes named by a checked write


def entry_update(
    *,
    workspace: Workspace,
    entry_id: Any,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
    content: str | None = None,
    tags: Iterable[str] | None = None,
    anchors: Iterable[Mapping[str, Any]] | None = None,
    **fields: Any,
) -> UpdateResult:
    """Update the latest version of an entry.

    Changed content adds a version: a new row with ``supersedes`` and the same lineage, the
    old row kept with ``is_latest = false``; links, anchors (unless replaced), tags and access
    history move to the new version, whose age starts now. Identical content changes the other
    fields in place and leaves the decay clock (``created_at``) alone.
    """
    now = _now(now)
    values = validate_writable(fields)
    tag_names = clean_tag_names(tags) if tags is not None else None
    anchor_list = [AnchorIn.parse(a) for a in anchors] if anchors is not None else None
    if content is not None:
        content = valid_text(content, "content", CONTENT_MAX, required=True)

    with transaction.atomic():
        old = _latest_for_write(workspace, entry_id)
        if old.status == Status.TOMBSTONED:
            raise Conflict(f"entry {old.pk} is tombstoned; restore it before updating")
        new_external = values.get("external_id")
        if (
            new_external
            and new_external != old.external_id
            and Entry.objects.filter(workspace=workspace, external_id=new_external, is_latest=True).exists()
        ):
            raise Conflict(f"external_id {new_external!r} already exists in this workspace")
        changed = content is not None and content_hash(content) != old.content_hash
        if not changed:
            entry = old
            for name, value in values.items():
                setattr(entry, name, value)
            entry.updated_at = now
            entry.save(update_fields=[*values.keys(), "updated_at"])
            if tag_names is not None:
                entry.tags.set(tags_for_names(workspace, tag_names))
            if anchor_list is not None:
                entry.anchors.all().delete()
                CodeAnchor.objects.bulk_create([a.row(entry) for a in anchor_list])
            _rescore(workspace, [entry.pk], now)
            text_or_kind = {"title", "tier", "source", "entry_type"} & values.keys()
            disputes = _check_contradictions(entry, now) if text_or_kind else []
            entry.refresh_from_db()
            return UpdateResult(entry=entry, new_version=False, supersedes=None, disputes=tuple(disputes))

        assert content is not None
        old_tags = list(old.tags.all()) if tag_names is None else tags_for_names(workspace, tag_names)
        Entry.objects.filter(pk=old.pk).update(is_latest=False, updated_at=now)
        new = Entry.objects.get(pk=old.pk)
        new.pk = None
        new.id = None
        new._state.adding = True
        for name, value in values.items():
            setattr(new, name, value)
        new.content = content
        new.content_hash = content_hash(content)
        new.supersedes_id = old.pk
        new.is_latest = True
        new.created_at = now
        new.updated_at = now
        new.review_kept_hash = ""
        # An operator's hold was a decision about the old content: the new version starts free.
        new.held_at = None
        new.held_by = ""
        new.hold_reason = ""
        new.save()  # in the old version's status: a change of it is recorded below
        new.tags.set(old_tags)
        Relationship.objects.filter(from_entry_id=old.pk).update(from_entry_id=new.pk)
        Relationship.objects.filter(to_entry_id=old.pk).update(to_entry_id=new.pk)
        if anchor_list is None:
            CodeAnchor.objects.filter(entry_id=old.pk).update(entry_id=new.pk)
        else:
            CodeAnchor.objects.bulk_create([a.row(new) for a in anchor_list])
        if new.status == Status.STALE:
            # An update is activity: a stale memory that is being rewritten is in use again.
            lifecycle.change_entry(new, Status.ACTIVE, reason="update", actor=actor, now=now)
        _rescore(workspace, [new.pk, *neighbour_ids([new.pk])], now)
        disputes = _check_contradictions(new, now)
    new.refresh_from_db()
    return UpdateResult(entry=new, new_version=True, supersedes=old.pk, disputes=tuple(disputes))


def entry_tombstone(
    *,
    workspace: Workspace,
    entry_id: Any,
    reason: str = TombstoneReason.MANUAL,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
    run: Any = None,
) -> Tombstone:
    """Soft-delete the latest version: status tombstoned plus a Tombstone whose purge_after
    is now + the workspace's purge grace. Nothing is removed until purge."""
    now = _now(now)
    valid_choice(reason, TombstoneReason.values, "reason")
    with transaction.atomic():
        entry = _latest_for_write(workspace, entry_id)
        if entry.status == Status.TOMBSTONED:
            raise Conflict(f"entry {entry.pk} is already tombstoned")
        grace = MaintenancePolicy.for_workspace(workspace).purge_grace_days
        lifecycle.change_entry(
            entry,
            Status.TOMBSTONED,
            reason=reason,
            actor=actor,
            now=now,
            run_id=getattr(run, "pk", run),
            tombstone=lifecycle.Tombstoning(reason, now + timedelta(days=grace)),
        )
        _rescore(workspace, [entry.pk, *neighbour_ids([entry.pk])], now)
    return Tombstone.objects.get(entry=entry, restored_at__isnull=True, purged_at__isnull=True)


def restore_target(entry: Entry) -> str:
    """The live status an entry returns to: the last staged/active status it left, else active."""
    # The whole lineage: a version made while archived has no event of its own leaving staged.
    versions = Entry.objects.filter(workspace_id=entry.workspace_id, lineage_id=entry.lineage_id or entry.pk)
    froms = (
        LifecycleEvent.objects.filter(
            Q(entry_ref=entry.pk) | Q(entry_ref__in=versions.values("pk")),
            workspace_id=entry.workspace_id,
        )
        .order_by("-created_at", "-pk")
        .values_list("from_status", flat=True)
    )
    for status in froms:
        if status in (Status.STAGED, Status.ACTIVE):
            return status
    return Status.ACTIVE


def entry_restore(
    *,
    workspace: Workspace,
    entry_id: Any,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
    reason: str = "restore",
) -> Entry:
    """Bring a stale, archived or tombstoned entry back to its previous live status."""
    now = _now(now)
    with transaction.atomic():
        entry = _latest_for_write(workspace, entry_id)
        if entry.status not in (Status.STALE, Status.ARCHIVED, Status.TOMBSTONED):
            raise Conflict(
                f"entry {entry.pk} is {entry.status}; "
                "only stale, archived or tombstoned entries can be restored"
            )
        # Out of the tombstone (its Tombstone closed) or the archive. The operator's decision
        # sticks: a hold, placed with the status, keeps every automatic pass away from it.
        lifecycle.change_entry(
            entry,
            restore_target(entry),
            reason=reason,
            actor=actor,
            now=now,
            details={"hold": HoldReason.RESTORE},
            columns=holds.columns(HoldReason.RESTORE, actor, now),
        )
        _rescore(workspace, [entry.pk, *neighbour_ids([entry.pk])], now)
    entry.refresh_from_db()
    return entry


def entry_release(
    *, workspace: Workspace, entry_id: Any, actor: str = SYSTEM_ACTOR, now: datetime | None = None
) -> Entry:
    """Clear an operator hold: automation may change the entry again."""
    entry = _latest_for_write(workspace, entry_id)
    return holds.release(workspace, entry, actor=actor, now=_now(now))


def entry_set_status(
    *,
    workspace: Workspace,
    entry_id: Any,
    status: str,
    reason: str,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
) -> Entry:
    """An operator's manual archive (or other non-deleting transition) of one entry."""
    now = _now(now)
    valid_choice(status, [Status.ACTIVE, Status.STALE, Status.ARCHIVED], "status")
    with transaction.atomic():
        entry = _latest_for_write(workspace, entry_id)
        if entry.status == Status.TOMBSTONED:
            raise Conflict(f"entry {entry.pk} is tombstoned; restore it first")
        if entry.status != status:
            lifecycle.change_entry(entry, status, reason=reason, actor=actor, now=now)
            _rescore(workspace, [entry.pk, *neighbour_ids([entry.pk])], now)
    return entry


def relationship_create(
    *,
    workspace: Workspace,
    from_id: Any,
    to_id: Any,
    type: str = RelationshipType.REFERENCES,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
) -> tuple[Relationship, bool]:
    """Link two entries of the workspace. Returns the link and whether it is new; an identical
    (from, to, type) is reported, not duplicated. Ids of old versions resolve to the latest."""
    now = _now(now)
    valid_choice(type, RelationshipType.values, "type")
    ids = [_entry_id(from_id, "from_id"), _entry_id(to_id, "to_id")]
    if ids[0] == ids[1]:
        raise InvalidInput("a memory cannot link to itself")
    with transaction.atomic():
        targets = _link_targets(workspace, ids)
        rel, created = _link(targets[ids[0]], targets[ids[1]], type, actor=actor, now=now)
        _rescore(workspace, [rel.from_entry_id, rel.to_entry_id], now)
    return rel, created


def relationship_delete(*, workspace: Workspace, relationship_id: Any, now: datetime | None = None) -> None:
    now = _now(now)
    with transaction.atomic():
        rel = Relationship.objects.filter(
            workspace=workspace, pk=_int_or_404(relationship_id, "relationship")
        ).first()
        if rel is None:
            raise NotFound(f"relationship {relationship_id} not found")
        ends = [rel.from_entry_id, rel.to_entry_id]
        rel.delete()
        _rescore(workspace, ends, now)


def _int_or_404(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise NotFound(f"{what} {value!r} not found") from None


def entry_record_access(
    *,
    workspace: Workspace,
    entry_id: Any,
    actor: str,
    dispatch: bool = False,
    now: datetime | None = None,
) -> Entry:
    """An actor read the entry; ``dispatch`` means it was injected into a real agent context
    (counts toward graduation). One counter row per (lineage, actor) gives readers."""
    now = _now(now)
    actor = valid_text(actor, "actor", 200, required=True)
    with transaction.atomic():
        entry = _latest_for_write(workspace, entry_id)
        if entry.status == Status.TOMBSTONED:
            raise Conflict(f"entry {entry.pk} is tombstoned")
        Entry.objects.filter(pk=entry.pk).update(
            access_count=F("access_count") + 1,
            retrieval_count=F("retrieval_count") + (1 if dispatch else 0),
            last_accessed_at=now,
        )
        lineage = entry.lineage_id or entry.pk
        updated = EntryAccess.objects.filter(lineage_id=lineage, actor=actor).update(
            count=F("count") + 1, last_at=now
        )
        if not updated:
            EntryAccess.objects.create(
                workspace=workspace,
                lineage_id=lineage,
                actor=actor,
                count=1,
                first_at=now,
                last_at=now,
            )
        entry.refresh_from_db()
        if entry.status == Status.STALE:
            lifecycle.change_entry(entry, Status.ACTIVE, reason="access", actor=actor, now=now)
        _rescore(workspace, [entry.pk], now)
    entry.refresh_from_db()
    return entry


def entry_reinforce(
    *, workspace: Workspace, entry_id: Any, actor: str = SYSTEM_ACTOR, now: datetime | None = None
) -> Entry:
    """Mark the memory as confirmed useful (staged traces need this or two dispatches to graduate)."""
    now = _now(now)
    with transaction.atomic():
        entry = _latest_for_write(workspace, entry_id)
        if entry.status == Status.TOMBSTONED:
            raise Conflict(f"entry {entry.pk} is tombstoned")
        entry.reinforced_at = now
        entry.updated_at = now
        entry.save(update_fields=["reinforced_at", "updated_at"])
        _rescore(workspace, [entry.pk], now)
    entry.refresh_from_db()
    return entry


def entry_feedback(
    *,
    workspace: Workspace,
    entry_id: Any,
    signal: str,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
) -> Entry:
    """Step salience by the signal; stale/wrong also flag the entry for review."""
    now = _now(now)
    valid_choice(signal, FeedbackSignal.values, "signal")
    with transaction.atomic():
        entry = _latest_for_write(workspace, entry_id)
        if entry.status == Status.TOMBSTONED:
            raise Conflict(f"entry {entry.pk} is tombstoned")
        default = MaintenancePolicy.for_workspace(workspace).salience_default
        entry.salience = step_salience(entry.salience, signal, default=default)
        entry.last_feedback = signal
        entry.feedback_at = now
        entry.updated_at = now
        entry.save(update_fields=["salience", "last_feedback", "feedback_at", "updated_at"])
        _rescore(workspace, [entry.pk], now)
    entry.refresh_from_db()
    return entry


def entry_set_pinned(
    *,
    workspace: Workspace,
    entry_id: Any,
    pinned: bool,
    actor: str = SYSTEM_ACTOR,
    now: datetime | None = None,
) -> Entry:
    now = _now(now)
    _bool(pinned, "pinned")
    with transaction.atomic():
        entry = _latest_for_write(workspace, entry_id)
        if entry.pinned != pinned:
            entry.pinned = pinned
            entry.updated_at = now
            entry.save(update_fields=["pinned", "updated_at"])
    return entry


__all__ = [
    "LIVE_STATUSES",
    "STAGED_TTL_DAYS",
    "SYSTEM_ACTOR",
    "api_key_create",
    "checked_on_write",
    "content_hash",
    "entry_create",
    "entry_feedback",
    "entry_record_access",
    "entry_reinforce",
    "entry_release",
    "entry_restore",
    "entry_set_pinned",
    "entry_tombstone",
    "entry_update",
    "relationship_create",
    "relationship_delete",
    "workspace_create",
]
