"""Creating an entry: a new lineage with its tags, anchors, outgoing links, creation event and
stored scores, written at once (one statement on PostgreSQL) or not at all."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction

from memory import rawsql, scoring
from memory.errors import Conflict, InvalidInput
from memory.models import CodeAnchor, Entry, EntryScore, Relationship, Tag, Workspace
from memory.models.choices import (
    CAUSAL_TYPES,
    CONTENT_MAX,
    EXTERNAL_ID_UNIQUE,
    StagedClass,
    Status,
    ValidationStatus,
)
from memory.relationships import link_targets
from memory.write_input import (
    ANCHORS_PER_ENTRY_MAX,
    LINKS_PER_WRITE_MAX,
    AnchorIn,
    LinkIn,
    clean_tag_names,
    content_hash,
    valid_choice,
    valid_text,
    validate_writable,
)
from memory.writes import (
    SYSTEM_ACTOR,
    check_contradictions,
    checked_on_write,
    create_missing_tags,
    existing_tags,
    new_event,
    record_event,
    rescore_written,
    resolve_now,
    write_policy,
)

# Days a staged trace lives before it expires.
STAGED_TTL_DAYS = {
    StagedClass.PROCEDURAL: 60,
    StagedClass.CONCEPTUAL: 60,
    StagedClass.REFERENCE: 45,
    StagedClass.ANALOGICAL: 30,
    StagedClass.EVIDENCE: 14,
}


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
    now = resolve_now(now)
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
        targets = link_targets(workspace, [link.to_id for link in link_list])
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
        tags_found = existing_tags(workspace, tag_names)
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
                        rescore_written(workspace, linked, now)
                disputes: list[Any] = []
            else:
                with transaction.atomic():
                    tag_rows = create_missing_tags(workspace, tag_names) if tags_found is None else tags_found
                    _insert(entry, tag_rows, anchor_list, event)
                    if new_links:
                        Relationship.objects.bulk_create(_new_links(entry, new_links, actor, now))
                        rescore_written(workspace, linked, now)
                    disputes = check_contradictions(entry, now)
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


def _reserve_entry_id() -> int | None:
    """On PostgreSQL the next id of memory_entry, so a new lineage's first row is written with
    ``lineage_id`` = its id in its INSERT: an UPDATE after it would write the row and its
    thirteen index entries twice. None on SQLite, which has no sequence to draw from."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id'))", [Entry._meta.db_table])
        return int(cursor.fetchone()[0])


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
