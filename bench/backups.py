"""Backup write and read through the ``backups`` storage, on a generated workspace.

    .venv/bin/python bench/backups.py --database-url postgres://postgres@127.0.0.1:5432/bench_api \
        [--entries 100000] [--report bench/reports/backups.md]

Two storages, each in a fresh temporary folder: the default one (a FileSystemStorage, written
beside the final name and renamed) and an object-store-like one (not a FileSystemStorage, so
the backup is spooled to a local temporary file and saved whole, as to S3). For each: the
seconds to write the backup, its size, how much the process's peak memory grew while writing
(streamed, so it must stay far below the file's uncompressed size), and the seconds to read
and verify it back (``read_backup``, which holds the rows for the restore). Writes a Markdown
report with the date and the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The project first (bench/maintenance.py would shadow its ``maintenance`` package), bench/ last.
sys.path[:] = [
    str(ROOT),
    *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"),
    str(ROOT / "bench"),
]

from bench.datagen import ensure, setup_django  # noqa: E402
from bench.machine import cpu_model, python_loop_seconds, ram_gib  # noqa: E402


def reset_peak() -> None:
    """Start the peak resident size over from the current one (Linux: /proc/self/clear_refs)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def rss_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def object_store_like(folder: str) -> Any:
    """A storage that keeps files in ``folder`` but is no FileSystemStorage: what a remote
    backend looks like to the backup code."""
    from django.core.files import File
    from django.core.files.storage import Storage

    class ObjectStoreLike(Storage):
        def _path(self, name: str) -> str:
            return os.path.join(folder, name)

        def _save(self, name: str, content: Any) -> str:
            os.makedirs(os.path.dirname(self._path(name)), exist_ok=True)
            with open(self._path(name), "wb") as out:
                for chunk in content.chunks():
                    out.write(chunk)
            return name

        def _open(self, name: str, mode: str = "rb") -> Any:
            return File(open(self._path(name), mode))

        def exists(self, name: str) -> bool:
            return os.path.exists(self._path(name))

        def delete(self, name: str) -> None:
            Path(self._path(name)).unlink(missing_ok=True)

    return ObjectStoreLike()


def measure(workspace: Any, storage: Any) -> dict[str, float]:
    from django.core.files.storage import storages

    from maintenance import backup_files, backups
    from maintenance.models import Backup

    storages._storages["backups"] = storage
    reset_peak()
    before = rss_mib("VmRSS")
    start = time.perf_counter()
    backup = backups.write_backup(workspace, reason="manual")
    written = time.perf_counter() - start
    grown = rss_mib("VmHWM") - before
    start = time.perf_counter()
    _, rows, _ = backup_files.read_backup(backup_files.stored_backup(backup))
    read = time.perf_counter() - start
    result = {
        "write_s": written,
        "size_mib": backup.size_bytes / 2**20,
        "rss_growth_mib": grown,
        "read_s": read,
        "rows": sum(len(r) for r in rows.values()),
    }
    del rows
    storage.delete(backup_files.stored_name(workspace.slug, backup.file_name))
    Backup.objects.filter(pk=backup.pk).delete()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", help="database (default: DATABASE_URL or the project's SQLite file)"
    )
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--report", default=str(ROOT / "bench" / "reports" / "backups.md"))
    args = parser.parse_args()
    setup_django(args.database_url)

    from django.db import connection

    from maintenance.storage import BackupDirStorage
    from memory.models import Workspace

    generated = ensure(args.entries)
    workspace = Workspace.objects.get(slug=generated.slug)
    results = {}
    for label, make in (
        ("file system (default)", lambda d: BackupDirStorage(location=d)),
        ("object-store-like (spooled)", object_store_like),
    ):
        folder = tempfile.mkdtemp(prefix="bench-backups-")
        try:
            results[label] = measure(workspace, make(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print(label, {k: round(v, 2) for k, v in results[label].items()})

    lines = [
        "# Backups through the storage",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `bench/backups.py` on {cpu_model()}, "
        f"{ram_gib():.1f} GiB RAM (a plain Python loop of 10^7 additions: "
        f"{python_loop_seconds():.2f} s), {connection.vendor}, workspace of {args.entries:,} "
        "generated entries. One run each; the machine is shared, so expect noise of some 10 %.",
        "",
        "| storage | write s | file MiB | peak memory growth MiB | read + verify s | rows |",
        "|---|---|---|---|---|---|",
    ]
    for label, r in results.items():
        lines.append(
            f"| {label} | {r['write_s']:.1f} | {r['size_mib']:.1f} | {r['rss_growth_mib']:.0f} | "
            f"{r['read_s']:.1f} | {r['rows']:,.0f} |"
        )
    lines += [
        "",
        "Writing streams: rows are read 2,000 at a time and compressed on the way, so peak memory "
        "grows by far less than the file's uncompressed size; reading holds the rows for the "
        "restore's matching (as before the storage). Peak memory growth: the process's peak resident "
        "size while writing (reset before each write) minus its size before.",
        "",
    ]
    Path(args.report).write_text("\n".join(lines))
    print(f"report: {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
