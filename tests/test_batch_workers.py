"""A pass's batches written over several connections at once (``maintenance.batch_workers``):
on PostgreSQL, outside a caller's transaction, each batch is still one transaction of its own
on a worker thread's connection; the run's result is the one a sequential apply gives, a
failing batch stops the pass with every batch whole, and the workers' connections are closed."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction

from maintenance import batch_workers, hygiene_rank, pass_tools, passes, rank_triggers
from maintenance.models import HygieneRankDirty, MaintenanceRun
from maintenance.run_start import run_maintenance
from memory import lifecycle, new_entries
from memory.models import Entry, LifecycleEvent, Tombstone
from memory.policy import PolicyValues

pytestmark = pytest.mark.django_db(transaction=True)
postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="only PostgreSQL writes a pass's batches from several connections",
)


def _backend() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return int(pid)


def _make(workspace, now, n: int, *, age_days: float, **fields) -> list[int]:
    ids = []
    for i in range(n):
        entry = new_entries.entry_create(
            workspace=workspace,
            content=f"note {i} of {age_days} days about the retry budget of job {i * 7919 % 1000}",
            created_at=now - timedelta(days=age_days),
            now=now - timedelta(days=age_days),
        )
        ids.append(entry.pk)
    Entry.objects.filter(pk__in=ids).update(**fields)
    return sorted(ids)


def _idle(workspace, now, n: int) -> list[int]:
    """Semantic entries nobody read or changed for 100 days: a full run marks them stale."""
    return _make(workspace, now, n, age_days=100, tier="semantic", updated_at=now - timedelta(days=100))


def _context(workspace, now, *, batch_size: int = 2, renew=lambda: True) -> pass_tools.RunContext:
    run_row = MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="cli", started_at=now)
    return pass_tools.RunContext(
        workspace=workspace, now=now, policy=PolicyValues(), run=run_row, batch_size=batch_size, renew=renew
    )


@postgresql
def test_every_batch_is_written_once_from_several_connections_which_are_closed_after(
    workspace, now, settings
):
    settings.MAINTENANCE_BATCH_WORKERS = 3
    ids = _idle(workspace, now, 24)
    seen: list[tuple[int, int, tuple[int, ...]]] = []
    lock = threading.Lock()
    original, original_selected = pass_tools._locked_rows, lifecycle.change_selected

    def spy(candidates, fields, batch):
        rows = original(candidates, fields, batch)
        with lock:
            seen.append((threading.get_ident(), _backend(), tuple(batch)))
        return rows

    def spy_selected(*args, **kwargs):  # PostgreSQL: a batch in one statement
        changed = original_selected(*args, **kwargs)
        with lock:
            seen.append((threading.get_ident(), _backend(), tuple(changed)))
        return changed

    mine = _backend()
    ctx = _context(workspace, now)
    passes.score(ctx)
    try:
        pass_tools._locked_rows, lifecycle.change_selected = spy, spy_selected
        result = passes.mark_stale(ctx)
    finally:
        pass_tools._locked_rows, lifecycle.change_selected = original, original_selected
    assert result.ids == ids and result.count == 24
    assert sorted(i for _, _, batch in seen for i in batch) == ids  # each batch once
    backends = {pid for _, pid, _ in seen}
    assert len(backends) >= 2 and mine not in backends
    assert threading.get_ident() not in {thread for thread, _, _ in seen}
    assert set(Entry.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"stale"}
    events = LifecycleEvent.objects.filter(run=ctx.run, to_status="stale")
    assert sorted(events.values_list("entry_ref", flat=True)) == ids
    # The workers' sessions were handed back: closed, or idle in the connection pool (a server
    # process ends shortly after its client leaves); none is left inside a transaction.
    deadline = time.monotonic() + 10
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND state <> 'idle'",
                [sorted(backends)],
            )
            busy = cursor.fetchone()[0]
        if not busy or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert busy == 0


def _settled(run) -> tuple[int, int, int]:
    """No batch worker is left, and what the run wrote stays as it is a moment later."""
    assert not [t for t in threading.enumerate() if t.name.startswith("batch-worker-")]

    def counts() -> tuple[int, int, int]:
        return (
            Entry.objects.filter(status="tombstoned").count() + Entry.objects.filter(status="stale").count(),
            LifecycleEvent.objects.filter(run=run).count(),
            Tombstone.objects.filter(run=run).count(),
        )

    first = counts()
    time.sleep(0.3)
    assert counts() == first
    return first


@postgresql
def test_a_batch_failing_half_way_stops_the_pass_and_leaves_every_batch_whole(workspace, now, settings):
    """A batch fails after writing its events and Tombstones, before its status UPDATE: it
    rolls back whole, the other worker's batch in flight is cancelled or committed whole, and
    no further batch starts."""
    settings.MAINTENANCE_BATCH_WORKERS = 2
    ids = _make(workspace, now, 40, age_days=200)  # episodic and cold: the decay pass tombstones them
    ctx = _context(workspace, now)
    passes.score(ctx)
    original = lifecycle._tombstones
    calls = []

    def failing(*args, **kwargs):
        original(*args, **kwargs)
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("the server went away in the middle of a batch")

    try:
        lifecycle._tombstones = failing
        with pytest.raises(RuntimeError, match="went away"):
            passes.decay(ctx)
    finally:
        lifecycle._tombstones = original
    _settled(ctx.run)
    assert len(calls) < 20  # stopped before the last batches
    tombstoned = set(Entry.objects.filter(pk__in=ids, status="tombstoned").values_list("pk", flat=True))
    # Every batch whole: an entry is tombstoned exactly when its event and Tombstone exist.
    assert tombstoned == set(LifecycleEvent.objects.filter(run=ctx.run).values_list("entry_ref", flat=True))
    assert tombstoned == set(Tombstone.objects.filter(run=ctx.run).values_list("entry_id", flat=True))
    assert len(tombstoned) % 2 == 0 and 0 < len(tombstoned) < len(ids)


@postgresql
def test_a_stop_while_the_workers_write_leaves_every_batch_whole(workspace, now, settings):
    """The worker's stop signal lands in the run's thread (``tasks.WorkerStopping``) while it
    waits for the batch workers: they take no further batch, the one in flight is cancelled or
    committed whole, and none is left running."""
    from maintenance.tasks import WorkerStopping

    settings.MAINTENANCE_BATCH_WORKERS = 2
    ids = _idle(workspace, now, 60)
    renewals: list[int] = []

    def renew() -> bool:
        renewals.append(1)
        if len(renewals) == 4:
            raise WorkerStopping("interrupted: the worker was stopped (SIGTERM)")
        return True

    ctx = _context(workspace, now)
    passes.score(ctx)
    ctx.renew = renew
    with pytest.raises(WorkerStopping):
        passes.mark_stale(ctx)
    _settled(ctx.run)
    stale = set(Entry.objects.filter(pk__in=ids, status="stale").values_list("pk", flat=True))
    assert stale == set(LifecycleEvent.objects.filter(run=ctx.run).values_list("entry_ref", flat=True))
    assert 0 < len(stale) < len(ids) and len(stale) % 2 == 0


@postgresql
@pytest.mark.parametrize("details", [True, False], ids=["sweep, batches read then written", "one statement"])
def test_the_pre_prune_backup_is_taken_once_in_the_run_s_thread_before_any_tombstone(
    workspace, now, settings, monkeypatch, details
):
    """Whether a batch is read then written (a decay sweep reports each eviction's details)
    or one statement (``lifecycle.change_selected``, a full run's), the backup comes first."""
    settings.MAINTENANCE_BATCH_WORKERS = 2
    _make(workspace, now, 20, age_days=200)
    ctx = _context(workspace, now)
    ctx.details = details
    passes.score(ctx)
    selected = lifecycle.change_selected
    statements: list[int] = []

    def counted(*args, **kwargs):
        statements.append(1)
        return selected(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "change_selected", counted)
    backups: list[tuple[int, int]] = []
    ctx.before_destructive = lambda: backups.append(
        (threading.get_ident(), Tombstone.objects.filter(run=ctx.run).count())
    )
    result = passes.decay(ctx)
    assert result.count == 20
    assert backups == [(threading.get_ident(), 0)]
    assert (len(statements) == 9) == (not details) and (not statements) == details  # 10 batches, 1 alone


def test_the_first_batches_go_alone_in_the_callers_thread_until_one_has_a_result(settings):
    """``alone_until``: a destructive pass's batches one at a time in the caller's thread until
    one has changed a row (its backup first), then the rest as usual: over the workers on
    PostgreSQL."""
    settings.MAINTENANCE_BATCH_WORKERS = 2
    alone: list[tuple[int, int]] = []
    rest: list[tuple[int, int]] = []
    beats: list[int] = []

    def first(batch):
        alone.append((threading.get_ident(), batch[0]))
        return batch[0] if batch[0] >= 2 else None  # batches 0 and 1 change nothing

    def work(batch):
        rest.append((threading.get_ident(), batch[0]))
        return batch[0]

    me = threading.get_ident()
    batches = [[n] for n in range(8)]
    done = list(batch_workers.each_batch(batches, work, lambda: beats.append(me), alone_until=first))
    assert alone == [(me, 0), (me, 1), (me, 2)]
    assert sorted(n for _, n in rest) == [3, 4, 5, 6, 7]
    assert done[0] == 2 and sorted(done) == [2, 3, 4, 5, 6, 7]
    assert len(beats) >= 8
    assert ({t for t, _ in rest} == {me}) == (connection.vendor != "postgresql")
    # No batch changes anything: every one goes alone, and none is left for the workers.
    alone.clear()
    assert list(batch_workers.each_batch(batches[:2], work, lambda: None, alone_until=first)) == []
    assert alone == [(me, 0), (me, 1)]


@postgresql
def test_a_lost_lease_stops_the_batches_in_the_callers_thread(workspace, now, settings):
    settings.MAINTENANCE_BATCH_WORKERS = 2
    ids = _idle(workspace, now, 60)
    renewals: list[int] = []

    def renew() -> bool:
        renewals.append(threading.get_ident())
        return len(renewals) < 4

    ctx = _context(workspace, now)
    passes.score(ctx)
    ctx.renew = renew
    with pytest.raises(pass_tools.LeaseLost):
        passes.mark_stale(ctx)
    _settled(ctx.run)
    assert set(renewals) == {threading.get_ident()}
    stale = set(Entry.objects.filter(pk__in=ids, status="stale").values_list("pk", flat=True))
    assert stale == set(LifecycleEvent.objects.filter(run=ctx.run).values_list("entry_ref", flat=True))
    assert 0 < len(stale) < len(ids)


def test_inside_a_callers_transaction_or_on_sqlite_the_batches_stay_in_its_connection(
    workspace, now, settings
):
    settings.MAINTENANCE_BATCH_WORKERS = 2
    ids = _idle(workspace, now, 8)
    threads = set()
    original, original_selected = pass_tools._locked_rows, lifecycle.change_selected

    def spy(candidates, fields, batch):
        threads.add(threading.get_ident())
        return original(candidates, fields, batch)

    def spy_selected(*args, **kwargs):  # PostgreSQL: a batch in one statement
        threads.add(threading.get_ident())
        return original_selected(*args, **kwargs)

    ctx = _context(workspace, now)
    passes.score(ctx)
    try:
        pass_tools._locked_rows, lifecycle.change_selected = spy, spy_selected
        with transaction.atomic():
            assert not batch_workers.concurrent(4)
            result = passes.mark_stale(ctx)
    finally:
        pass_tools._locked_rows, lifecycle.change_selected = original, original_selected
    assert result.ids == ids and threads == {threading.get_ident()}
    assert batch_workers.concurrent(4) == (connection.vendor == "postgresql")
    settings.MAINTENANCE_BATCH_WORKERS = 1
    assert not batch_workers.concurrent(4)


def test_a_run_over_several_connections_applies_exactly_what_its_dry_run_reported(workspace, now, settings):
    """The guarantee of a dry run, with the apply's batches on worker threads (PostgreSQL)."""
    settings.MAINTENANCE_BATCH_WORKERS = 2
    _idle(workspace, now, 14)
    _make(workspace, now, 14, age_days=200)
    dry = run_maintenance(workspace=workspace, now=now, dry_run=True, force=True, batch_size=2)
    real = run_maintenance(workspace=workspace, now=now, force=True, batch_size=2)
    assert real["status"] == "succeeded"
    assert real["counts"] == dry["counts"] and real["affected"] == dry["affected"]
    # Both kinds idle for 100 days are marked stale; the episodic ones, cold, are evicted.
    assert real["counts"]["stale_marked"] == 28 and real["counts"]["evicted"] == 14


@postgresql
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("many", [False, True], ids=["few", "many"])
def test_a_batch_commits_without_waiting_for_the_disk_and_a_large_pass_marks_the_workspace_once(
    workspace, now, settings, monkeypatch, many, workers
):
    """Each batch's transaction, on whichever connection: ``synchronous_commit`` off, and the
    hygiene rank's marks off when the pass changes more entries than a fold takes one by one
    (``pass_tools.batch_transaction``); both only for that transaction: the connection that
    ran a batch is back to both after it (and a worker's is closed)."""
    settings.MAINTENANCE_BATCH_WORKERS = workers
    ids = _idle(workspace, now, 12)
    HygieneRankDirty.objects.all().delete()
    inside: list[tuple[str, str | None]] = []
    after: list[tuple[str, str | None]] = []
    original = lifecycle.change_selected

    def settings_now() -> tuple[str, str | None]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('synchronous_commit'), current_setting(%s, true)",
                [rank_triggers.MARKS_SETTING],
            )
            return cursor.fetchone()

    def spy(*args, **kwargs):
        inside.append(settings_now())
        return original(*args, **kwargs)

    def heartbeat() -> bool:  # in the caller's thread, between batches
        after.append(settings_now())
        return True

    monkeypatch.setattr(lifecycle, "change_selected", spy)
    monkeypatch.setattr(hygiene_rank, "REBUILD_OVER", 11 if many else 12)
    assert passes.mark_stale(_context(workspace, now, batch_size=4, renew=heartbeat)).ids == ids
    assert len(inside) == 3 and {s[0] for s in inside} == {"off"}
    assert {s[1] == "off" for s in inside} == {many}
    assert after and all(s[0] == "on" and s[1] != "off" for s in after)
    marks = list(HygieneRankDirty.objects.order_by("id").values_list("entry_id", flat=True))
    if many:
        assert marks == [rank_triggers.EVERY_ENTRY] * 3
    else:
        assert sorted(marks) == ids


def _tombstoned_by_a_run(workspace, now, n: int) -> tuple[int, list[int], int]:
    """``n`` entries past their TTL, which a forced full run tombstones although each is linked
    from one fresh partner (whose importance counts them again once they leave the tombstone):
    the run's id, the entries' ids, the partner's id."""
    from memory import relationships

    ids = _make(workspace, now, n, age_days=20, expires_at=now - timedelta(days=1))
    partner = new_entries.entry_create(workspace=workspace, content="the note every cold one cites", now=now)
    for i in ids:
        relationships.relationship_create(workspace=workspace, from_id=partner.pk, to_id=i, now=now)
    run_id = run_maintenance(workspace=workspace, now=now, force=True)["run_id"]
    assert set(Entry.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"tombstoned"}
    return run_id, ids, partner.pk


@postgresql
@pytest.mark.parametrize("many", [False, True], ids=["few", "many"])
def test_a_whole_run_revert_goes_over_several_connections_and_rescores_once_all_are_done(
    workspace, now, settings, monkeypatch, many
):
    """A revert's batches lock disjoint entries, events and tombstones: on PostgreSQL they go
    over two connections at once, each one transaction. The partners of the entries that left
    the tombstone are rescored after the last batch, in the caller's thread; a revert of more
    entries than a rank fold takes one by one leaves one rank mark per batch."""
    from maintenance import revert
    from memory.scoring_db import refresh_scores

    settings.MAINTENANCE_BATCH_WORKERS = 2
    run_id, ids, partner = _tombstoned_by_a_run(workspace, now, 12)
    at = now + timedelta(hours=1)
    refresh_scores(workspace, now=at, ids=[partner])
    without = Entry.objects.get(pk=partner).importance  # no tombstoned end counts
    HygieneRankDirty.objects.all().delete()
    monkeypatch.setattr(revert, "REVERT_BATCH", 2)
    monkeypatch.setattr(hygiene_rank, "REBUILD_OVER", 11 if many else 12)
    seen: list[tuple[int, int, tuple[int, ...]]] = []
    rescored: list[tuple[int, list[int]]] = []
    lock = threading.Lock()
    original_batch, original_rescore = revert._revert_batch, revert._rescore_link_ends

    def spy_batch(workspace, by_entry, **kwargs):
        with lock:
            seen.append((threading.get_ident(), _backend(), tuple(by_entry)))
        return original_batch(workspace, by_entry, **kwargs)

    def spy_rescore(workspace, entry_ids, **kwargs):
        rescored.append((threading.get_ident(), sorted(entry_ids)))
        return original_rescore(workspace, entry_ids, **kwargs)

    monkeypatch.setattr(revert, "_revert_batch", spy_batch)
    monkeypatch.setattr(revert, "_rescore_link_ends", spy_rescore)
    result = revert.revert_run(workspace, run_id, actor="user:op", now=at)

    assert result["reverted"] == ids and result["skipped"] == []
    assert sorted(i for _, _, batch in seen for i in batch) == ids and len(seen) == 6
    assert len({pid for _, pid, _ in seen}) >= 2 and _backend() not in {pid for _, pid, _ in seen}
    assert not [t for t in threading.enumerate() if t.name.startswith("batch-worker-")]
    assert rescored == [(threading.get_ident(), ids)]
    assert set(Entry.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"active"}
    assert not Tombstone.objects.filter(entry_id__in=ids, restored_at__isnull=True).exists()
    undone = LifecycleEvent.objects.filter(run_id=run_id, entry_id__in=ids).exclude(reason="revert")
    assert undone.count() == 12 and not undone.filter(reverted_at__isnull=True).exists()
    assert LifecycleEvent.objects.filter(reason="revert", entry_id__in=ids).count() == 12
    assert Entry.objects.get(pk=partner).importance > without  # its twelve links count again
    marks = list(HygieneRankDirty.objects.values_list("entry_id", flat=True))
    if many:
        assert marks == [rank_triggers.EVERY_ENTRY] * 6
    else:
        assert sorted(marks) == ids


@postgresql
def test_a_revert_batch_failing_half_way_leaves_every_batch_whole_and_a_second_revert_finishes(
    workspace, now, settings, monkeypatch
):
    from maintenance import revert
    from memory.scoring_db import refresh_scores

    settings.MAINTENANCE_BATCH_WORKERS = 2
    run_id, ids, partner = _tombstoned_by_a_run(workspace, now, 20)
    at = now + timedelta(hours=1)
    refresh_scores(workspace, now=at, ids=[partner])
    without = Entry.objects.get(pk=partner).importance
    monkeypatch.setattr(revert, "REVERT_BATCH", 2)
    original = lifecycle._events_each
    calls: list[int] = []

    def failing(*args, **kwargs):
        original(*args, **kwargs)
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("the server went away in the middle of a batch")

    monkeypatch.setattr(lifecycle, "_events_each", failing)
    with pytest.raises(RuntimeError, match="went away"):
        revert.revert_run(workspace, run_id, actor="user:op", now=at)
    assert not [t for t in threading.enumerate() if t.name.startswith("batch-worker-")]
    active = set(Entry.objects.filter(pk__in=ids, status="active").values_list("pk", flat=True))

    # Every batch whole: an entry is back exactly when its revert event exists, its run's event
    # is marked reverted and its Tombstone closed.
    def entries(rows) -> set[int]:
        return set(rows.values_list("entry_id", flat=True))

    assert active == entries(LifecycleEvent.objects.filter(reason="revert"))
    assert active == entries(LifecycleEvent.objects.filter(run_id=run_id, reverted_at__isnull=False))
    assert active == entries(Tombstone.objects.filter(restored_at__isnull=False))
    assert len(active) % 2 == 0 and 0 < len(active) < len(ids)
    # The batches that committed had their neighbour rescored before the error went on: a
    # second revert will not see them again.
    assert Entry.objects.get(pk=partner).importance > without

    monkeypatch.setattr(lifecycle, "_events_each", original)
    again = revert.revert_run(workspace, run_id, actor="user:op", now=now + timedelta(hours=2))
    assert sorted(again["reverted"]) == sorted(set(ids) - active)
    assert set(Entry.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"active"}
