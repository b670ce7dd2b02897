"""Restoring a workspace from a backup file: a verifying scan, then a writing one.

Restore checks the checksum and counts before it writes anything (and every row it parses:
the verifying scan the rows it keeps ids of, the writing scan each line it does not find
unchanged; see ``_UNPARSED``), runs in one transaction,
never deletes a row, never touches another workspace's rows (an id held by another workspace
refuses the restore, even with ``force``), and refuses to overwrite rows that changed after the
backup was taken unless ``force`` is given. Runs are history: one the workspace still has is
never overwritten, one whose id another workspace holds is not restored (what pointed at it
becomes null); a run ``running`` in the file comes back so, and the workspace's next run marks
it ``failed``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import PurePosixPath
from typing import Any

import orjson
from django.core.management.color import no_style
from django.db import DataError, IntegrityError, connection, models, transaction
from django.utils import timezone

from maintenance import backup_files, hygiene_rank, rank_triggers
from maintenance.backup_files import (
    DIGESTED,
    KIND_BY_NAME,
    KINDS,
    READ_CHUNK,
    SLUG_RE,
    WORKSPACE_COLUMNS,
    WORKSPACE_KIND,
    BackupError,
    Kind,
    Progress,
    Raw,
    Source,
    counts_text,
    digest_sql,
)
from maintenance.backups import encode_line
from maintenance.models import MaintenanceRun
from maintenance.restore_rows import (
    BATCH,
    chunks,
    insert_rows,
    parse_datetime,
    plan_entry_tags,
    plan_policy,
    plan_rows,
    update_rows,
)
from memory import lifecycle
from memory.errors import InvalidInput
from memory.models import (
    Entry,
    Workspace,
)
from memory.policy_model import MaintenancePolicy


class RestoreRefused(BackupError):
    """A restore would overwrite newer data or another workspace's rows; nothing was written."""

    status_code = 409


def _file_name(source: Source) -> str:
    return PurePosixPath(str(source)).name


def _check_row(name: str, row: dict[str, Any]) -> str | None:
    """What is wrong with a row of the file, if anything: a column this version does not know,
    no id, or a datetime that does not parse."""
    known, dates, whole = _WORKSPACE_CHECK if name == WORKSPACE_KIND else _KIND_CHECKS[name]
    if row.keys() == whole:  # every column of this version, and no other: the usual row
        present = dates
    else:
        unknown = set(row) - known
        if unknown:
            return f"{name} row: unknown column(s) {', '.join(sorted(unknown))}"
        present = dates & set(row)
    if name != WORKSPACE_KIND and (isinstance(row.get("id"), bool) or not isinstance(row.get("id"), int)):
        return f"{name} row: no id"
    for column in present:
        if row[column] is None:
            continue
        try:
            parse_datetime(row[column])
        except (TypeError, ValueError):
            return f"{name} row {row.get('id')}: {column} is not a date-time"
    return None


# Per kind: the columns a row may have, its date-time columns, and the columns a row of this
# version has (compared first: most rows have exactly those, and comparing the keys with a
# set costs a fraction of building two sets per row for a million rows).
_WORKSPACE_CHECK = (frozenset(WORKSPACE_COLUMNS), frozenset({"created_at"}), frozenset(WORKSPACE_COLUMNS))
# Columns that files of earlier versions carry and this one no longer restores: an entry's
# retention and when it was scored (now kept apart, in ``EntryScore``, and recomputed from the
# entry's restored inputs by the next sweep). Read and left aside.
_RETIRED_COLUMNS = {"entry": frozenset({"retention", "scored_at"})}
_KIND_CHECKS = {
    k.name: (
        frozenset(f.attname for f in k.fields) | _RETIRED_COLUMNS.get(k.name, frozenset()),
        frozenset(f.attname for f in k.fields if isinstance(f, models.DateTimeField)),
        frozenset(f.attname for f in k.fields),
    )
    for k in KINDS
}


# The kinds whose lines the verifying scan only counts and hashes (``backup_files.scan``,
# ``counted``): it keeps nothing of their rows. The writing scan checks each such line it
# parses (``_Writer._parsed``); one it does not parse equals by its bytes the line of the
# workspace's row as this version writes it, or ends in that row's digest (the file's
# checksum covers both; a restore trusts a digest to describe its line) and is not written. Parsing and
# checking them in the first scan too was 5.4 of its 23.1 s at 1,000,000 entries.
_UNPARSED = DIGESTED - {"entry"}


class _Sorted:
    """A set of ids as a sorted array of 64-bit integers: 8 bytes an id where a Python set
    takes about 60 (a million entry ids: 8 MB, not 60)."""

    def __init__(self, ids: array[int]):
        self.ids = array("q", sorted(ids))

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        i = bisect_left(self.ids, value)
        return i < len(self.ids) and self.ids[i] == value


class _Index:
    """What the verifying scan keeps of a backup for the writing one: the workspace and policy
    rows, the run ids, the ids that decide which versions stay latest, and the first invalid
    row. Never the rows themselves."""

    def __init__(self) -> None:
        self.workspace: list[dict[str, Any]] = []
        self.policy = 0
        self.run_ids: set[int] = set()
        self.entry_ids: array[int] = array("q")
        self.not_latest_ids: array[int] = array("q")
        self.latest_lineages: array[int] = array("q")
        self.latest_without_lineage = False
        self.problem: str | None = None

    def __call__(self, name: str, row: dict[str, Any]) -> None:
        if self.problem is None:
            self.problem = _check_row(name, row)
        if self.problem is not None:
            return
        if name == WORKSPACE_KIND:
            self.workspace.append(row)
        elif name == "policy":
            self.policy += 1
        elif name == "run":
            self.run_ids.add(row["id"])
        elif name == "entry":
            self.entry_ids.append(row["id"])
            if "is_latest" not in row:
                return  # a column the file lacks is left as it is
            if not row["is_latest"]:
                self.not_latest_ids.append(row["id"])
            elif isinstance(row.get("lineage_id"), int):
                self.latest_lineages.append(row["lineage_id"])
            elif row.get("lineage_id") is None:
                self.latest_without_lineage = True


class _Writes:
    """A restore chunk's writes, held until the next chunk has read the rows it compares
    against, then sent without waiting for them: on PostgreSQL in pipeline mode, so the server
    writes one chunk while Python matches the next. Every other read waits for them first
    (``wait``); so does the end of the scan. SQLite runs them as they are sent."""

    def __init__(self) -> None:
        self.held: list[Callable[[], None]] = []
        self.pipe: Any = None  # psycopg's Pipeline while writes are in flight

    def hold(self, write: Callable[[], None]) -> None:
        self.held.append(write)

    def send(self) -> None:
        writes, self.held = self.held, []
        if writes and self.pipe is None and connection.vendor == "postgresql":
            pipe = connection.connection.pipeline()
            pipe.__enter__()
            self.pipe = pipe
        for write in writes:
            write()

    def wait(self) -> None:
        """Until every write sent is done; a write's error is raised here (as Django's)."""
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            with connection.wrap_database_errors:
                pipe.__exit__(None, None, None)

    def finish(self) -> None:
        self.send()
        self.wait()

    def abandon(self, exc: BaseException) -> None:
        """Leave pipeline mode on the way out of a failed restore (its transaction rolls back)."""
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            pipe.__exit__(type(exc), exc, exc.__traceback__)


class _Writer:
    """The writing scan of a restore: rows arrive in file order (a row points only at kinds
    above it), a kind's rows in chunks of BATCH, each chunk matched to the database and written
    before the next is read. What must be refused (clashes, newer rows) is counted on the way
    and refused at the end, in the same transaction, which the refusal rolls back."""

    def __init__(
        self,
        ws_id: int,
        taken_at: datetime,
        index: _Index,
        *,
        force: bool,
        marks: rank_triggers.Unmarked,
    ):
        self.ws_id = ws_id
        # The hygiene rank's marks, turned off once the entries written pass what a fold
        # takes one by one (``rank_triggers.unmarked``); the ones written before stay.
        self.marks = marks
        self.taken_at = taken_at
        self.force = force
        self.index = index
        self.kind: str | None = None
        self.chunk: list[dict[str, Any] | Raw] = []
        self.inserted = dict.fromkeys(KIND_BY_NAME, 0)
        self.overwritten = dict.fromkeys(KIND_BY_NAME, 0)
        self.newer: dict[str, int] = {}
        self.clashes: dict[str, int] = {}
        self.tag_ids: dict[int, int] = {}
        self.leaving: set[int] = set()
        self.demoted = self.kept = 0
        self.entries_seen = False
        self.touched: list[type[models.Model]] = []
        self.writes = _Writes()
        self.digests = backup_files.digests_exact()  # whether lines' digests can be trusted
        # Runs the restore inserts (no row anywhere has their id: history is never overwritten)
        # and runs of this workspace: references to any other run become null.
        existing: set[int] = set()
        for ids in chunks(sorted(index.run_ids)):
            existing.update(MaintenanceRun.objects.filter(pk__in=ids).values_list("pk", flat=True))
        self.known_runs = index.run_ids - existing
        self.unknown_runs: set[int] = set()

    def __call__(self, name: str, row: dict[str, Any] | Raw) -> None:
        if name == WORKSPACE_KIND:
            return
        if name != self.kind:
            self.flush()
            self.kind = name
            if name == "entry":
                self.leave_latest()
        self.chunk.append(row)
        if len(self.chunk) >= BATCH:
            self.flush()

    def leave_latest(self) -> None:
        """Before the first entry is written: versions written after the backup stop being
        latest where the backup has a latest version of their lineage (kept, counted as newer),
        and versions the backup holds as not latest stop being latest first, so that a lineage
        never has two latest rows, even within one statement (the index is checked row by row)."""
        if self.entries_seen:
            return
        self.entries_seen = True
        self.writes.wait()
        backup_ids = _Sorted(self.index.entry_ids)
        not_latest = _Sorted(self.index.not_latest_ids)
        lineages = _Sorted(self.index.latest_lineages)
        demote: list[int] = []
        rows = Entry.objects.filter(workspace_id=self.ws_id).values_list("pk", "lineage_id", "is_latest")
        for pk, lineage, is_latest in rows.iterator(chunk_size=READ_CHUNK):
            if pk in backup_ids:
                if is_latest and pk in not_latest:
                    self.leaving.add(pk)
                continue
            self.kept += 1
            in_lineage = lineage in lineages if lineage is not None else self.index.latest_without_lineage
            if is_latest and in_lineage:
                demote.append(pk)
        self.demoted = len(demote)
        if self.refused:
            return
        for ids in chunks([*demote, *sorted(self.leaving)]):
            Entry.objects.filter(workspace_id=self.ws_id, pk__any_of=ids).update(is_latest=False)

    def _detach_runs(self, kind: Kind, rows: list[dict[str, Any]]) -> None:
        if not kind.runs:
            return
        ids = {r[c] for r in rows for c in kind.runs if r.get(c) is not None}
        ask = ids - self.known_runs - self.unknown_runs
        if ask:
            self.writes.wait()
            runs = MaintenanceRun.objects.filter(workspace_id=self.ws_id, pk__in=ask)
            mine = set(runs.values_list("pk", flat=True))
            self.known_runs |= mine
            self.unknown_runs |= ask - mine
        for r in rows:
            for c in kind.runs:
                if r.get(c) is not None and r[c] not in self.known_runs:
                    r[c] = None

    @property
    def refused(self) -> bool:
        """Whether the restore will be refused (an id of another workspace; newer data without
        force): from then on the scan only counts, so that no write can fail in its place."""
        return bool(self.clashes) or (not self.force and bool(self.newer or self.demoted))

    def unchanged_dropped(
        self, kind: Kind, items: list[dict[str, Any] | Raw]
    ) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
        """The chunk's rows, parsed, but for the lines equal byte for byte to the line their
        row of this workspace would be written as now: those rows are unchanged, and comparing
        the bytes costs a fraction of parsing the line and comparing every column. (A line
        written on PostgreSQL holds its JSON as the database prints it, which this does not
        write: such a line is told unchanged by its digest, or else parsed and compared.) With them,
        the rows of this workspace it read (by id), for the planning not to read them again."""
        items, differ = self._digest_dropped(kind, items)
        if kind.name == "entry_tag":  # matched by their pair (``plan_entry_tags``), not by bytes
            self.writes.send()
            return [self._parsed(kind, i) if isinstance(i, Raw) else i for i in items], {}
        unparsed = [item.pk for item in items if isinstance(item, Raw)]
        existing: dict[int, dict[str, Any]] = {}
        if unparsed:
            found = kind.model._default_manager.filter(workspace_id=self.ws_id, pk__any_of=unparsed)
            self.writes.wait()
            existing = {row["id"]: row for row in found.values(*kind.columns)}
        # The previous chunk's writes go now: the server runs them while this chunk is compared.
        self.writes.send()
        rows = []
        for item in items:
            if not isinstance(item, Raw):
                rows.append(item)
                continue
            current = existing.get(item.pk)
            # A line whose digest differs from its row's is not compared by bytes: it differs.
            if (
                current is not None
                and item.pk not in differ
                and self._serialised(kind, item.pk, current) == item.line
            ):
                continue
            rows.append(self._parsed(kind, item))
        return rows, existing

    def _digest_dropped(
        self, kind: Kind, items: list[dict[str, Any] | Raw]
    ) -> tuple[list[dict[str, Any] | Raw], set[int]]:
        """The chunk but for the lines whose digest equals the digest of their row of this
        workspace now (``backup_files.digest_sql``): those rows have not changed since the
        backup, and the database tells so without sending them. With them, the ids whose row
        has a digest other than its line's: changed. An entry leaving its place as latest is
        compared as it was (``_serialised``), never by digest."""
        if not self.digests:
            return items, set()
        wanted = {
            item.pk
            for item in items
            if isinstance(item, Raw) and item.digest is not None and item.pk not in self.leaving
        }
        if not wanted:
            return items, set()
        qn = connection.ops.quote_name
        join, owner = "", "r"
        if not kind.scoped:  # entry↔tag pairs have no workspace of their own: it is their entry's
            join, owner = f" JOIN {qn(Entry._meta.db_table)} AS e ON e.{qn('id')} = r.{qn('entry_id')}", "e"
        sql = (
            f"SELECT r.{qn('id')}, {digest_sql(kind, 'r')} FROM {qn(kind.model._meta.db_table)} AS r{join}"
            f" WHERE {owner}.{qn('workspace_id')} = %s AND r.{qn('id')} = ANY(%s::bigint[])"
        )
        self.writes.wait()
        with connection.cursor() as cursor:
            # The ids as one array literal: the driver's own dumping of a list costs more.
            cursor.execute(sql, [self.ws_id, "{" + ",".join(map(str, wanted)) + "}"])
            now = dict(cursor.fetchall())

        kept: list[dict[str, Any] | Raw] = []
        matched: set[int] = set()
        for item in items:
            # Each line against its own digest (a file could repeat an id: each line stands alone).
            if isinstance(item, Raw) and item.pk in wanted and now.get(item.pk) == item.digest:
                matched.add(item.pk)
            else:
                kept.append(item)
        # Rows of the database whose every line in the chunk has another digest: changed.
        return kept, (wanted & now.keys()) - matched

    def _serialised(self, kind: Kind, pk: int, current: dict[str, Any]) -> bytes | None:
        """The line ``current`` would be written as, or None for an entry leaving its place as
        latest (compared as it was). A NaN would be written as null and equal a null of the
        file, but none can meet one: the nullable floats are range-checked by the database
        (NaN fails the check), and a backup refuses NaN, so a file has no null for a float
        that cannot be null."""
        if kind.name == "entry" and pk in self.leaving:
            return None
        return encode_line({"kind": kind.name, "row": current})

    def _parsed(self, kind: Kind, item: Raw) -> dict[str, Any]:
        """The row of a line the verifying scan counted, checked here when that scan did not
        (``_UNPARSED``: a bad row stops the restore, whose transaction rolls back) — unless the
        file changed in between (which the end of the scan reports too): then the restore
        stops here."""
        first_read = kind.name in _UNPARSED
        try:
            # As strict as the verifying scan's parse; integers beyond 64 bits exact.
            data = backup_files.parse_line(item.line, backup_files.exact_loads)
            row = data["row"]
            if data["kind"] != kind.name or not isinstance(row, dict) or row.get("id") != item.pk:
                raise ValueError("not the row its start names")
        except (ValueError, KeyError, TypeError, RecursionError):
            if first_read:  # bad, or changed meanwhile: nothing tells which
                raise BackupError(
                    f"{kind.name} row {item.pk}: not a valid line (the file is malformed or changed "
                    "while it was restored); nothing was restored"
                ) from None
            raise BackupError("the backup changed while it was restored; nothing was restored") from None
        if first_read and (problem := _check_row(kind.name, row)) is not None:
            raise BackupError(f"{problem}; nothing was restored")
        return row

    def flush(self) -> None:
        items, self.chunk = self.chunk, []
        if not items or self.kind is None:
            return
        kind = KIND_BY_NAME[self.kind]
        rows, existing = self.unchanged_dropped(kind, items)
        if not rows:
            return
        self._detach_runs(kind, rows)
        if kind.name == "policy":
            self.writes.wait()
            plan = plan_policy(rows, self.ws_id, self.taken_at)
        elif kind.name == "entry_tag":
            self.writes.wait()
            plan = plan_entry_tags(rows, self.tag_ids)
        else:
            plan = plan_rows(
                kind,
                rows,
                self.ws_id,
                self.taken_at,
                leaving=self.leaving,
                known=existing,
                before_read=self.writes.wait,
            )
        if kind.name == "tag":
            self.tag_ids.update(plan.remap)
        if plan.clashes:
            self.clashes[kind.name] = self.clashes.get(kind.name, 0) + plan.clashes
        if plan.newer:
            self.newer[kind.name] = self.newer.get(kind.name, 0) + plan.newer
        if self.refused:
            return  # the restore will be refused: nothing more is written, only counted
        if kind.name == "entry" and not self.marks.off:
            written = (
                self.inserted["entry"] + self.overwritten["entry"] + len(plan.inserts) + len(plan.updates)
            )
            if written > hygiene_rank.REBUILD_OVER:
                self.writes.wait()  # out of pipeline mode: the setting goes before these writes
                self.marks.begin()
        if plan.inserts:
            self.writes.hold(partial(insert_rows, kind, plan.inserts, self.ws_id))
        if plan.updates:
            self.writes.hold(partial(update_rows, kind, plan.updates, self.ws_id))
        self.inserted[kind.name] += len(plan.inserts)
        self.overwritten[kind.name] += len(plan.updates)
        if (plan.inserts or plan.updates) and kind.model not in self.touched:
            self.touched.append(kind.model)


def restore_backup(
    path: Source,
    *,
    workspace_slug: str | None = None,
    force: bool = False,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Bring a workspace back to the state of a backup file, in one transaction.

    The file is read twice, streamed: first verified whole (checksum, counts, the columns of
    the rows it keeps ids of; ``_UNPARSED``), then written chunk by chunk (each line parsed
    checked first), so a restore holds a chunk of rows in memory, never
    the file. Missing rows are inserted with their original ids; existing rows of the workspace
    are overwritten with the backed-up values; rows written after the backup are kept (a restore
    never deletes). Refused, with nothing written, when an id of the backup belongs to another
    workspace (always), or when a row that would be overwritten changed after the backup was
    taken (unless ``force``). A version written after the backup whose lineage the backup has a
    latest version of stops being latest, so that every lineage keeps exactly one.
    ``progress`` hears of the rows read by both scans.
    """
    now = now or timezone.now()
    index = _Index()
    scanned = backup_files.scan(path, index, progress, loads=orjson.loads, counted=_UNPARSED)
    header = scanned.header
    if index.problem:
        raise BackupError(index.problem)
    slug = header.get("workspace")
    if not isinstance(slug, str) or not SLUG_RE.match(slug):
        raise BackupError(f"{path}: the header names no valid workspace")
    if workspace_slug is not None and workspace_slug != slug:
        raise InvalidInput(f"{_file_name(path)} is a backup of workspace {slug!r}, not {workspace_slug!r}")
    try:
        taken_at = parse_datetime(header["created_at"])
    except (KeyError, TypeError, ValueError):
        raise BackupError(f"{path}: the header has no valid created_at") from None

    try:
        with transaction.atomic():
            return _restore(
                path,
                slug,
                index,
                verified=scanned.trailer["sha256"],
                taken_at=taken_at,
                force=force,
                now=now,
                progress=progress,
            )
    except (IntegrityError, DataError) as exc:
        raise BackupError(
            f"{_file_name(path)} does not fit the rows written since it was taken ({exc}); "
            "nothing was restored"
        ) from exc
    except RecursionError:  # a hand-made row's JSON nested deeper than it can be written
        raise BackupError(f"{_file_name(path)}: a row nests too deep; nothing was restored") from None


def _restore(
    path: Source,
    slug: str,
    index: _Index,
    *,
    verified: str,
    taken_at: datetime,
    force: bool,
    now: datetime,
    progress: Progress | None,
) -> dict[str, Any]:
    workspace = Workspace.objects.select_for_update().filter(slug=slug).first()
    created = workspace is None
    if workspace is None:
        ws_row = index.workspace[0] if index.workspace else {}
        created_at = ws_row.get("created_at")
        workspace = Workspace.objects.create(
            slug=slug,
            name=ws_row.get("name") or slug,
            created_at=parse_datetime(created_at) if isinstance(created_at, str) else now,
        )
        if not index.policy:
            MaintenancePolicy.objects.create(workspace=workspace)

    # Once it has written more entries than the hygiene rank folds one by one, the restore's
    # writes leave one mark for the workspace instead of one per row: the rank is rebuilt after.
    with rank_triggers.unmarked(workspace.pk, begin=False) as marks:
        writer = _Writer(workspace.pk, taken_at, index, force=force, marks=marks)
        try:
            # The file was verified; this scan checks it again at its end, and it must be that file.
            if backup_files.scan(path, writer, progress, on_line=writer).trailer.get("sha256") != verified:
                raise BackupError(f"{_file_name(path)} changed while it was restored; nothing was restored")
            writer.flush()
            writer.leave_latest()  # a backup without entries still counts the entries it keeps
            writer.writes.finish()
        except BaseException as exc:
            writer.writes.abandon(exc)  # out of pipeline mode before the transaction rolls back
            raise

    if writer.clashes:
        raise RestoreRefused(
            f"refused: {sum(writer.clashes.values())} row(s) of {_file_name(path)} have ids held by another "
            f"workspace ({counts_text(writer.clashes)}); nothing was restored"
        )
    newer = dict(writer.newer)
    if writer.demoted:
        newer["entry versions"] = writer.demoted
    if newer and not force:
        raise RestoreRefused(
            f"refused: {sum(newer.values())} row(s) changed after {_file_name(path)} was taken "
            f"({counts_text(newer)}); use --force to overwrite them; nothing was restored"
        )

    if writer.touched:
        # Inserted ids came from the file: move each sequence past them (PostgreSQL; SQLite
        # keeps its own) so the next ordinary insert does not collide with a restored id.
        with connection.cursor() as cursor:
            for sql in connection.ops.sequence_reset_sql(no_style(), writer.touched):
                cursor.execute(sql)
        # Deferred foreign keys would otherwise fail only at commit, with a less useful message.
        connection.check_constraints(table_names=[m._meta.db_table for m in writer.touched])
    # Statuses, tombstones and events may all have changed: open pages are told after commit.
    lifecycle.announce(workspace.pk, count=writer.inserted["entry"] + writer.overwritten["entry"])

    return {
        "workspace": slug,
        "file": str(path),
        "created_workspace": created,
        "restored": writer.inserted,
        "overwritten": writer.overwritten,
        "demoted_versions": writer.demoted,
        "kept_newer": writer.kept,
    }
