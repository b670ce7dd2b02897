"""One function changes an entry's status (``memory.lifecycle``): whichever source moves an
entry — the API, hygiene, a pass, graduation, a revert, an approved proposal — it writes the
same event and tombstone rows, decides ``updated_at`` by one rule (it moves when a person or a
key changes the entry; not for automatic changes, nor for a revert) and ``archived_at`` by
another, and announces the change after commit (``memory.signals.entries_changed``), which the
console's live layer turns into an update of every open page."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console import live
from maintenance.models import MaintenanceRun
from maintenance.revert import revert_entry, revert_run
from maintenance.run_start import run_maintenance
from memory import accounts, entry_changes, lifecycle, new_entries
from memory.models import Entry, LifecycleEvent, Tombstone
from memory.policy_model import MaintenancePolicy
from memory.signals import entries_changed

pytestmark = pytest.mark.django_db

JUNK = "wip..."  # hygiene: a fragment (2) that ends truncated (2): score 4, recommendation archive


@pytest.fixture(autouse=True)
def _backups(settings, tmp_path):
    settings.BACKUP_DIR = tmp_path / "backups"


@pytest.fixture
def told():
    """Every ``entries_changed`` sent while the test runs, as (workspace_id, statuses, count)."""
    heard: list[tuple[int, frozenset[str], int]] = []

    def receive(sender: Any, *, workspace_id: int, statuses: frozenset[str], count: int, **_: Any) -> None:
        heard.append((workspace_id, statuses, count))

    entries_changed.connect(receive, dispatch_uid="tests.test_lifecycle")
    yield heard
    entries_changed.disconnect(dispatch_uid="tests.test_lifecycle")


def make(workspace, now, days: float, content: str | None = None, **fields: Any) -> Entry:
    """An entry created ``days`` before ``now`` and not updated since (``updated_at`` = its
    creation); ``fields`` are set straight on the row."""
    created = now - timedelta(days=days)
    entry = new_entries.entry_create(
        workspace=workspace,
        content=content or f"memory {Entry.objects.count()} about caching and retries",
        created_at=created,
        now=created,
        staged_class=fields.pop("staged_class", None),
    )
    if fields:
        Entry.objects.filter(pk=entry.pk).update(**fields)
    entry.refresh_from_db()
    assert entry.updated_at == created
    return entry


def set_policy(workspace, **values: Any) -> None:
    row = MaintenancePolicy.objects.get(workspace=workspace)
    for name, value in values.items():
        setattr(row, name, value)
    row.save()


def api(method: str, path: str, workspace, role: str, body: Any = None) -> Any:
    secret = accounts.api_key_create(workspace=workspace, name=f"{role} key", role=role)[1]
    kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body is not None else {}
    response = getattr(Client(), method)(f"/api/v1{path}", HTTP_AUTHORIZATION=f"Bearer {secret}", **kwargs)
    assert response.status_code == 200, response.content
    return response.json()


def key_actor(workspace, role: str) -> str:
    return f"key:{workspace.api_keys.get(name=f'{role} key').prefix}"


# --- every source of a status change -------------------------------------------------------------


@dataclass
class Moved:
    """What a source did to one entry, and what must have been written for it."""

    entry_id: int
    updated_before: datetime  # the entry's updated_at before the change
    from_status: str
    to_status: str
    reason: str
    automatic: bool
    actor: str
    touched: bool  # updated_at moves to the time of the change
    run_id: int | None = None
    tombstone: str | None = None  # the reason of the Tombstone written
    untombed: bool = False  # the entry's open Tombstone was closed
    reverts: bool = False  # the event names the event it undoes
    details: dict[str, Any] | None = None  # keys its details hold


Source = Callable[[Any, datetime], Moved]


def manual_archive(workspace, at):
    """An operator's archive: the admin's action (the API has no archive of its own)."""
    entry = make(workspace, at, days=10)
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status="archived", reason="manual", actor="user:ann", now=at
    )
    return Moved(entry.pk, entry.updated_at, "active", "archived", "manual", False, "user:ann", True)


def api_tombstone(workspace, at):
    entry = make(workspace, at, days=10)
    with time_machine.travel(at, tick=False):
        api("delete", f"/entries/{entry.pk}", workspace, "agent")
    actor = key_actor(workspace, "agent")
    return Moved(
        entry.pk, entry.updated_at, "active", "tombstoned", "api", False, actor, True, tombstone="api"
    )


def api_restore(workspace, at):
    entry = make(workspace, at, days=10)
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=at - timedelta(days=1))
    Entry.objects.filter(pk=entry.pk).update(updated_at=entry.updated_at)
    with time_machine.travel(at, tick=False):
        api("post", f"/entries/{entry.pk}/restore", workspace, "operator")
    actor = key_actor(workspace, "operator")
    return Moved(
        entry.pk,
        entry.updated_at,
        "tombstoned",
        "active",
        "restore",
        False,
        actor,
        True,
        untombed=True,
        details={"hold"},
    )


def api_access_of_a_stale_entry(workspace, at):
    entry = make(workspace, at, days=10, status="stale")
    with time_machine.travel(at, tick=False):
        api("post", f"/entries/{entry.pk}/access", workspace, "agent", {"actor": "agent:scout"})
    return Moved(entry.pk, entry.updated_at, "stale", "active", "access", False, "agent:scout", True)


def api_new_version_of_a_stale_entry(workspace, at):
    entry = make(workspace, at, days=10, status="stale")
    with time_machine.travel(at, tick=False):
        body = api("patch", f"/entries/{entry.pk}", workspace, "agent", {"content": "new words for it"})
    actor = key_actor(workspace, "agent")
    return Moved(body["entry"]["id"], entry.updated_at, "stale", "active", "update", False, actor, True)


def api_hygiene_apply(workspace, at):
    junk = make(workspace, at, days=40, content=JUNK)
    with time_machine.travel(at, tick=False):
        body = api("post", "/hygiene/apply", workspace, "operator", {"ids": [junk.pk]})
    assert body["archived"] == [junk.pk]
    actor = key_actor(workspace, "operator")
    return Moved(
        junk.pk,
        junk.updated_at,
        "active",
        "archived",
        "hygiene",
        False,
        actor,
        True,
        details={"score", "reasons"},
    )


# Days after which an entry has decayed below the cold threshold (ln 0.2 / -0.02 = 80.5) and
# is not yet idle long enough to be marked stale first (90): the decay pass tombstones it.
COLD = 85


def _run(workspace, at) -> int:
    return run_maintenance(workspace=workspace, now=at, force=True)["run_id"]


def pass_stale(workspace, at):
    set_policy(workspace, cold_threshold=0.0)  # no decay
    idle = make(workspace, at, days=91)
    run_id = _run(workspace, at)
    return Moved(idle.pk, idle.updated_at, "active", "stale", "stale", True, "system", False, run_id)


def pass_archive(workspace, at):
    set_policy(workspace, cold_threshold=0.0)
    stale = make(workspace, at, days=400, status="stale", status_changed_at=at - timedelta(days=180))
    run_id = _run(workspace, at)
    return Moved(stale.pk, stale.updated_at, "stale", "archived", "archive", True, "system", False, run_id)


def pass_tombstone(workspace, at):
    cold = make(workspace, at, days=COLD)
    run_id = _run(workspace, at)
    return Moved(
        cold.pk,
        cold.updated_at,
        "active",
        "tombstoned",
        "decay",
        True,
        "system",
        False,
        run_id,
        tombstone="decay",
    )


def graduation(workspace, at):
    staged = make(workspace, at, days=5, staged_class="procedural", retrieval_count=2)
    run_id = _run(workspace, at)
    return Moved(staged.pk, staged.updated_at, "staged", "active", "graduate", True, "system", False, run_id)


def revert_of_a_run(workspace, at):
    cold = make(workspace, at, days=COLD)
    run_id = _run(workspace, at - timedelta(hours=1))
    with time_machine.travel(at, tick=False):
        result = api("post", f"/maintenance/runs/{run_id}/revert", workspace, "operator")
    assert result["reverted"] == [cold.pk]
    actor = key_actor(workspace, "operator")
    return Moved(
        cold.pk,
        cold.updated_at,
        "tombstoned",
        "active",
        "revert",
        False,
        actor,
        False,
        run_id,
        untombed=True,
        reverts=True,
        details={"hold"},
    )


def revert_of_one_entry(workspace, at):
    set_policy(workspace, cold_threshold=0.0)
    idle = make(workspace, at, days=91)
    run_id = _run(workspace, at - timedelta(hours=1))
    assert revert_entry(workspace, idle.pk, actor="user:ann", now=at)["reverted"] == [idle.pk]
    return Moved(
        idle.pk,
        idle.updated_at,
        "stale",
        "active",
        "revert",
        False,
        "user:ann",
        False,
        run_id,
        reverts=True,
        details={"hold"},
    )


def approval_of_a_proposal(workspace, at):
    set_policy(workspace, review_mode="propose")
    cold = make(workspace, at, days=COLD)
    run_id = _run(workspace, at - timedelta(hours=1))
    assert MaintenanceRun.objects.get(pk=run_id).status == "proposed"
    with time_machine.travel(at, tick=False):
        body = api("post", "/proposals/approve", workspace, "operator", {"all": True})
    assert body["applied"] == [cold.pk]
    actor = key_actor(workspace, "operator")
    return Moved(
        cold.pk,
        cold.updated_at,
        "active",
        "tombstoned",
        "decay",
        True,
        actor,
        False,
        run_id,
        tombstone="decay",
    )


SOURCES: list[Source] = [
    manual_archive,
    api_tombstone,
    api_restore,
    api_access_of_a_stale_entry,
    api_new_version_of_a_stale_entry,
    api_hygiene_apply,
    pass_stale,
    pass_archive,
    pass_tombstone,
    graduation,
    revert_of_a_run,
    revert_of_one_entry,
    approval_of_a_proposal,
]


@pytest.mark.parametrize("source", SOURCES, ids=[s.__name__ for s in SOURCES])
def test_every_source_writes_the_same_records_and_decides_updated_at_by_one_rule(
    source, workspace, now, told, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        moved = source(workspace, now)

    entry = Entry.objects.get(pk=moved.entry_id)
    assert entry.status == moved.to_status
    assert entry.status_changed_at == now
    # updated_at: moved by a person's or a key's change, not by automation nor by a revert.
    assert entry.updated_at == (now if moved.touched else moved.updated_before)

    event = (
        LifecycleEvent.objects.filter(entry_id=moved.entry_id, created_at=now)
        .exclude(reason__in=("hold", "release"))
        .get()
    )
    assert (event.from_status, event.to_status, event.reason) == (
        moved.from_status,
        moved.to_status,
        moved.reason,
    )
    assert (event.automatic, event.actor, event.workspace_id, event.entry_ref) == (
        moved.automatic,
        moved.actor,
        workspace.pk,
        moved.entry_id,
    )
    assert event.run_id == moved.run_id
    assert (event.reverts_id is not None) == moved.reverts
    if moved.reverts:
        assert event.reverts.reverted_at == now and event.reverts.to_status == moved.from_status
    assert set(event.details) == (moved.details or set())

    tombstones = Tombstone.objects.filter(entry_ref=moved.entry_id)
    if moved.tombstone:
        tomb = tombstones.get(restored_at__isnull=True)
        assert (tomb.reason, tomb.previous_status, tomb.actor, tomb.run_id, tomb.created_at) == (
            moved.tombstone,
            moved.from_status,
            moved.actor,
            None if moved.reason == "revert" else moved.run_id,
            now,
        )
        assert tomb.purge_after == now + timedelta(
            days=MaintenancePolicy.for_workspace(workspace).purge_grace_days
        )
    elif moved.untombed:
        assert tombstones.get().restored_at == now
    else:
        assert not tombstones.exists()

    # Announced after commit, whichever door it came through.
    mine = [statuses for ws, statuses, _ in told if ws == workspace.pk]
    assert mine and moved.to_status in set().union(*mine)


# --- archived_at ----------------------------------------------------------------------------------


def test_archived_at_is_stamped_by_an_archive_kept_by_a_tombstone_and_cleared_by_anything_else(
    workspace, now
):
    entry = make(workspace, now, days=10)
    later = [now + timedelta(days=d) for d in range(4)]
    entry_changes.entry_set_status(
        workspace=workspace, entry_id=entry.pk, status="archived", reason="manual", now=later[0]
    )
    assert Entry.objects.get(pk=entry.pk).archived_at == later[0]
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk, now=later[1])
    assert Entry.objects.get(pk=entry.pk).archived_at == later[0]
    entry_changes.entry_restore(workspace=workspace, entry_id=entry.pk, now=later[2])
    assert Entry.objects.get(pk=entry.pk).archived_at is None


def test_a_reverted_reclaim_gives_the_entry_back_the_date_it_was_archived(workspace, now):
    set_policy(workspace, cold_threshold=0.0)
    archived_at = now - timedelta(days=365)
    due = make(workspace, now, days=800, status="archived", archived_at=archived_at)
    run_id = _run(workspace, now)
    assert Entry.objects.get(pk=due.pk).status == "tombstoned"
    revert_run(workspace, run_id, actor="user:ann", now=now + timedelta(hours=1))
    back = Entry.objects.get(pk=due.pk)
    assert (back.status, back.archived_at, back.updated_at) == ("archived", archived_at, due.updated_at)


# --- the one function ---------------------------------------------------------------------------


def test_a_change_writes_the_same_statements_for_any_number_of_entries(workspace, now):
    """One statement per table, whatever the number of entries: a run changes hundreds of
    thousands of rows in batches (on SQLite the per-entry details go through one executemany)."""

    def statements(n: int, *, each: bool = False) -> list[str]:
        ids = [make(workspace, now, days=1).pk for _ in range(n)]
        details_of = {i: {"n": i} for i in ids} if each else None
        with CaptureQueriesContext(connection) as queries:
            lifecycle.change_status(
                workspace.pk,
                ids,
                "archived",
                reason="manual",
                actor="user:ann",
                now=now,
                details_of=details_of,
            )
        assert Entry.objects.filter(pk__in=ids, status="archived").count() == n
        assert LifecycleEvent.objects.filter(entry_id__in=ids, to_status="archived").count() == n
        # An executemany is logged as "<n> times: <sql>": one statement, prepared once.
        return [q["sql"].split(" times: ")[-1].split(" ")[0] for q in queries.captured_queries]

    few = statements(2)
    assert few == statements(7)
    assert statements(2, each=True) == statements(7, each=True)
    assert few.count("INSERT") == 1 and few.count("UPDATE") == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="data-modifying WITH queries: PostgreSQL only")
@pytest.mark.parametrize("to_status", ["stale", "archived", "tombstoned"])
def test_a_batch_changed_in_one_statement_writes_what_change_status_writes(
    workspace, other_workspace, now, to_status
):
    """A pass's batch on PostgreSQL (``change_selected``): the rows its query still matches are
    locked, read, recorded and changed in ONE statement, for any number of rows, and leave the
    same entry, event and tombstone rows as ``change_status`` — a tombstoned row among them
    leaves the tombstone with its Tombstone closed. A row the query no longer matches and
    another workspace's row are left alone."""
    run = MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="cli")
    stone = lifecycle.Tombstoning("decay", now + timedelta(days=30)) if to_status == "tombstoned" else None
    options = {"reason": "decay", "actor": "system", "now": now, "run_id": run.pk, "tombstone": stone}

    def made(n: int) -> list[int]:
        ids = [make(workspace, now, days=40, status="stale", archived_at=now).pk for _ in range(n)]
        Entry.objects.filter(pk=ids[0]).update(lineage_id=ids[-1], status="active", archived_at=None)
        if to_status == "tombstoned":
            return ids  # a tombstoned entry has one open Tombstone at most
        earlier = now - timedelta(days=1)
        lifecycle.change_status(  # outside the run: its event is not compared, its Tombstone is
            workspace.pk,
            [ids[1]],
            "tombstoned",
            reason="manual",
            actor="user:ann",
            now=earlier,
            tombstone=lifecycle.Tombstoning("manual", earlier + timedelta(days=30)),
        )
        return ids

    def records(ids: list[int]) -> list[tuple[Any, ...]]:
        entries = Entry.objects.filter(pk__in=ids).order_by("pk")
        events = LifecycleEvent.objects.filter(entry_ref__in=ids, run=run).order_by("pk")
        stones = Tombstone.objects.filter(entry_ref__in=ids).order_by("pk")
        return [
            *entries.values_list("status", "status_changed_at", "archived_at", "updated_at"),
            *events.values_list(
                "entry_id",
                "from_status",
                "to_status",
                "reason",
                "actor",
                "automatic",
                "created_at",
                "details",
            ),
            *stones.values_list("entry_id", "lineage_ref", "content_hash", "reason", "previous_status"),
            *stones.values_list("run_id", "actor", "created_at", "purge_after", "restored_at"),
        ]

    def relabelled(rows: list[tuple[Any, ...]], ids: list[int]) -> list[tuple[Any, ...]]:
        index: dict[Any, str] = {i: f"#{n}" for n, i in enumerate(ids)}
        hashes = Entry.objects.filter(pk__in=ids).values_list("pk", "content_hash")
        index.update({digest: f"hash of {index[i]}" for i, digest in hashes})

        def label(v: Any) -> Any:
            return index.get(v, v) if isinstance(v, int | str) and not isinstance(v, bool) else v

        return [tuple(label(v) for v in row) for row in rows]

    def statements(n: int) -> tuple[list[str], list[tuple[Any, ...]]]:
        ids = made(n)
        left_alone = [
            make(other_workspace, now, days=40).pk,
            make(workspace, now, days=40, content="pinned one", pinned=True).pk,
        ]
        before = records(left_alone)
        selected = Entry.objects.filter(pk__in=[*ids, *left_alone], pinned=False)
        with CaptureQueriesContext(connection) as queries, transaction.atomic():
            assert lifecycle.change_selected(workspace.pk, selected, to_status, **options) == ids
        assert records(left_alone) == before
        sent = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
        return sent, relabelled(records(ids), ids)

    few, one_way = statements(2)
    assert len(few) == 1 and len(statements(7)[0]) == 1
    ids = made(2)
    with transaction.atomic():
        lifecycle.change_status(workspace.pk, ids, to_status, automatic=True, **options)
    assert relabelled(records(ids), ids) == one_way
    assert LifecycleEvent.objects.filter(run=run).count() == 11


def test_per_entry_details_runs_and_reverted_events_land_on_each_event(workspace, now):
    a, b = make(workspace, now, days=1), make(workspace, now, days=1)
    runs = [MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="cli") for _ in range(2)]
    first = LifecycleEvent.objects.get(entry=a, reason="create")
    lifecycle.change_status(
        workspace.pk,
        [b.pk, a.pk],
        "stale",
        reason="revert",
        actor="user:ann",
        now=now,
        details={"hold": "revert"},
        details_of={a.pk: {"score": 4}},
        run_of={a.pk: runs[0].pk, b.pk: runs[1].pk},
        reverts_of={a.pk: first.pk},
    )
    events = {e.entry_id: e for e in LifecycleEvent.objects.filter(to_status="stale")}
    assert (events[a.pk].details, events[a.pk].run_id, events[a.pk].reverts_id) == (
        {"score": 4},
        runs[0].pk,
        first.pk,
    )
    assert (events[b.pk].details, events[b.pk].run_id, events[b.pk].reverts_id) == (
        {"hold": "revert"},
        runs[1].pk,
        None,
    )
    assert {e.from_status for e in events.values()} == {"active"}
    assert list(
        LifecycleEvent.objects.filter(to_status="stale").order_by("pk").values_list("entry_id", flat=True)
    ) == [
        a.pk,
        b.pk,
    ]  # in id order


def test_an_entry_of_another_workspace_is_never_changed(workspace, other_workspace, now):
    mine, theirs = make(workspace, now, days=1), make(other_workspace, now, days=1)
    lifecycle.change_status(workspace.pk, [mine.pk, theirs.pk], "stale", reason="stale", actor="x", now=now)
    assert Entry.objects.get(pk=theirs.pk).status == "active"
    assert not LifecycleEvent.objects.filter(entry=theirs, to_status="stale").exists()
    assert Entry.objects.get(pk=mine.pk).status == "stale"


def test_a_tombstone_needs_its_record_and_only_a_tombstone_takes_one(workspace, now):
    entry = make(workspace, now, days=1)
    with pytest.raises(ValueError):
        lifecycle.change_status(workspace.pk, [entry.pk], "tombstoned", reason="manual", actor="x", now=now)
    with pytest.raises(ValueError):
        lifecycle.change_status(
            workspace.pk,
            [entry.pk],
            "archived",
            reason="manual",
            actor="x",
            now=now,
            tombstone=lifecycle.Tombstoning("manual", now),
        )
    with pytest.raises(ValueError):
        lifecycle.change_status(
            workspace.pk, [entry.pk], "archived", reason="x", actor="x", now=now, columns={"updated_at": now}
        )


# --- the announcement ----------------------------------------------------------------------------


def _change(workspace, entry, to_status: str, now) -> None:
    lifecycle.change_status(workspace.pk, [entry.pk], to_status, reason="manual", actor="user:ann", now=now)


@pytest.mark.django_db(transaction=True)
def test_the_changes_of_one_transaction_are_announced_once_after_commit(
    workspace, other_workspace, now, told
):
    a, b, c = make(workspace, now, days=1), make(workspace, now, days=1), make(other_workspace, now, days=1)
    told.clear()
    with transaction.atomic():
        _change(workspace, a, "stale", now)
        _change(workspace, b, "archived", now)
        _change(other_workspace, c, "stale", now)
        assert told == []  # nothing before the commit
    assert sorted(told) == sorted(
        [(workspace.pk, frozenset({"stale", "archived"}), 2), (other_workspace.pk, frozenset({"stale"}), 1)]
    )
    _change(workspace, a, "active", now)  # autocommit: at once
    assert told[-1] == (workspace.pk, frozenset({"active"}), 1)


def test_a_change_rolled_back_is_not_announced(workspace, now, told, django_capture_on_commit_callbacks):
    entry = make(workspace, now, days=1)
    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(ZeroDivisionError),
        transaction.atomic(),
    ):
        _change(workspace, entry, "stale", now)
        1 / 0  # noqa: B018
    assert told == []
    assert Entry.objects.get(pk=entry.pk).status == "active"


@pytest.mark.django_db(transaction=True)
def test_coalesced_changes_are_announced_once_at_the_end(workspace, now, told):
    entries = [make(workspace, now, days=1) for _ in range(3)]
    told.clear()
    with lifecycle.coalesced():
        for entry in entries:
            with transaction.atomic():  # committed one by one, as a run's batches
                _change(workspace, entry, "stale", now)
        with lifecycle.coalesced():  # nested: told by the outer block
            lifecycle.announce(workspace.pk, ["purged"], 1)
        assert told == []
    assert told == [(workspace.pk, frozenset({"stale", "purged"}), 4)]


@pytest.mark.django_db(transaction=True)
def test_a_run_announces_its_changes_once_not_once_per_batch(workspace, now, told):
    cold = [make(workspace, now, days=COLD) for _ in range(3)]
    told.clear()
    result = run_maintenance(workspace=workspace, now=now, force=True, batch_size=1)
    assert sorted(result["affected"]["tombstoned"]) == sorted(e.pk for e in cold)
    assert told == [(workspace.pk, frozenset({"tombstoned"}), 3)]


def test_a_receiver_that_fails_never_breaks_the_change(
    workspace, now, caplog, django_capture_on_commit_callbacks
):
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver exploded")

    entries_changed.connect(broken, dispatch_uid="tests.broken")
    try:
        entry = make(workspace, now, days=1)
        with django_capture_on_commit_callbacks(execute=True):
            _change(workspace, entry, "stale", now)
    finally:
        entries_changed.disconnect(dispatch_uid="tests.broken")
    assert Entry.objects.get(pk=entry.pk).status == "stale"
    assert "receiver exploded" in caplog.text


# --- the live layer hears of every door ---------------------------------------------------------


@pytest.fixture
def pushed(monkeypatch):
    """What the live layer delivered to open pages: (workspace_id, html)."""
    sent: list[tuple[int, str]] = []
    monkeypatch.setattr(live, "deliver", lambda workspace_id, html: sent.append((workspace_id, html)))
    return sent


def test_an_api_hygiene_apply_pushes_the_review_counts_to_open_pages(
    workspace, now, told, pushed, django_capture_on_commit_callbacks
):
    junk = make(workspace, now, days=40, content=JUNK)
    gone = make(workspace, now, days=1)
    with django_capture_on_commit_callbacks(execute=True):  # as if committed before
        entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk, now=now)
    told.clear()
    pushed.clear()
    with django_capture_on_commit_callbacks(execute=True), time_machine.travel(now, tick=False):
        body = api("post", "/hygiene/apply", workspace, "operator", {"ids": [junk.pk]})
    assert body["archived"] == [junk.pk]
    assert told == [(workspace.pk, frozenset({"archived"}), 1)]
    assert pushed == [(workspace.pk, live.render_queue(workspace.pk))]
    assert 'data-tombstones="1"' in pushed[0][1]


@pytest.mark.django_db(transaction=True)
def test_revert_run_from_the_command_line_pushes_the_review_counts_once(
    workspace, now, told, pushed, monkeypatch
):
    from maintenance import revert

    for _ in range(3):
        make(workspace, now, days=COLD)
    run_id = _run(workspace, now)
    assert live.queue_counts(workspace)["tombstones"] == 3
    told.clear()
    pushed.clear()
    monkeypatch.setattr(revert, "REVERT_BATCH", 1)  # three batches, one transaction each
    call_command("revert_run", str(run_id), "--workspace", workspace.slug, stdout=StringIO())
    # The batches of the revert are one announcement, and one update of the open pages.
    assert told == [(workspace.pk, frozenset({"active"}), 3)]
    assert pushed == [(workspace.pk, live.render_queue(workspace.pk))]
    html = pushed[0][1]
    assert 'data-automatic="0"' in html and 'data-tombstones="0"' in html


def test_without_the_live_receiver_a_status_change_pushes_nothing(
    workspace, now, pushed, django_capture_on_commit_callbacks
):
    """The signal is the live layer's only news of a status change: no door announces the
    review counts itself any more."""
    junk = make(workspace, now, days=40, content=JUNK)
    connected = entries_changed.disconnect(dispatch_uid="console.live.entries_changed")
    assert connected  # by MemoryConfig.ready
    try:
        with django_capture_on_commit_callbacks(execute=True), time_machine.travel(now, tick=False):
            api("post", "/hygiene/apply", workspace, "operator", {"ids": [junk.pk]})
            api("delete", f"/entries/{junk.pk}", workspace, "agent")
    finally:
        if connected:
            entries_changed.connect(live.on_entries_changed, dispatch_uid="console.live.entries_changed")
    assert pushed == []
