"""Backup files: their format, their kinds of rows, where they live, and reading them back.

One gzip-compressed JSON object per line (compressed and read by ISA-L, ``isal.igzip``: any
gzip tool reads the files, and a file any gzip tool wrote is read): a header (format,
workspace, created_at, reason), the workspace's row, every row of each kind in ``KINDS``
order as ``{"kind": ..., "row": {...}}`` (every concrete column by attname but the workspace;
datetimes ISO-8601 UTC), and a trailer (counts per kind, sha256 of every line above). On
PostgreSQL a row's line also carries the database's digest of that row (``"digest"``, after
the row; see ``digest_sql``), which lets a restore pass over rows that have not changed since
without reading them back. Nothing else depends on the database: a file written on SQLite
restores into PostgreSQL and back. Files live in the ``backups`` storage, a folder per
workspace, and are only ever read through it (or from a local copy); reading streams and
verifies the file whole (checksum, counts, format).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import re
import zlib
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple, cast

import orjson
from django.core.files.storage import Storage, storages
from django.db import connection, models
from isal import igzip, isal_zlib

from maintenance.models import Backup, Dispute, MaintenanceRun
from memory.errors import ServiceError
from memory.models import (
    CodeAnchor,
    Entry,
    EntryAccess,
    LifecycleEvent,
    Relationship,
    Tag,
    Tombstone,
)
from memory.policy_model import MaintenancePolicy

logger = logging.getLogger(__name__)

FORMAT = 1
SLUG_RE = re.compile(r"^[-a-zA-Z0-9_]+$")
READ_CHUNK = 2000  # rows per round trip (and per write to the file) while backing up
Progress = Callable[[int], None]  # called with how many more rows were written or read
_FILE_CHUNK = 1 << 20  # bytes per read while hashing a file


class BackupError(ServiceError):
    """A backup could not be written or read."""


@dataclass(frozen=True)
class Kind:
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
KINDS: tuple[Kind, ...] = (
    Kind("policy", MaintenancePolicy, newer=("updated_at",)),
    # Runs travel with the workspace: tombstones, events and disputes keep naming theirs, so
    # a restored run can still be reverted.
    Kind("run", MaintenanceRun, history=True),
    Kind("tag", Tag, natural=("name",)),
    Kind(
        "entry",
        Entry,
        newer=("updated_at", "status_changed_at", "last_accessed_at", "reinforced_at", "feedback_at"),
    ),
    Kind("entry_tag", ENTRY_TAG),
    Kind(
        "relationship",
        Relationship,
        newer=("pruned_at",),
        natural=("from_entry_id", "to_entry_id", "type"),
    ),
    Kind("anchor", CodeAnchor, newer=("checked_at",)),
    Kind("access", EntryAccess, newer=("last_at",), natural=("lineage_id", "actor")),
    Kind("tombstone", Tombstone, newer=("restored_at", "purged_at")),
    Kind("event", LifecycleEvent, newer=("reverted_at",)),
    Kind(
        "dispute",
        Dispute,
        newer=("resolved_at",),
        natural=("entry_a_id", "entry_b_id", "kind"),
    ),
)
KIND_BY_NAME = {k.name: k for k in KINDS}
# The kinds whose rows a restore matches by id and compares whole: an unchanged row's line is
# recognised by its bytes (``restore._Writer.unchanged_dropped``), without parsing it.
_BY_BYTES = frozenset(k.name for k in KINDS if not k.history and k.name not in ("policy", "entry_tag"))
# The kinds whose lines carry a digest of their row on PostgreSQL (``digest_sql``).
DIGESTED = _BY_BYTES | {"entry_tag"}
WORKSPACE_KIND = "workspace"
WORKSPACE_COLUMNS = ("slug", "name", "created_at")
ALL_KINDS = (WORKSPACE_KIND, *KIND_BY_NAME)


def error_detail(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    return str(exc) or type(exc).__name__


def counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in counts.items() if n) or "nothing"


def storage() -> Storage:
    """The ``backups`` storage (``maintenance.storage``): every backup is written, listed
    for rotation, deleted and read through it, never through a local path of its own."""
    return storages["backups"]


def stored_name(slug: str, file_name: str) -> str:
    """The backup's name in the storage: ``<workspace slug>/<file name>``."""
    # PurePosixPath(...).name: a row's name never leads out of the workspace's folder.
    return f"{slug}/{PurePosixPath(file_name).name}"


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
    if workspace_slug and SLUG_RE.match(workspace_slug) and PurePosixPath(file).name == file:
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


class _ReadInto:
    """A file that can only ``read``, given ``readinto`` too."""

    def __init__(self, handle: Any):
        self.handle = handle

    def read(self, size: int = -1) -> bytes:
        return bytes(self.handle.read(size))

    def readinto(self, buffer: Any) -> int:
        data = self.handle.read(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)


@contextmanager
def _open(source: Source) -> Iterator[Any]:
    if isinstance(source, StoredBackup):
        with storage().open(source.name, "rb") as handle:
            # ISA-L's reader fills buffers (``readinto``): a storage's file may only ``read``.
            yield handle if hasattr(handle, "readinto") else _ReadInto(handle)
    else:
        with open(source, "rb") as handle:
            yield handle


Header = dict[str, Any]
Rows = dict[str, list[dict[str, Any]]]


Loads = Callable[[bytes], Any]


def _json_loads(raw: bytes) -> Any:
    return json.loads(raw.decode("utf-8"))  # UTF-8 only (json.loads would guess from the bytes)


# Where a line may hold an integer beyond 64 bits: nineteen digits in a row (2**63 has 19),
# found as nineteen zeros in the line with every digit made a zero and every other byte a
# space (a regular expression for them cost more than json's whole parse of the line).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_NINETEEN_DIGITS = b"0" * 19


def exact_loads(raw: bytes) -> Any:
    """A line parsed by orjson — as strict as the verifying scan (NaN, infinities, lone
    surrogates and deep nesting refused) and three times as fast as json — but by json
    again where it may hold an integer beyond 64 bits (nineteen digits in a row anywhere,
    a string's included: 2 % of the entries' lines of a generated workspace), which orjson
    reads as a float: json keeps it exact."""
    data = orjson.loads(raw)
    if _NINETEEN_DIGITS in raw.translate(_DIGITS_AS_ZEROS):
        return _json_loads(raw)
    return data


def parse_line(raw: bytes, loads: Loads = _json_loads) -> dict[str, Any]:
    data = loads(raw)
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise ValueError("not an object with a kind")
    return data


def _parse_or_empty(raw: bytes | None) -> dict[str, Any]:
    try:
        return parse_line(raw or b"")
    except ValueError:
        return {}


class _Counted(NamedTuple):
    header: Header
    trailer: dict[str, Any]


# How this version starts a row's line (orjson: no spaces, the id first; only a JSON column
# written from PostgreSQL's text, ``backups._json_text``, has the database's spaces): the
# writing scan of a restore reads the kind and id of such a line without parsing the rest
# (``restore._Writer.unchanged_dropped``). An id fits in 64 bits: 18 digits at most here.
_ROW_START = re.compile(rb'\{"kind":"([a-z_]+)","row":\{"id":(\d{1,18}),')


def _lines(handle: Any, digest: Any = None) -> Iterator[bytes]:
    """The lines of a decompressed stream, each with its newline (but a last line without
    one), read a megabyte at a time: iterating over a GzipFile costs a Python call per line,
    a tenth of a restore's time. ``digest`` (a hashlib object) is fed every line but the last
    (a file's trailer, which holds the checksum of the lines above it), a read at a time: a
    call per line was 4.5 million calls a scan at 1,000,000 entries."""
    rest = b""
    held = b""  # the last line handed out: the file's last, unless more follows
    while block := handle.read(_FILE_CHUNK):
        data = rest + block
        lines = data.split(b"\n")
        rest = lines.pop()
        if not lines:
            continue
        if digest is not None:
            digest.update(held)
            # Every complete line of this read but its last, as one slice of the bytes read.
            digest.update(memoryview(data)[: len(data) - len(rest) - len(lines[-1]) - 1])
            held = lines[-1] + b"\n"
        for line in lines:
            yield line + b"\n"
    if rest:
        if digest is not None:
            digest.update(held)
        yield rest


def digest_sql(kind: Kind, table: str) -> str:
    """PostgreSQL: the SQL expression of a row's digest, its columns qualified by ``table`` (a
    name or alias, quoted here): a 64-bit hash (``hashtextextended``, the one hash partitioning
    keeps stable across versions) of the row's text as the database prints it, the file's
    columns in the file's order, the workspace left out.

    Two rows with the same digest hold the same values as far as a restore can tell: the text
    hashed starts with the columns' names (a version that renames or reorders columns never
    matches an older digest), and a row's text holds every column in order, NULL apart from an
    empty string, a date-time to the microsecond
    with its offset, JSON in its one stored form — and a float exactly, as long as
    ``extra_float_digits`` is above 0 (PostgreSQL's default; at 0 two floats can print alike),
    which ``digests_exact`` checks before a digest is written or trusted. Another time zone or
    version printing a row otherwise only makes digests differ: the restore then compares
    that row as it compares a file without digests."""
    qn = connection.ops.quote_name
    columns = ", ".join(f"{qn(table)}.{qn(f.column)}" for f in kind.fields)
    names = ",".join(f.column for f in kind.fields)  # identifiers of the models: plain ASCII
    return f"hashtextextended('{names}' || ROW({columns})::text, 0)"


def digests_exact() -> bool:
    """Whether this connection can write or trust row digests (``digest_sql``): PostgreSQL,
    printing floats exactly."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('extra_float_digits')::int > 0")
        return bool(cursor.fetchone()[0])


# How this version ends a line that carries its row's digest (orjson: no spaces): the row's
# closing brace, the digest, the line's closing brace. A line without one ends in at least two
# closing braces, so a "digest" key inside the row's own JSON is never taken for it.
_DIGEST_END = b',"digest":'
_DIGEST_TAIL = re.compile(rb'\},"digest":(-?\d{1,20})\}\n\Z')


class Raw(NamedTuple):
    """A row line the writing scan has not parsed: its id, its bytes without the digest (the
    line as it would be written without one), and the digest, if the line has one."""

    pk: int
    line: bytes
    digest: int | None = None


def _raw(pk: int, line: bytes) -> Raw:
    at = line.rfind(_DIGEST_END)
    tail = _DIGEST_TAIL.match(line, at - 1) if at > 0 else None
    if tail is None:
        return Raw(pk, line)
    return Raw(pk, line[:at] + b"}\n", int(tail[1]))


_GZIP_MAGIC = b"\x1f\x8b"
# What ISA-L raises for a corrupt stream (its stubs declare it an instance, not a class).
_ISAL_ERROR = cast(type[Exception], isal_zlib.error)


def _ended_early(path: Source) -> str:
    """What is wrong with a file whose stream ISA-L found to end early, which it also says of
    a header cut short and of bytes after the compressed data: the file read again (on the way
    to an error) by Python's own gzip, which tells them apart."""
    try:
        with _open(path) as stored:
            if stored.read(len(_GZIP_MAGIC)) != _GZIP_MAGIC:
                return "not a readable backup (not a gzip file)"
        with _open(path) as stored, gzip.GzipFile(fileobj=stored, mode="rb") as handle:
            while handle.read(_FILE_CHUNK):
                pass
    except EOFError:
        pass
    except (OSError, zlib.error) as exc:
        return f"not a readable backup ({error_detail(exc)})"
    return "truncated (the compressed data ends early)"


def scan(
    path: Source,
    on_row: Callable[[str, dict[str, Any]], None],
    progress: Progress | None = None,
    *,
    on_line: Callable[[str, Raw], None] | None = None,
    loads: Loads = _json_loads,
    counted: Collection[str] = (),
) -> _Counted:
    """Stream a backup file once, calling ``on_row(kind, row)`` for each well-formed row in file
    order, and verify it as a whole at the end: (header, trailer, rows per kind). With
    ``on_line``, a row line of a kind in ``DIGESTED`` written as this version writes it is
    handed over unparsed instead, as ``on_line(kind, Raw(id, line, digest))`` (the writing scan of a
    file the verifying scan has read whole). ``loads``: orjson's for a scan that only checks
    the rows and keeps their ids (three times faster, but it reads integers beyond 64 bits as
    floats: a scan whose rows are written keeps json's). ``counted``: kinds of ``DIGESTED``
    whose lines written as this version writes them are only counted and hashed, neither
    parsed nor handed out (a restore's verifying scan: its writing scan checks every such line
    it parses; see ``restore``).

    Raises BackupError when the file is unreadable, truncated (no trailer), altered (checksum
    mismatch), inconsistent (counts mismatch) or not in a format this version reads. The rows
    were handed out before that verdict: a caller that writes them does so in a transaction that
    the error rolls back (or verifies the file in an earlier scan).
    """
    by_start = on_line is not None or bool(counted)  # some lines are recognised by their start
    digest = hashlib.sha256()
    found = dict.fromkeys(ALL_KINDS, 0)
    header: Header | None = None
    previous: bytes | None = None
    problem: str | None = None  # the first malformed line, reported only if the checksum holds
    number = 0
    try:
        with _open(path) as stored, igzip.GzipFile(fileobj=stored, mode="rb") as handle:
            for raw in _lines(handle, digest):
                if previous is not None:
                    row: Any = None
                    start = _ROW_START.match(previous) if by_start and number > 1 else None
                    kind = start[1].decode() if start is not None else ""
                    if start is not None and kind in DIGESTED and (on_line is not None or kind in counted):
                        found[kind] += 1
                        if on_line is not None:
                            on_line(kind, _raw(int(start[2]), previous))
                    else:
                        try:
                            data = parse_line(previous, loads)
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
        raise BackupError(f"{path}: {_ended_early(path)}") from None
    except (OSError, _ISAL_ERROR) as exc:
        raise BackupError(f"{path}: not a readable backup ({error_detail(exc)})") from None

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
        raise BackupError(f"{path}: counts mismatch (the file holds {counts_text(found)})")
    return _Counted(header, trailer)


def read_backup(path: Source, progress: Progress | None = None) -> tuple[Header, Rows, dict[str, Any]]:
    """Read and verify a whole backup file into memory: (header, rows by kind, trailer). For
    inspecting a file; a restore streams it instead (``scan``). Raises BackupError as
    ``scan`` does."""
    rows: Rows = {name: [] for name in ALL_KINDS}
    scanned = scan(path, lambda kind, row: rows[kind].append(row), progress)
    return scanned.header, rows, scanned.trailer
