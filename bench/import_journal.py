"""Time the journal import on the flask journal and write bench/reports/import_journal.md.

    .venv/bin/python bench/import_journal.py [--file PATH] [--database-url URL] [--repeat N]

By default it imports ../shared/corpus/flask_gitlog_journal.jsonl (relative to the repository
root; the bundled 300-record sample when that file is missing) into a fresh temporary SQLite
database, N times (default 3) into fresh workspaces, then once more into the last workspace to
time an idempotent re-import (which must create nothing), and an export of that workspace.
With --database-url it uses that database instead and leaves its bench-* workspaces there.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path

from machine import cpu_model  # bench/machine.py

ROOT = Path(__file__).resolve().parent.parent
# The project first (bench/maintenance.py would shadow its ``maintenance`` package), bench/ last.
sys.path[:] = [
    str(ROOT),
    *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"),
    str(ROOT / "bench"),
]
DEFAULT_FILE = ROOT.parent / "shared" / "corpus" / "flask_gitlog_journal.jsonl"
SAMPLE_FILE = ROOT / "memory" / "sample_data" / "flask_journal_sample.jsonl"
REPORT = ROOT / "bench" / "reports" / "import_journal.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, help="journal JSONL to import")
    parser.add_argument("--database-url", help="database to use (default: a fresh temporary SQLite file)")
    parser.add_argument("--repeat", type=int, default=3, help="imports into fresh workspaces (default 3)")
    parser.add_argument("--report", type=Path, default=REPORT, help="markdown report to write")
    args = parser.parse_args()

    path = args.file or (DEFAULT_FILE if DEFAULT_FILE.is_file() else SAMPLE_FILE)
    if not path.is_file():
        parser.error(f"{path}: no such file")
    tmpdir = None
    if args.database_url:
        url = args.database_url
    else:
        tmpdir = tempfile.mkdtemp(prefix="memory-steward-bench-")
        url = f"sqlite:///{tmpdir}/bench.sqlite3"
    # Settings read DATABASE_URL once, at django.setup(): it must be set before.
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    try:
        return run(path, url if args.database_url else "temporary SQLite file", args.repeat, args.report)
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


def run(path: Path, database: str, repeat: int, report: Path) -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from memory import accounts
    from memory.journal_export import export_journal
    from memory.journal_import import import_journal

    call_command("migrate", verbosity=0)
    stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S")

    runs = []
    workspace = None
    for i in range(1, repeat + 1):
        workspace = accounts.workspace_create(slug=f"bench-{stamp}-{i}")
        start = time.perf_counter()
        counts = import_journal(workspace=workspace, path=path)
        seconds = time.perf_counter() - start
        runs.append((seconds, counts))
        print(f"import {i}: {seconds:.2f} s ({counts.created} created, {counts.links_created} links)")
    assert workspace is not None

    start = time.perf_counter()
    again = import_journal(workspace=workspace, path=path)
    reimport_seconds = time.perf_counter() - start
    print(f"re-import: {reimport_seconds:.2f} s ({again.created} created, {again.unchanged} unchanged)")

    start = time.perf_counter()
    exported = export_journal(workspace=workspace, out=StringIO())
    export_seconds = time.perf_counter() - start
    print(f"export: {export_seconds:.2f} s ({exported.entries} entries)")

    median = statistics.median(s for s, _ in runs)
    first = runs[0][1]
    ok = again.created == 0 and again.updated == 0 and again.links_created == 0
    vendor = connection.vendor
    if vendor == "postgresql":
        version = connection.pg_version  # type: ignore[attr-defined]
        db_version = f"{version // 10000}.{version % 10000}"
    else:
        db_version = sqlite3.sqlite_version

    size = path.stat().st_size
    try:
        shown_path = path.resolve().relative_to(ROOT.parent)
    except ValueError:
        shown_path = path
    lines = [
        "# Journal import benchmark",
        "",
        f"Written by `bench/import_journal.py` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        "",
        "## Machine",
        "",
        f"- platform: {platform.platform()}",
        f"- CPU: {cpu_model()}, {os.cpu_count()} logical CPUs",
        f"- Python {platform.python_version()}",
        f"- SQLite library {sqlite3.sqlite_version}",
        f"- database: {vendor} {db_version} ({database})",
        "",
        "## Input",
        "",
        f"- file: `{shown_path}` ({size / 1e6:.1f} MB, {first.records} records)",
        f"- per import: {first.created} entries, {first.anchors_created} anchors, "
        f"{first.tags_created} tags, {first.links_created} links ({first.links_unresolved} unresolved), "
        f"{first.invalid} invalid",
        "",
        "## Results (wall clock, `time.perf_counter`, inside one process after `django.setup()`)",
        "",
        "| run | seconds | records/s |",
        "| --- | ---: | ---: |",
    ]
    for i, (seconds, counts) in enumerate(runs, start=1):
        lines.append(f"| import {i} (fresh workspace) | {seconds:.2f} | {counts.records / seconds:,.0f} |")
    lines += [
        f"| **median of {len(runs)}** | **{median:.2f}** | **{first.records / median:,.0f}** |",
        f"| re-import into the last workspace | {reimport_seconds:.2f} "
        f"| {again.records / reimport_seconds:,.0f} |",
        f"| export of the last workspace | {export_seconds:.2f} | {exported.entries / export_seconds:,.0f} |",
        "",
        f"Re-import: {again.created} created, {again.updated} updated, {again.unchanged} unchanged, "
        f"{again.links_created} links created — {'idempotent' if ok else 'NOT IDEMPOTENT'}.",
        "",
        "Each import is one transaction: parse and validate every line, insert entries, tags, "
        "anchors and creation events in batches, resolve links, then one score refresh of the "
        "whole workspace. All runs share one database, so its tables grow from run to run.",
        "",
    ]
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines), encoding="utf-8")
    print(f"median {median:.2f} s; report written to {report}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
