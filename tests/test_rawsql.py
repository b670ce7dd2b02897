"""memory.rawsql reads a raw row's values as the ORM reads them, with the converters of the
calling thread's own connection (each thread has its own DatabaseWrapper and ``ops``)."""

import threading
from datetime import UTC, datetime

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from memory import new_entries, rawsql
from memory.models import Entry


def _raw_datetime() -> object:
    """``2026-01-02 03:04:05.000006+00`` as this database's driver returns it."""
    moment = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    return "2026-01-02 03:04:05.000006" if connection.vendor == "sqlite" else moment


def _bound_owners() -> set[int]:
    _col, converters = rawsql._converters(Entry, "created_at")
    return {id(c.__self__) for c in converters if hasattr(c, "__self__") and c.__self__ is not None}


def test_from_db_reads_a_datetime_as_the_orm_does():
    assert rawsql.from_db(Entry, "created_at", _raw_datetime()) == datetime(
        2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC
    )
    assert rawsql.from_db(Entry, "created_at", None) is None


@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="PostgreSQL's driver returns datetimes: no converter bound to ops"
)
def test_converters_are_those_of_the_calling_threads_connection():
    here = connections[DEFAULT_DB_ALIAS]
    seen: dict[str, object] = {}

    def in_thread() -> None:
        try:
            there = connections[DEFAULT_DB_ALIAS]
            seen["value"] = rawsql.from_db(Entry, "created_at", _raw_datetime())
            seen["owners"] = _bound_owners()
            seen["ops"] = id(there.ops)
            seen["wrapper"] = id(there)
        finally:
            connections.close_all()

    rawsql.from_db(Entry, "created_at", _raw_datetime())  # fills this thread's cache first
    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join()

    assert seen["value"] == datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert seen["wrapper"] != id(here)
    # Every converter bound to an ``ops`` object is bound to the thread's own, never to the
    # thread that asked first (SQLite converts datetimes with a bound method of its ops).
    assert _bound_owners() == {id(here.ops)}
    assert seen["owners"] == {seen["ops"]}


@pytest.mark.django_db
def test_any_of_matches_what_in_matches_with_one_parameter_on_postgresql(workspace):
    ids = [new_entries.entry_create(workspace=workspace, content=f"note {i}").pk for i in range(5)]
    wanted = [ids[0], ids[3], 10**12]  # an id nobody has matches nothing
    entries = Entry.objects.filter(workspace=workspace)

    with CaptureQueriesContext(connection) as queries:
        found = sorted(entries.filter(pk__any_of=wanted).values_list("pk", flat=True))
        through_relation = Entry.tags.through.objects.filter(entry_id__any_of=wanted).count()

    assert found == sorted(entries.filter(pk__in=wanted).values_list("pk", flat=True)) == [ids[0], ids[3]]
    assert through_relation == 0
    assert list(entries.filter(pk__any_of=[])) == []
    if connection.vendor == "postgresql":
        assert all("= ANY(" in q["sql"] for q in queries)
        assert all(str(10**12) in q["sql"] for q in queries)  # the array, one parameter


@pytest.mark.django_db
def test_any_of_exists_only_for_integer_columns_and_relations():
    from django.core.exceptions import FieldError

    with pytest.raises(FieldError):
        Entry.objects.filter(title__any_of=[1])
    assert list(Entry.objects.filter(supersedes__any_of=[10**12])) == []


@pytest.mark.django_db
def test_update_rows_writes_each_rows_values_in_one_statement_as_the_orm_would(propose_workspace):
    from django.db import DataError, transaction

    from maintenance.models import MaintenanceRun, Proposal

    entries = [new_entries.entry_create(workspace=propose_workspace, content=f"note {i}") for i in range(3)]
    first, second = (
        MaintenanceRun.objects.create(workspace=propose_workspace, kind="full") for _ in range(2)
    )
    rows = [
        Proposal.objects.create(
            workspace=propose_workspace,
            run=first,
            entry=e,
            entry_ref=e.pk,
            action="tombstone",
            reason="evicted",
        )
        for e in entries
    ]
    values = [{"retention": 0.125, "nested": {"a": [1, 2]}}, {"why": 'it\'s "quoted" — ünïcode'}, {}]

    with CaptureQueriesContext(connection) as queries:
        n = rawsql.update_rows(
            Proposal,
            ["run", "reason", "values", "why"],
            [
                (rows[0].pk, second.pk, "pruned", values[0], "why 0"),
                (rows[1].pk, second.pk, "pruned", values[1], "why 1"),
                (rows[2].pk, second.pk, "expired", values[2], ""),
            ],
        )

    assert n == 3 and len(queries) == 1
    got = {p.pk: (p.run_id, p.reason, p.values, p.why) for p in Proposal.objects.all()}
    assert got == {
        rows[0].pk: (second.pk, "pruned", values[0], "why 0"),
        rows[1].pk: (second.pk, "pruned", values[1], "why 1"),
        rows[2].pk: (second.pk, "expired", {}, ""),
    }
    assert rawsql.update_rows(Proposal, ["why"], []) == 0
    if connection.vendor == "postgresql":  # SQLite does not enforce a varchar's length
        with pytest.raises(DataError), transaction.atomic():
            rawsql.update_rows(Proposal, ["why"], [(rows[0].pk, "x" * 301)])  # refused, not cut


def test_insert_records_writes_every_row_in_one_statement_as_the_orm_would(propose_workspace):
    from django.db import DataError, transaction

    from maintenance.models import MaintenanceRun, Proposal

    entries = [new_entries.entry_create(workspace=propose_workspace, content=f"note {i}") for i in range(3)]
    run = MaintenanceRun.objects.create(workspace=propose_workspace, kind="full")
    now = timezone.now()
    values = [{"retention": 0.125, "nested": {"a": [1, 2]}}, {"why": 'it\'s "quoted" — ünïcode'}, {}]
    names = ["workspace", "run", "entry", "entry_ref", "action", "reason", "values", "why", "created_at"]
    names += ["status", "decided_by", "note"]
    rows = [
        (propose_workspace.pk, run.pk, e.pk, e.pk, "tombstone", "evicted", v, f"why {i}", now, "open", "", "")
        for i, (e, v) in enumerate(zip(entries, values, strict=True))
    ]

    with CaptureQueriesContext(connection) as queries:
        n = rawsql.insert_records(Proposal, names, rows)

    assert n == 3 and len(queries) == 1
    got = sorted(
        Proposal.objects.values_list("entry_ref", "run_id", "values", "why", "created_at", "decided_at")
    )
    assert got == [
        (e.pk, run.pk, v, f"why {i}", now, None) for i, (e, v) in enumerate(zip(entries, values, strict=True))
    ]
    assert rawsql.insert_records(Proposal, names, []) == 0
    if connection.vendor == "postgresql":  # SQLite does not enforce a varchar's length
        too_long = (*rows[0][:3], 10**9, *rows[0][4:7], "x" * 301, *rows[0][8:])
        with pytest.raises(DataError), transaction.atomic():
            rawsql.insert_records(Proposal, names, [too_long])  # refused, not cut
    assert Proposal.objects.count() == 3
