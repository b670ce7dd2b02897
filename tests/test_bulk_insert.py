"""The one path by which many entries are inserted at once (memory.bulk_insert): a journal
import and compaction's summaries both go through it, and it writes each new entry whole —
its own lineage, tag links, anchors and creation event — with ids in the order given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from maintenance.run_start import run_maintenance
from memory import bulk_insert, new_entries
from memory.bulk_insert import NewEntry, insert_entries
from memory.journal_import import SAMPLE_PATH, import_journal
from memory.models import CodeAnchor, Entry, LifecycleEvent

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def row(n: int, **fields):
    return {"content": f"bulk memory {n}", "content_hash": f"h{n}", "status": "active", **fields}


def test_new_entries_come_back_in_order_each_whole(workspace):
    anchor = {
        "repo": "r",
        "path": "a.py",
        "commit": "c",
        "line_start": 1,
        "line_end": 2,
        "content_hash": "x",
        "status": "valid",
    }
    new = [
        NewEntry(
            row=row(1), event={"reason": "import", "actor": "t", "details": {"line": 1}}, tags=["b", "a"]
        ),
        NewEntry(row=row(2, status="staged"), event={"reason": "import", "actor": "t"}, anchors=[anchor]),
        NewEntry(
            row=row(3, external_id="ext-3"), event={"reason": "compaction", "actor": "s", "automatic": True}
        ),
    ]

    ids = insert_entries(workspace, new, now=NOW, batch=2)

    entries = Entry.objects.in_bulk(ids)
    assert [entries[i].content for i in ids] == ["bulk memory 1", "bulk memory 2", "bulk memory 3"]
    assert all(entries[i].lineage_id == i for i in ids)
    assert sorted(entries[ids[0]].tags.values_list("name", flat=True)) == ["a", "b"]
    assert list(CodeAnchor.objects.filter(entry_id=ids[1]).values_list("path", flat=True)) == ["a.py"]
    events = {e.entry_id: e for e in LifecycleEvent.objects.filter(entry_id__in=ids)}
    assert [(events[i].from_status, events[i].to_status, events[i].automatic) for i in ids] == [
        ("", "active", False),
        ("", "staged", False),
        ("", "active", True),
    ]
    assert events[ids[0]].details == {"line": 1} and events[ids[2]].reason == "compaction"


def test_an_import_and_a_compaction_both_insert_through_it(workspace, monkeypatch):
    calls = []
    real = bulk_insert.insert_entries

    def recorded(ws, new, **options):
        calls.append(len(new))
        return real(ws, new, **options)

    monkeypatch.setattr("memory.journal_import.insert_entries", recorded)
    monkeypatch.setattr("maintenance.compaction.insert_entries", recorded)
    counts = import_journal(workspace=workspace, path=SAMPLE_PATH, now=NOW)
    assert calls == [counts.created] and counts.created > 0
    for n in range(12):
        new_entries.entry_create(
            workspace=workspace,
            content=f"Step {n}: wired the login form validation and checked the session cookie handling",
            entry_type="development_note",
            project="web",
            session_key="login",
            created_at=NOW - timedelta(days=30, minutes=n),
            now=NOW - timedelta(days=30, minutes=n),
        )
    result = run_maintenance(workspace=workspace, now=NOW, kind="consolidate")
    assert result["counts"]["summaries_created"] == 1
    assert calls[1:] == [1, 1]  # the plan's summary (rolled back), then the apply's
