"""Writing a workspace's backup, listing its backups and rotating them.

A backup holds one workspace and nothing of any other, read in one consistent snapshot and
streamed to the ``backups`` storage (never held in memory). A file appears under its final name
only when complete (on a file system: written beside it, fsynced, renamed; elsewhere: uploaded
whole); a failed backup leaves neither a file nor a Backup row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import queue
import re
import tempfile
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import closing, contextmanager, suppress
from datetime import UTC, datetime
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import orjson
from django.core.files import File
from django.core.files.storage import FileSystemStorage, Storage
from django.db import connection, models, transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone
from isal import igzip

from maintenance.backup_files import (
    ALL_KINDS,
    DIGESTED,
    FORMAT,
    KINDS,
    READ_CHUNK,
    WORKSPACE_COLUMNS,
    WORKSPACE_KIND,
    BackupError,
    Kind,
    Progress,
    digest_sql,
    digests_exact,
    error_detail,
    storage,
    stored_name,
)
from maintenance.models import Backup, BackupReason, MaintenanceRun
from memory.errors import InvalidInput
from memory.models import (
    Workspace,
)
from memory.policy_model import MaintenancePolicy

logger = logging.getLogger(__name__)

BACKUP_NAME_RE = re.compile(
    r"^(?P<reason>pre-prune|manual)-backup-(?P<stamp>\d{8}T\d{6}Z)(?:-(?P<n>\d+))?\.jsonl\.gz$"
)


# --- encoding ------------------------------------------------------------------------------------


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def encode_value(value: Any) -> Any:
    return _iso(value) if isinstance(value, datetime) else value


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return _iso(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_line(obj: dict[str, Any]) -> bytes:
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


def _finite(kind: Kind, row: dict[str, Any]) -> dict[str, Any]:
    for name in kind.floats:
        value = row[name]
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{kind.name} {row.get('id')}: {name} is {value}, which JSON cannot hold")
    return row


# --- writing -------------------------------------------------------------------------------------


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


def _querysets(workspace: Workspace) -> Iterator[tuple[Kind, models.QuerySet[Any, Any]]]:
    for kind in KINDS:
        manager = kind.model._default_manager
        if kind.scoped:
            yield kind, manager.filter(workspace=workspace)
        else:
            yield kind, manager.filter(entry__workspace=workspace)


_DIGEST = "backup_row_digest"  # the name of the digest's column while a backup reads rows

# ISA-L's level 2 (of 0–3, its default): on the lines of a 1,000,000-entry workspace (2 GB)
# 3.3 s against zlib's 32.8 s at its level 6, into a file 13 % larger (359 MB against 318 MB);
# its level 3 took 10.2 s for 353 MB (bench/reports/maintenance.md, "Backups compressed by ISA-L").
COMPRESS_LEVEL = 2
_QUEUED = 8  # chunks of READ_CHUNK lines waiting for the compressing thread, at most


class _Compressor:
    """Hashes, compresses and writes chunks of lines in a thread of its own, while the caller
    reads and serialises the next rows: ISA-L and hashlib release the GIL, so on two cores the
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


_AHEAD = 1  # chunks fetched and waiting for the caller, at most (one more is on its way)


def _fetched_ahead(fetch: Callable[[], list[Any]]) -> Generator[list[Any]]:
    """The chunks ``fetch`` returns until an empty one, each next one fetched by a thread of
    its own while the caller works on this one. The driver releases the GIL while it waits on
    the database, so the database's producing of rows (their digests, a fetch of a
    server-side cursor) overlaps the caller's writing of them: at 1,000,000 entries the
    reading thread waited 22.5 s on fetches besides its 26 s of Python. The thread has
    stopped, and touches the cursor no more, when this generator is closed or raises."""
    ready: queue.Queue[list[Any] | BaseException] = queue.Queue(maxsize=_AHEAD)
    stop = threading.Event()

    def run() -> None:
        try:
            while not stop.is_set():
                rows = fetch()
                ready.put(rows)
                if not rows:
                    return
        except BaseException as exc:  # handed to the caller
            ready.put(exc)

    thread = threading.Thread(target=run, name="backup-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if isinstance(item, BaseException):
                raise item
            if not item:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # a put waiting on a full queue: take its chunk
            with suppress(queue.Empty):
                ready.get(timeout=0.01)
        thread.join()


def _fetched_here(fetch: Callable[[], list[Any]]) -> Generator[list[Any]]:
    while rows := fetch():
        yield rows


# Longer JSON text is parsed (by Django's converter) before it is written: a shorter one can
# neither nest deeper than a parser's limit (about 1,000 levels) nor hold an integer of more
# digits than Python converts (4,300), which the database accepts and a restore could not read.
_JSON_AS_TEXT_UP_TO = 2000


def _json_text(converters: list[Any]) -> Callable[[Any, Any, Any], Any]:
    """PostgreSQL sends jsonb as its text, validated and printed by the database in its one
    form: written into the line as it is (a fragment orjson copies), where Django would parse
    it with json — but for a long text, parsed as before by ``converters``, Django's own."""

    def convert(value: Any, expression: Any, connection: Any) -> Any:
        if value is None:
            return None
        if len(value) <= _JSON_AS_TEXT_UP_TO:
            return orjson.Fragment(value)
        for converter in converters:
            value = converter(value, expression, connection)
        return value

    return convert


def _row_chunks(queryset: models.QuerySet[Any, Any], size: int) -> Generator[list[list[Any]]]:
    """The rows of a ``values_list`` queryset, ``size`` at a time, each a list of its values as
    Django converts them (but JSON on PostgreSQL: ``_json_text``). On PostgreSQL they are read
    from a server-side cursor one chunk ahead of the caller (``_fetched_ahead``); SQLite's
    driver takes the GIL back for every row it steps to, so a second thread would only wait on
    the caller's: there the caller fetches."""
    compiler = queryset.query.get_compiler(using=queryset.db)
    sql, params = compiler.as_sql()
    selected = [column[0] for column in compiler.select]
    if len(selected) != len(queryset.query.values_select) + len(queryset.query.annotation_select):
        raise RuntimeError(f"{queryset.model.__name__}: the statement selects other columns than asked")
    converters = compiler.get_converters(selected)
    postgresql = connection.vendor == "postgresql"
    if postgresql:
        for i, expression in enumerate(selected):
            if isinstance(expression.output_field, models.JSONField):
                converters[i] = ([_json_text(converters.get(i, ([], None))[0])], expression)
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
        fetch = partial(cursor.fetchmany, size)
        with closing(_fetched_ahead(fetch) if postgresql else _fetched_here(fetch)) as chunks:
            for rows in chunks:
                if converters:
                    yield list(compiler.apply_converters(rows, converters))
                else:
                    yield rows


def _line_of(kind: Kind, digested: bool) -> Callable[[list[Any]], bytes]:
    """How a row's values (in ``kind.columns`` order, then its digest if ``digested``) are
    written as a line."""
    name, names = kind.name, kind.columns

    def plain(values: list[Any]) -> bytes:
        return encode_line({"kind": name, "row": _finite(kind, dict(zip(names, values, strict=True)))})

    def with_digest(values: list[Any]) -> bytes:
        row = dict(zip(names, values, strict=False))  # the digest, last, is left out
        return encode_line({"kind": name, "row": _finite(kind, row), "digest": values[-1]})

    return with_digest if digested else plain


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
            ws_row = {c: getattr(workspace, c) for c in WORKSPACE_COLUMNS}
            emit([encode_line(header), encode_line({"kind": WORKSPACE_KIND, "row": ws_row})])
            counts[WORKSPACE_KIND] = 1
            digests = digests_exact()
            for kind, queryset in _querysets(workspace):
                columns: list[Any] = list(kind.columns)
                digested = digests and kind.name in DIGESTED
                if digested:
                    # Computed by the database in the statement that reads the row (restore.py).
                    table = kind.model._meta.db_table
                    queryset = queryset.annotate(**{_DIGEST: RawSQL(digest_sql(kind, table), ())})
                    columns.append(_DIGEST)
                line = _line_of(kind, digested)
                rows_of = queryset.order_by("pk").values_list(*columns)
                # Closed here: left to the garbage collector, its server-side cursor could
                # outlive the transaction on an error (the traceback keeps the frame).
                with closing(_row_chunks(rows_of, READ_CHUNK)) as chunks:
                    for rows in chunks:
                        batch = [line(values) for values in rows]
                        emit(batch)
                        counts[kind.name] += len(batch)
    except BaseException:
        compressor.abandon()
        raise
    digest = compressor.close()
    out.write(encode_line({"kind": "trailer", "counts": counts, "sha256": digest}))
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
        with igzip.GzipFile(
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
        raise BackupError(f"backup of workspace {workspace.slug!r} failed: {error_detail(exc)}") from exc

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
            failed.append(f"{backup.file_name} ({error_detail(exc)})")
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
