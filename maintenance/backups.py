"""Workspace backups: one gzip-compressed JSON-lines file per backup.

Layout, one JSON object per line::

    {"kind": "header", "format": 1, "workspace": "acme", "created_at": "...", "reason": "manual"}
    {"kind": "workspace", "row": {"slug": ..., "name": ..., "created_at": ...}}
    {"kind": "entry", "row": {"id": 7, "title": ..., "supersedes_id": 3, ...}}   (every column)
    ...
    {"kind": "trailer", "counts": {"entry": 12, ...}, "sha256": "<hex of every line above>"}

Rows sit under ``row`` because a model has a column called ``kind``. A row carries every
concrete column by attname (foreign keys as ``*_id``) except the workspace, which the header
names; datetimes are ISO-8601 UTC strings. Nothing in the format depends on the database, so a
file written on SQLite restores into PostgreSQL and back.

Invariants:

- Files live in the ``backups`` storage (``maintenance.storage``; a folder per workspace),
  written, rotated and read only through it, so any machine reaching that storage can
  restore. A file appears under its final name only when complete (on a file system: written
  beside it, fsynced, renamed; elsewhere: uploaded whole); a failed backup leaves neither a
  file nor a Backup row. Writing and reading stream: a backup is never held in memory.
- A backup holds one workspace and nothing of any other.
- Restore checks the checksum and counts before it writes anything, runs in one transaction,
  never deletes a row, never touches another workspace's rows (an id held by another workspace
  refuses the restore, even with ``force``), and refuses to overwrite rows that changed after
  the backup was taken unless ``force`` is given.
- The workspace's maintenance runs travel with it, so tombstones, events and disputes still
  name their run after a restore (into another database too) and a restored run can be
  reverted. Runs are history: one the workspace still has is never overwritten, and one
  whose id another workspace holds is not restored (what pointed at it becomes null). A run
  in progress when the backup was taken (the run that wrote a pre-prune backup) comes back as
  it was then, ``running``; the next run of the workspace marks it ``failed`` (interrupted).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import queue
import re
import tempfile
import threading
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, partial
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple, Protocol

import orjson
from django.core.files import File
from django.core.files.storage import FileSystemStorage, Storage, storages
from django.core.management.color import no_style
from django.db import DataError, IntegrityError, connection, models, transaction
from django.utils import timezone

from maintenance.models import Backup, BackupReason, Dispute, MaintenanceRun
from memory import lifecycle
from memory.errors import InvalidInput, ServiceError
from memory.models import (
    CodeAnchor,
    Entry,
    EntryAccess,
    LifecycleEvent,
    Relationship,
    Tag,
    Tombstone,
    Workspace,
)
from memory.policy_model import MaintenancePolicy

logger = logging.getLogger(__name__)

FORMAT = 1
BACKUP_NAME_RE = re.compile(
    r"^(?P<reason>pre-prune|manual)-backup-(?P<stamp>\d{8}T\d{6}Z)(?:-(?P<n>\d+))?\.jsonl\.gz$"
)
_SLUG_RE = re.compile(r"^[-a-zA-Z0-9_]+$")
READ_CHUNK = 2000  # rows per round trip (and per write to the file) while backing up
Progress = Callable[[int], None]  # called with how many more rows were written or read
BATCH = 2000  # rows per lookup while restoring
WRITE_BATCH = 1000  # rows per executemany while restoring
_FILE_CHUNK = 1 << 20  # bytes per read while hashing a file


class BackupError(ServiceError):
    """A backup could not be written or read."""


class RestoreRefused(BackupError):
    """A restore would overwrite newer data or another workspace's rows; nothing was written."""

    status_code = 409


@dataclass(frozen=True)
class _Kind:
    """One row kind of the file: its model, the timestamps that move when one of its rows
    changes (how data newer than the backup is recognised), and its unique key besides the id
    (a row deleted and written again since the backup is matched by it)."""

    name: str
    model: type[models.Model]
    newer: tuple[str, ...] = ()
    natural: tuple[str, ...] = ()
    # History (runs): a row the workspace still has is left as it is (its outcome may only have
    # been written since: a pre-prune backup is taken in the middle of its run), and one whose
    # id another workspace holds is not restored (what points at it becomes null).
    history: bool = False

    @cached_property
    def fields(self) -> list[models.Field[Any, Any]]:
        return [f for f in self.model._meta.concrete_fields if f.attname != "workspace_id"]

    @cached_property
    def columns(self) -> list[str]:
        return [f.attname for f in self.fields]

    @cached_property
    def floats(self) -> list[str]:
        return [f.attname for f in self.fields if isinstance(f, models.FloatField)]

    @cached_property
    def runs(self) -> list[str]:
        """Columns pointing at a MaintenanceRun."""
        return [f.attname for f in self.fields if f.is_relation and f.related_model is MaintenanceRun]

    @property
    def scoped(self) -> bool:
        return self.model is not ENTRY_TAG


ENTRY_TAG: type[models.Model] = Entry.tags.through
# In file and restore order: a row points only at kinds above it (or at its own kind).
KINDS: tuple[_Kind, ...] = (
    _Kind("policy", MaintenancePolicy, newer=("updated_at",)),
    # Runs travel with the workspace: tombstones, events and disputes keep naming theirs, so
    # a restored run can still be reverted.
    _Kind("run", MaintenanceRun, history=True),
    _Kind("tag", Tag, natural=("name",)),
    _Kind(
        "entry",
        Entry,
        newer=("updated_at", "status_changed_at", "last_accessed_at", "reinforced_at", "feedback_at"),
    ),
    _Kind("entry_tag", ENTRY_TAG),
    _Kind(
        "relationship",
        Relationship,
        newer=("pruned_at",),
        natural=("from_entry_id", "to_entry_id", "type"),
    ),
    _Kind("anchor", CodeAnchor, newer=("checked_at",)),
    _Kind("access", EntryAccess, newer=("last_at",), natural=("lineage_id", "actor")),
    _Kind("tombstone", Tombstone, newer=("restored_at", "purged_at")),
    _Kind("event", LifecycleEvent, newer=("reverted_at",)),
    _Kind(
        "dispute",
        Dispute,
        newer=("resolved_at",),
        natural=("entry_a_id", "entry_b_id", "kind"),
    ),
)
KIND_BY_NAME = {k.name: k for k in KINDS}
# The kinds whose rows a restore matches by id and compares whole: an unchanged row's line is
# recognised by its bytes (``_Writer.unchanged_dropped``), without parsing it.
_BY_BYTES = frozenset(k.name for k in KINDS if not k.history and k.name not in ("policy", "entry_tag"))
WORKSPACE_KIND = "workspace"
_WORKSPACE_COLUMNS = ("slug", "name", "created_at")
ALL_KINDS = (WORKSPACE_KIND, *KIND_BY_NAME)


# --- encoding ------------------------------------------------------------------------------------


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def _encode(value: Any) -> Any:
    return _iso(value) if isinstance(value, datetime) else value


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return _iso(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _line(obj: dict[str, Any]) -> bytes:
    """One line of the file. orjson writes datetimes as ISO-8601 with their offset (the
    database's are UTC) and is several times faster than ``json`` on the entries' rows (the
    backup section of bench/reports/maintenance.md). It refuses integers beyond 64 bits, which
    a metadata object may hold: such a line is written by ``json``. It writes NaN and
    infinities as null: the float columns are checked first (``_finite``); metadata never
    holds them (refused on input), nor the JSON the engine writes itself (counts, ids and
    scores of finite inputs)."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        # allow_nan=False: NaN is not JSON, and another reader would refuse the file.
        return (json.dumps(obj, ensure_ascii=False, allow_nan=False, default=_default) + "\n").encode()


def _finite(kind: _Kind, row: dict[str, Any]) -> dict[str, Any]:
    for name in kind.floats:
        value = row[name]
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{kind.name} {row.get('id')}: {name} is {value}, which JSON cannot hold")
    return row


def _parse_datetime(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _chunks(items: list[Any], size: int = BATCH) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _detail(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    return str(exc) or type(exc).__name__


# --- writing -------------------------------------------------------------------------------------


def storage() -> Storage:
    """The ``backups`` storage (``maintenance.storage``): every backup is written, listed
    for rotation, deleted and read through it, never through a local path of its own."""
    return storages["backups"]


def stored_name(slug: str, file_name: str) -> str:
    """The backup's name in the storage: ``<workspace slug>/<file name>``."""
    # PurePosixPath(...).name: a row's name never leads out of the workspace's folder.
    return f"{slug}/{PurePosixPath(file_name).name}"


def _free_name(store: Storage, workspace: Workspace, reason: str, now: datetime) -> str:
    stem = f"{reason}-backup-{now.astimezone(UTC):%Y%m%dT%H%M%SZ}"
    taken = set(
        Backup.objects.filter(workspace=workspace, file_name__startswith=stem).values_list(
            "file_name", flat=True
        )
    )
    n = 1
    while True:
        name = f"{stem}.jsonl.gz" if n == 1 else f"{stem}-{n}.jsonl.gz"
        if name not in taken and not store.exists(stored_name(workspace.slug, name)):
            return name
        n += 1


class _Sink(Protocol):
    def write(self, data: bytes, /) -> object: ...


@contextmanager
def _snapshot() -> Iterator[None]:
    """One consistent view of the workspace across every table a backup reads.

    Under PostgreSQL's READ COMMITTED a write could land between two tables' reads (a link to
    an entry the file lacks, which would then not restore); REPEATABLE READ can only be set as
    a transaction's first statement, so only when this opens the transaction. SQLite
    transactions are serialisable already; but the project opens them IMMEDIATE (it takes the
    database's write lock at BEGIN, so that a read-then-write never fails to upgrade), and a
    backup only reads: when this opens the transaction on SQLite it is a DEFERRED one, a read
    snapshot under WAL that leaves the write lock to the API's writes meanwhile.
    """
    outermost = not connection.in_atomic_block
    if outermost and connection.vendor == "sqlite":
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("BEGIN DEFERRED")
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("COMMIT")  # nothing was written: this ends the snapshot
        return
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def _querysets(workspace: Workspace) -> Iterator[tuple[_Kind, models.QuerySet[Any, Any]]]:
    for kind in KINDS:
        manager = kind.model._default_manager
        if kind.scoped:
            yield kind, manager.filter(workspace=workspace)
        else:
            yield kind, manager.filter(entry__workspace=workspace)


# zlib's level 6 (gzip's own default): at the entries' rows it compresses twice as fast as
# level 9 into a file 3 % larger (bench/reports/maintenance.md, the backup section).
COMPRESS_LEVEL = 6
_QUEUED = 8  # chunks of READ_CHUNK lines waiting for the compressing thread, at most


class _Compressor:
    """Hashes, compresses and writes chunks of lines in a thread of its own, while the caller
    reads and serialises the next rows: zlib and hashlib release the GIL, so on two cores the
    compression costs no wall time the reading did not. A failure in the thread (a full disk)
    is raised to the caller at its next ``write`` or at ``close``."""

    def __init__(self, out: _Sink):
        self.out = out
        self.digest = hashlib.sha256()
        self.chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=_QUEUED)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._drain, name="backup-compressor", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while (data := self.chunks.get()) is not None:
            if self.error is not None:
                continue  # keep taking chunks, so that the caller never waits on a full queue
            try:
                self.digest.update(data)
                self.out.write(data)
            except BaseException as exc:  # handed to the caller
                self.error = exc

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def write(self, data: bytes) -> None:
        self._raise()
        self.chunks.put(data)

    def close(self) -> str:
        """Wait for every chunk to be written; the sha256 of what was written."""
        self.chunks.put(None)
        self.thread.join()
        self._raise()
        return self.digest.hexdigest()

    def abandon(self) -> None:
        """Stop the thread after a failure of the caller's (the caller's error is the one raised)."""
        self.error = self.error or RuntimeError("abandoned")
        self.chunks.put(None)
        self.thread.join()


def _write_lines(
    out: _Sink, workspace: Workspace, reason: str, now: datetime, progress: Progress | None = None
) -> dict[str, int]:
    """Write header, rows and trailer to ``out``; returns the row count per kind."""
    header = {
        "kind": "header",
        "format": FORMAT,
        "workspace": workspace.slug,
        "created_at": _iso(now),
        "reason": reason,
    }
    counts = dict.fromkeys(ALL_KINDS, 0)
    compressor = _Compressor(out)  # its thread ends in close() or abandon(), below

    def emit(lines: list[bytes]) -> None:
        compressor.write(b"".join(lines))
        if progress is not None:
            progress(len(lines))

    try:
        with _snapshot():
            ws_row = {c: getattr(workspace, c) for c in _WORKSPACE_COLUMNS}
            emit([_line(header), _line({"kind": WORKSPACE_KIND, "row": ws_row})])
            counts[WORKSPACE_KIND] = 1
            for kind, queryset in _querysets(workspace):
                batch: list[bytes] = []
                # The iterator stays inline: held by a name, its server-side cursor would outlive
                # the transaction on an error (the traceback keeps the frame) and fail to close.
                for row in queryset.order_by("pk").values(*kind.columns).iterator(chunk_size=READ_CHUNK):
                    batch.append(_line({"kind": kind.name, "row": _finite(kind, row)}))
                    if len(batch) == READ_CHUNK:
                        emit(batch)
                        counts[kind.name] += len(batch)
                        batch = []
                emit(batch)
                counts[kind.name] += len(batch)
    except BaseException:
        compressor.abandon()
        raise
    digest = compressor.close()
    out.write(_line({"kind": "trailer", "counts": counts, "sha256": digest}))
    return counts


class _Hashing:
    """A binary sink that hashes and counts the compressed bytes on their way to ``out``: the
    file's sha256 and size without reading it back."""

    def __init__(self, out: Any):
        self.out = out
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def _fsync_dir(folder: str) -> None:
    # The rename is durable only once the directory entry is on disk too.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _local_path(store: Storage, name: str) -> str | None:
    """Where a file system storage keeps ``name``; None for any other storage (some answer
    ``path()`` without keeping files there: the in-memory one)."""
    return str(store.path(name)) if isinstance(store, FileSystemStorage) else None


def _save(store: Storage, name: str, fill: Callable[[_Hashing], Any]) -> tuple[str, int, str, Any]:
    """Write a file of the storage by ``fill(sink)``, streamed; returns (its name in the
    storage, size, sha256, what ``fill`` returned). The file appears under its name only
    when complete: on a file system it is written beside its final name, fsynced and renamed;
    on another storage it is spooled to a local temporary file and then saved whole (an
    object store shows an object only once its upload completes)."""
    local = _local_path(store, name)
    if local is not None:
        folder = os.path.dirname(local)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(local)}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as raw:
                sink = _Hashing(raw)
                result = fill(sink)
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(tmp, local)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        try:
            _fsync_dir(folder)
        except BaseException:
            Path(local).unlink(missing_ok=True)
            raise
        return name, sink.size, sink.digest.hexdigest(), result
    with tempfile.TemporaryFile() as spool:
        sink = _Hashing(spool)
        result = fill(sink)
        spool.flush()
        spool.seek(0)
        saved = store.save(name, File(spool, name=name))
    return saved, sink.size, sink.digest.hexdigest(), result


def write_backup(
    workspace: Workspace,
    *,
    reason: str = BackupReason.MANUAL,
    now: datetime | None = None,
    run: MaintenanceRun | None = None,
    progress: Progress | None = None,
) -> Backup:
    """Write a backup of ``workspace`` and record it as a Backup row.

    Any failure (folder, disk, permissions, a value that cannot be serialised) raises
    BackupError and leaves no file and no row. After a pre-prune backup only the newest
    ``backups_keep`` pre-prune backups of the workspace are kept; manual ones are never
    deleted automatically.
    """
    if reason not in BackupReason.values:
        raise InvalidInput(f"reason: must be one of {', '.join(BackupReason.values)}")
    now = now or timezone.now()
    store = storage()
    saved: str | None = None

    def fill(sink: _Hashing) -> dict[str, int]:
        # filename="" and mtime=0: the gzip header names neither the temp file nor a time.
        with gzip.GzipFile(
            filename="", mode="wb", fileobj=sink, mtime=0, compresslevel=COMPRESS_LEVEL
        ) as out:
            return _write_lines(out, workspace, reason, now, progress)

    try:
        name = _free_name(store, workspace, reason, now)
        saved, size, sha256, counts = _save(store, stored_name(workspace.slug, name), fill)
        with transaction.atomic():
            backup = Backup.objects.create(
                workspace=workspace,
                file_name=PurePosixPath(saved).name,
                reason=reason,
                size_bytes=size,
                entry_count=counts["entry"],
                sha256=sha256,
                run=run,
                created_at=now,
            )
    except BaseException as exc:
        if saved is not None:
            with suppress(Exception):
                store.delete(saved)
        if isinstance(exc, BackupError) or not isinstance(exc, Exception):
            raise
        raise BackupError(f"backup of workspace {workspace.slug!r} failed: {_detail(exc)}") from exc

    if reason == BackupReason.PRE_PRUNE:
        keep = MaintenancePolicy.for_workspace(workspace).backups_keep
        _drop_old(workspace, Backup.objects.filter(reason=BackupReason.PRE_PRUNE), keep, strict=False)
    return backup


def _drop_old(
    workspace: Workspace, queryset: models.QuerySet[Backup], keep: int, *, strict: bool
) -> list[str]:
    """Delete the files and rows of all but the newest ``keep`` backups in ``queryset``.

    A file that cannot be deleted keeps its row (so it stays listed); with ``strict`` that is
    an error, otherwise (retention after a pre-prune backup, which must not fail the run that
    wrote it) a logged warning.
    """
    old = list(queryset.filter(workspace=workspace).order_by("-created_at", "-pk")[keep:])
    store = storage()
    deleted: list[Backup] = []
    failed: list[str] = []
    for backup in old:
        try:
            store.delete(stored_name(workspace.slug, backup.file_name))  # a missing file is no error
        except Exception as exc:  # OSError on a file system, the backend's own errors elsewhere
            failed.append(f"{backup.file_name} ({_detail(exc)})")
            continue
        deleted.append(backup)
    Backup.objects.filter(pk__in=[b.pk for b in deleted]).delete()
    names = [b.file_name for b in deleted]
    if failed:
        message = f"could not delete {len(failed)} backup file(s): {', '.join(failed)}"
        if strict:
            raise BackupError(f"{message}; deleted {len(names)}: {', '.join(names) or 'none'}")
        logger.warning("workspace %s: %s", workspace.slug, message)
    return names


def list_backups(workspace: Workspace) -> list[Backup]:
    """The workspace's backups, newest first."""
    return list(Backup.objects.filter(workspace=workspace).order_by("-created_at", "-pk"))


def cleanup_backups(workspace: Workspace, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` backups (any reason), files and rows; returns the
    deleted names."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise InvalidInput("keep: must be a whole number of at least 1")
    return _drop_old(workspace, Backup.objects.all(), keep, strict=True)


# --- reading -------------------------------------------------------------------------------------

Header = dict[str, Any]
Rows = dict[str, list[dict[str, Any]]]


Loads = Callable[[bytes], Any]


def _json_loads(raw: bytes) -> Any:
    return json.loads(raw.decode("utf-8"))  # UTF-8 only (json.loads would guess from the bytes)


def _parse_line(raw: bytes, loads: Loads = _json_loads) -> dict[str, Any]:
    data = loads(raw)
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise ValueError("not an object with a kind")
    return data


def _parse_or_empty(raw: bytes | None) -> dict[str, Any]:
    try:
        return _parse_line(raw or b"")
    except ValueError:
        return {}


class _Counted(NamedTuple):
    header: Header
    trailer: dict[str, Any]


# How this version writes a row's line (orjson: no spaces, the id first): the writing scan of
# a restore reads the kind and id of such a line without parsing the rest
# (``_Writer.unchanged_dropped``). An id fits in 64 bits: 18 digits at most here.
_ROW_START = re.compile(rb'\{"kind":"([a-z_]+)","row":\{"id":(\d{1,18}),')


def _lines(handle: Any) -> Iterator[bytes]:
    """The lines of a decompressed stream, each with its newline (but a last line without
    one), read a megabyte at a time: iterating over a GzipFile costs a Python call per line,
    a tenth of a restore's time."""
    rest = b""
    while block := handle.read(_FILE_CHUNK):
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line + b"\n"
    if rest:
        yield rest


class _Raw(NamedTuple):
    """A row line the writing scan has not parsed: its id and its bytes."""

    pk: int
    line: bytes


def _scan(
    path: Source,
    on_row: Callable[[str, dict[str, Any]], None],
    progress: Progress | None = None,
    *,
    on_line: Callable[[str, _Raw], None] | None = None,
    loads: Loads = _json_loads,
) -> _Counted:
    """Stream a backup file once, calling ``on_row(kind, row)`` for each well-formed row in file
    order, and verify it as a whole at the end: (header, trailer, rows per kind). With
    ``on_line``, a row line of a kind in ``_BY_BYTES`` written as this version writes it is
    handed over unparsed instead, as ``on_line(kind, _Raw(id, line))`` (the writing scan of a
    file the verifying scan has read whole). ``loads``: orjson's for a scan that only checks
    the rows and keeps their ids (three times faster, but it reads integers beyond 64 bits as
    floats: a scan whose rows are written keeps json's).

    Raises BackupError when the file is unreadable, truncated (no trailer), altered (checksum
    mismatch), inconsistent (counts mismatch) or not in a format this version reads. The rows
    were handed out before that verdict: a caller that writes them does so in a transaction that
    the error rolls back (or verifies the file in an earlier scan).
    """
    digest = hashlib.sha256()
    found = dict.fromkeys(ALL_KINDS, 0)
    header: Header | None = None
    previous: bytes | None = None
    problem: str | None = None  # the first malformed line, reported only if the checksum holds
    number = 0
    try:
        with _open(path) as stored, gzip.GzipFile(fileobj=stored, mode="rb") as handle:
            for raw in _lines(handle):
                if previous is not None:
                    digest.update(previous)
                    row: Any = None
                    start = _ROW_START.match(previous) if on_line is not None and number > 1 else None
                    kind = start[1].decode() if start is not None else ""
                    if start is not None and on_line is not None and kind in _BY_BYTES:
                        found[kind] += 1
                        on_line(kind, _Raw(int(start[2]), previous))
                    else:
                        try:
                            data = _parse_line(previous, loads)
                            if number == 1:
                                header = data
                            else:
                                kind, row = data["kind"], data.get("row")
                                if kind not in KIND_BY_NAME and kind != WORKSPACE_KIND:
                                    raise ValueError(f"unknown kind {kind!r}")
                                if not isinstance(row, dict):
                                    raise ValueError("no row")
                                found[kind] += 1
                        except ValueError as exc:  # JSON and UTF-8 errors included
                            problem = problem or f"line {number}: {exc}"
                            row = None
                        if isinstance(row, dict):  # outside the try: the caller's errors are its own
                            on_row(kind, row)
                number += 1
                previous = raw
                if progress is not None and number % READ_CHUNK == 0:
                    progress(READ_CHUNK)
    except FileNotFoundError:
        raise BackupError(f"{path}: no such backup file") from None
    except EOFError:
        raise BackupError(f"{path}: truncated (the compressed data ends early)") from None
    except (OSError, zlib.error) as exc:
        raise BackupError(f"{path}: not a readable backup ({_detail(exc)})") from None

    trailer = _parse_or_empty(previous) if previous is not None and number > 1 else {}
    if trailer.get("kind") != "trailer":
        first = header if header is not None else _parse_or_empty(previous)
        if first.get("kind") != "header":
            raise BackupError(f"{path}: not a backup file")
        raise BackupError(f"{path}: truncated (no trailer)")
    if trailer.get("sha256") != digest.hexdigest():
        raise BackupError(f"{path}: checksum mismatch")
    if problem:
        raise BackupError(f"{path}: malformed {problem}")
    if header is None or header.get("kind") != "header":
        raise BackupError(f"{path}: not a backup file (no header)")
    if header.get("format") != FORMAT:
        raise BackupError(f"{path}: unsupported format {header.get('format')!r}")
    stated = trailer.get("counts")
    if (
        not isinstance(stated, dict)
        or {k: stated.get(k, 0) for k in found} != found
        or set(stated) - set(found)
    ):
        raise BackupError(f"{path}: counts mismatch (the file holds {_counts_text(found)})")
    return _Counted(header, trailer)


def read_backup(path: Source, progress: Progress | None = None) -> tuple[Header, Rows, dict[str, Any]]:
    """Read and verify a whole backup file into memory: (header, rows by kind, trailer). For
    inspecting a file; a restore streams it instead (``_scan``). Raises BackupError as
    ``_scan`` does."""
    rows: Rows = {name: [] for name in ALL_KINDS}
    scanned = _scan(path, lambda kind, row: rows[kind].append(row), progress)
    return scanned.header, rows, scanned.trailer


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in counts.items() if n) or "nothing"


# --- restoring -----------------------------------------------------------------------------------


class _Update(NamedTuple):
    row: dict[str, Any]  # the backed-up values, with the id of the row they overwrite
    columns: tuple[str, ...]  # the columns whose values differ


@dataclass
class _Plan:
    kind: _Kind
    inserts: list[dict[str, Any]] = field(default_factory=list)
    updates: list[_Update] = field(default_factory=list)
    newer: int = 0
    clashes: int = 0
    remap: dict[int, int] = field(default_factory=dict)  # backup id → id of the matched row


@dataclass(frozen=True)
class StoredBackup:
    """A backup file in the ``backups`` storage, by its name there (``<slug>/<file>``)."""

    name: str

    def __str__(self) -> str:
        return self.name


Source = StoredBackup | str | Path  # a stored backup, or a file of this machine (a copy)
_STORED_NAME_RE = re.compile(r"^[-a-zA-Z0-9_]+/[^/]+$")


def resolve_backup(file: str, workspace_slug: str | None = None) -> Source:
    """What ``file`` names: a backup in the storage — a bare file name of the workspace's
    backups (with ``workspace_slug``) or ``<slug>/<file name>`` — else a local file path (a
    copy of a backup, e.g. downloaded from the storage)."""
    store = storage()
    names = []
    if workspace_slug and _SLUG_RE.match(workspace_slug) and PurePosixPath(file).name == file:
        names.append(stored_name(workspace_slug, file))
    if _STORED_NAME_RE.match(file) and ".." not in file:
        names.append(file)
    for name in names:
        try:
            if store.exists(name):
                return StoredBackup(name)
        except Exception:  # a name the storage refuses is simply not one of its backups
            logger.debug("backup storage has no %r", name, exc_info=True)
    return Path(file)


def stored_backup(backup: Backup) -> StoredBackup:
    return StoredBackup(stored_name(backup.workspace.slug, backup.file_name))


def _file_name(source: Source) -> str:
    return PurePosixPath(str(source)).name


@contextmanager
def _open(source: Source) -> Iterator[Any]:
    if isinstance(source, StoredBackup):
        with storage().open(source.name, "rb") as handle:
            yield handle
    else:
        with open(source, "rb") as handle:
            yield handle


def _check_row(name: str, row: dict[str, Any]) -> str | None:
    """What is wrong with a row of the file, if anything: a column this version does not know,
    no id, or a datetime that does not parse."""
    if name == WORKSPACE_KIND:
        known, dates = _WORKSPACE_CHECK
    else:
        known, dates = _KIND_CHECKS[name]
    unknown = set(row) - known
    if unknown:
        return f"{name} row: unknown column(s) {', '.join(sorted(unknown))}"
    if name != WORKSPACE_KIND and (isinstance(row.get("id"), bool) or not isinstance(row.get("id"), int)):
        return f"{name} row: no id"
    for column in dates & set(row):
        if row[column] is None:
            continue
        try:
            _parse_datetime(row[column])
        except (TypeError, ValueError):
            return f"{name} row {row.get('id')}: {column} is not a date-time"
    return None


_WORKSPACE_CHECK = (frozenset(_WORKSPACE_COLUMNS), frozenset({"created_at"}))
# Columns that files of earlier versions carry and this one no longer restores: an entry's
# retention and when it was scored (now kept apart, in ``EntryScore``, and recomputed from the
# entry's restored inputs by the next sweep). Read and left aside.
_RETIRED_COLUMNS = {"entry": frozenset({"retention", "scored_at"})}
_KIND_CHECKS = {
    k.name: (
        frozenset(f.attname for f in k.fields) | _RETIRED_COLUMNS.get(k.name, frozenset()),
        frozenset(f.attname for f in k.fields if isinstance(f, models.DateTimeField)),
    )
    for k in KINDS
}


def _changed(kind: _Kind, row: dict[str, Any], existing: dict[str, Any]) -> tuple[str, ...]:
    # A column the file lacks (written before the column existed) is left as it is.
    return tuple(c for c in kind.columns if c != "id" and c in row and row[c] != _encode(existing[c]))


def _is_newer(kind: _Kind, existing: dict[str, Any], taken_at: datetime) -> bool:
    return any(existing.get(f) is not None and existing[f] > taken_at for f in kind.newer)


def _plan_rows(
    kind: _Kind,
    rows: list[dict[str, Any]],
    ws_id: int | None,
    taken_at: datetime,
    leaving: set[int] | frozenset[int] = frozenset(),
    known: Mapping[int, dict[str, Any]] | None = None,
    before_read: Callable[[], None] = lambda: None,
) -> _Plan:
    """Match backup rows to existing ones: by id within the workspace, then by the natural key
    within the workspace; an id held by another workspace is a clash; the rest are inserted.
    ``leaving``: entries the restore already made not latest, compared as they were.
    ``known``: rows of this workspace the caller has read already (``kind.columns`` by id):
    only the other ids are looked up."""
    plan = _Plan(kind)
    manager = kind.model._default_manager
    wanted = ["workspace_id", *kind.columns]
    known = known or {}
    for chunk in _chunks(rows):
        by_pk = {r["id"]: {**known[r["id"]], "workspace_id": ws_id} for r in chunk if r["id"] in known}
        ask = [r["id"] for r in chunk if r["id"] not in by_pk]
        if ask:
            before_read()
            by_pk.update((r["id"], r) for r in manager.filter(pk__any_of=ask).values(*wanted))
        for pk in leaving.intersection(by_pk):
            by_pk[pk] = {**by_pk[pk], "is_latest": True}
        by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
        if kind.natural and ws_id is not None:
            before_read()
            first = kind.natural[0]
            lookup = {f"{first}__in": list({r.get(first) for r in chunk})}
            for existing in manager.filter(workspace_id=ws_id, **lookup).values(*wanted):
                by_key[tuple(_encode(existing[c]) for c in kind.natural)] = existing
        for row in chunk:
            match = by_pk.get(row["id"])
            if kind.history:
                if match is None:
                    plan.inserts.append(row)
                continue
            if match is not None and match["workspace_id"] != ws_id:
                clash, match = True, None
            else:
                clash = False
            if match is None and kind.natural:
                match = by_key.get(tuple(row.get(c) for c in kind.natural))
            if match is None:
                if clash:
                    plan.clashes += 1
                else:
                    plan.inserts.append(row)
                continue
            if match["id"] != row["id"]:
                plan.remap[row["id"]] = match["id"]
            changed = _changed(kind, row, match)
            if changed:
                plan.newer += _is_newer(kind, match, taken_at)
                plan.updates.append(_Update({**row, "id": match["id"]}, changed))
    return plan


def _plan_policy(rows: list[dict[str, Any]], ws_id: int | None, taken_at: datetime) -> _Plan:
    """One policy per workspace: matched by workspace; its id is kept only when free."""
    kind = KIND_BY_NAME["policy"]
    plan = _Plan(kind)
    for row in rows[:1]:
        existing = (
            MaintenancePolicy.objects.filter(workspace_id=ws_id).values(*kind.columns).first()
            if ws_id is not None
            else None
        )
        if existing is None:
            free = not MaintenancePolicy.objects.filter(pk=row["id"]).exists()
            plan.inserts.append(row if free else {**row, "id": None})
        elif changed := _changed(kind, row, existing):
            plan.newer += _is_newer(kind, existing, taken_at)
            plan.updates.append(_Update({**row, "id": existing["id"]}, changed))
    return plan


def _plan_entry_tags(rows: list[dict[str, Any]], tag_ids: dict[int, int]) -> _Plan:
    """Entry↔tag pairs are matched by the pair; a pair's id is kept only when free."""
    plan = _Plan(KIND_BY_NAME["entry_tag"])
    pairs = [{**r, "tag_id": tag_ids.get(r["tag_id"], r["tag_id"])} for r in rows]
    for chunk in _chunks(pairs):
        # A pair naming no integer entry matches nothing (its insert fails and refuses the file).
        entry_ids = list({r["entry_id"] for r in chunk if type(r["entry_id"]) is int})
        have = set(
            ENTRY_TAG._default_manager.filter(entry_id__any_of=entry_ids).values_list("entry_id", "tag_id")
        )
        used = set(
            ENTRY_TAG._default_manager.filter(pk__any_of=[r["id"] for r in chunk]).values_list(
                "pk", flat=True
            )
        )
        for row in chunk:
            if (row["entry_id"], row["tag_id"]) not in have:
                plan.inserts.append(row if row["id"] not in used else {**row, "id": None})
    return plan


# Columns whose Python value the database drivers take as it is.
_PLAIN_FIELDS = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.FloatField,
    models.BooleanField,
    models.ForeignKey,
)


def _adapter(f: models.Field[Any, Any]) -> Callable[[Any], Any] | None:
    """What turns a file value into a driver parameter (as get_db_prep_save would, minus the
    per-value field machinery that made the ORM's bulk writes take minutes for 20,000 rows)."""
    ops = connection.ops
    if isinstance(f, models.DateTimeField):
        return lambda v: ops.adapt_datetimefield_value(_parse_datetime(v) if isinstance(v, str) else v)
    if isinstance(f, models.JSONField):
        return partial(ops.adapt_json_value, encoder=f.encoder)
    if isinstance(f, _PLAIN_FIELDS):
        return None
    return partial(f.get_db_prep_save, connection=connection)


def _params(fields: list[models.Field[Any, Any]], rows: list[dict[str, Any]]) -> list[list[Any]]:
    adapters = [(f, _adapter(f)) for f in fields]
    out = []
    for row in rows:
        values = []
        for f, adapt in adapters:
            value = row[f.attname] if f.attname in row else f.get_default()
            values.append(value if adapt is None or value is None else adapt(value))
        out.append(values)
    return out


def _executemany(sql: str, params: list[list[Any]]) -> None:
    with connection.cursor() as cursor:
        for chunk in _chunks(params, WRITE_BATCH):
            cursor.executemany(sql, chunk)


def _insert(kind: _Kind, rows: list[dict[str, Any]], ws_id: int) -> None:
    """INSERT rows with the ids they carry, or with a new id where the plan set it to None:
    one prepared statement per batch."""
    qn = connection.ops.quote_name
    for keep_id in (True, False):
        group = [r for r in rows if (r["id"] is not None) == keep_id]
        if not group:
            continue
        fields = [f for f in kind.fields if keep_id or not f.primary_key]
        columns = [qn(f.column) for f in fields]
        params = _params(fields, group)
        if kind.scoped:
            columns.append(qn("workspace_id"))
            params = [[*values, ws_id] for values in params]
        placeholders = ", ".join(["%s"] * len(columns))
        _executemany(
            f"INSERT INTO {qn(kind.model._meta.db_table)} ({', '.join(columns)}) VALUES ({placeholders})",
            params,
        )


def _update(kind: _Kind, updates: list[_Update], ws_id: int) -> None:
    """UPDATE the changed columns of rows of this workspace (never another's): one prepared
    statement per set of changed columns and batch.

    Only changed columns: besides writing less, rewriting Entry.supersedes (a self-referencing
    foreign key) even to its own value makes SQLite's cost per row grow with the rows already
    updated in the transaction — minutes for 20,000 entries instead of seconds.
    """
    assert kind.scoped, "entry↔tag pairs are only ever inserted"
    qn = connection.ops.quote_name
    by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for update in updates:
        by_columns.setdefault(update.columns, []).append(update.row)
    for columns, rows in by_columns.items():
        fields = [f for f in kind.fields if f.attname in columns]
        if connection.vendor == "postgresql":
            _update_from_arrays(kind, fields, rows, ws_id)
            continue
        assignments = ", ".join(f"{qn(f.column)} = %s" for f in fields)
        params = [
            [*values, row["id"], ws_id] for values, row in zip(_params(fields, rows), rows, strict=True)
        ]
        _executemany(
            f"UPDATE {qn(kind.model._meta.db_table)} SET {assignments} "
            f"WHERE {qn('id')} = %s AND {qn('workspace_id')} = %s",
            params,
        )


def _update_from_arrays(
    kind: _Kind, fields: list[models.Field[Any, Any]], rows: list[dict[str, Any]], ws_id: int
) -> None:
    """PostgreSQL: the same UPDATE set-based, one statement per WRITE_BATCH rows, each column's
    values as one array parameter (``UPDATE … FROM unnest(ids, col1, …)``): the server plans and
    starts one statement per batch instead of one per row."""
    qn = connection.ops.quote_name
    names = [qn(f.column) for f in fields]
    arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
    sql = (
        f"UPDATE {qn(kind.model._meta.db_table)} AS t SET "
        + ", ".join(f"{n} = v.{n}" for n in names)
        + f" FROM unnest(%s::bigint[], {arrays}) AS v(restored_id, {', '.join(names)})"
        + f" WHERE t.{qn('id')} = v.restored_id AND t.{qn('workspace_id')} = %s"
    )
    floats = [isinstance(f, models.FloatField) for f in fields]
    with connection.cursor() as cursor:
        for chunk in _chunks(rows, WRITE_BATCH):
            values = _params(fields, chunk)
            # One Python type per array: a float column's whole numbers come back from JSON as int.
            columns = [
                [None if v[i] is None else float(v[i]) for v in values]
                if is_float
                else [v[i] for v in values]
                for i, is_float in enumerate(floats)
            ]
            cursor.execute(sql, [[row["id"] for row in chunk], *columns, ws_id])


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

    def __init__(self, ws_id: int, taken_at: datetime, index: _Index, *, force: bool):
        self.ws_id = ws_id
        self.taken_at = taken_at
        self.force = force
        self.index = index
        self.kind: str | None = None
        self.chunk: list[dict[str, Any] | _Raw] = []
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
        # Runs the restore inserts (no row anywhere has their id: history is never overwritten)
        # and runs of this workspace: references to any other run become null.
        existing: set[int] = set()
        for ids in _chunks(sorted(index.run_ids)):
            existing.update(MaintenanceRun.objects.filter(pk__in=ids).values_list("pk", flat=True))
        self.known_runs = index.run_ids - existing
        self.unknown_runs: set[int] = set()

    def __call__(self, name: str, row: dict[str, Any] | _Raw) -> None:
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
        for ids in _chunks([*demote, *sorted(self.leaving)]):
            Entry.objects.filter(workspace_id=self.ws_id, pk__any_of=ids).update(is_latest=False)

    def _detach_runs(self, kind: _Kind, rows: list[dict[str, Any]]) -> None:
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
        self, kind: _Kind, items: list[dict[str, Any] | _Raw]
    ) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
        """The chunk's rows, parsed, but for the lines equal byte for byte to the line their
        row of this workspace would be written as now: those rows are unchanged, and comparing
        the bytes costs a fraction of parsing the line and comparing every column. With them,
        the rows of this workspace it read (by id), for the planning not to read them again."""
        unparsed = [item.pk for item in items if isinstance(item, _Raw)]
        existing: dict[int, dict[str, Any]] = {}
        if unparsed:
            found = kind.model._default_manager.filter(workspace_id=self.ws_id, pk__any_of=unparsed)
            self.writes.wait()
            existing = {row["id"]: row for row in found.values(*kind.columns)}
        # The previous chunk's writes go now: the server runs them while this chunk is compared.
        self.writes.send()
        rows = []
        for item in items:
            if not isinstance(item, _Raw):
                rows.append(item)
                continue
            current = existing.get(item.pk)
            if current is not None and self._serialised(kind, item.pk, current) == item.line:
                continue
            rows.append(self._parsed(kind, item))
        return rows, existing

    def _serialised(self, kind: _Kind, pk: int, current: dict[str, Any]) -> bytes | None:
        """The line ``current`` would be written as, or None for an entry leaving its place as
        latest (compared as it was). A NaN would be written as null and equal a null of the
        file, but none can meet one: the nullable floats are range-checked by the database
        (NaN fails the check), and a backup refuses NaN, so a file has no null for a float
        that cannot be null."""
        if kind.name == "entry" and pk in self.leaving:
            return None
        return _line({"kind": kind.name, "row": current})

    def _parsed(self, kind: _Kind, item: _Raw) -> dict[str, Any]:
        """The row of a line the verifying scan checked — unless the file changed in between
        (which the end of the scan reports too): then the restore stops here."""
        try:
            data = _parse_line(item.line)
            row = data["row"]
            if data["kind"] != kind.name or not isinstance(row, dict) or row.get("id") != item.pk:
                raise ValueError("not the row its start names")
        except (ValueError, KeyError, TypeError):
            raise BackupError("the backup changed while it was restored; nothing was restored") from None
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
            plan = _plan_policy(rows, self.ws_id, self.taken_at)
        elif kind.name == "entry_tag":
            self.writes.wait()
            plan = _plan_entry_tags(rows, self.tag_ids)
        else:
            plan = _plan_rows(
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
        if plan.inserts:
            self.writes.hold(partial(_insert, kind, plan.inserts, self.ws_id))
        if plan.updates:
            self.writes.hold(partial(_update, kind, plan.updates, self.ws_id))
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

    The file is read twice, streamed: first verified whole (checksum, counts, every row's
    columns), then written chunk by chunk, so a restore holds a chunk of rows in memory, never
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
    scanned = _scan(path, index, progress, loads=orjson.loads)
    header = scanned.header
    if index.problem:
        raise BackupError(index.problem)
    slug = header.get("workspace")
    if not isinstance(slug, str) or not _SLUG_RE.match(slug):
        raise BackupError(f"{path}: the header names no valid workspace")
    if workspace_slug is not None and workspace_slug != slug:
        raise InvalidInput(f"{_file_name(path)} is a backup of workspace {slug!r}, not {workspace_slug!r}")
    try:
        taken_at = _parse_datetime(header["created_at"])
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
            created_at=_parse_datetime(created_at) if isinstance(created_at, str) else now,
        )
        if not index.policy:
            MaintenancePolicy.objects.create(workspace=workspace)

    writer = _Writer(workspace.pk, taken_at, index, force=force)
    try:
        # The file was verified; this scan checks it again at its end, and it must be that file.
        if _scan(path, writer, progress, on_line=writer).trailer.get("sha256") != verified:
            raise BackupError(f"{_file_name(path)} changed while it was restored; nothing was restored")
        writer.flush()
        writer.leave_latest()  # a backup without entries still counts the entries it keeps
        writer.writes.finish()
    except BaseException as exc:
        writer.writes.abandon(exc)
        raise

    if writer.clashes:
        raise RestoreRefused(
            f"refused: {sum(writer.clashes.values())} row(s) of {_file_name(path)} have ids held by another "
            f"workspace ({_counts_text(writer.clashes)}); nothing was restored"
        )
    newer = dict(writer.newer)
    if writer.demoted:
        newer["entry versions"] = writer.demoted
    if newer and not force:
        raise RestoreRefused(
            f"refused: {sum(newer.values())} row(s) changed after {_file_name(path)} was taken "
            f"({_counts_text(newer)}); use --force to overwrite them; nothing was restored"
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
