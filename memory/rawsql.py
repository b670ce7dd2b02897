"""Helpers for the few hot statements written as SQL once instead of compiled by the ORM on
every call (the API key lookup, the rescoring of a write's entries): compiling a query costs
~1-2 ms of CPU per call on the benchmark machine (bench/reports/api.md).

What they read comes back through the same converters the ORM applies, so a raw read gives the
Python values an ORM read gives on both databases (SQLite returns datetimes as text).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import CharField, Field, Lookup, Model, TextField

Converter = Callable[[Any, Any, Any], Any]


def quote(name: str) -> str:
    return connection.ops.quote_name(name)


def table(model: type[Model]) -> str:
    return quote(model._meta.db_table)


def temp_table(name: str) -> str:
    """The temporary table ``name`` of this connection, schema-qualified (so that a real table
    of the same name can never be meant)."""
    schema = "pg_temp" if connection.vendor == "postgresql" else "temp"
    return f"{schema}.{name}"


def column(model: type[Model], name: str) -> str:
    """The quoted column of ``model``'s field ``name``."""
    field: Field[Any, Any] = model._meta.get_field(name)  # type: ignore[assignment]
    return quote(field.column)


def _converters(model: type[Model], name: str) -> tuple[Any, tuple[Converter, ...]]:
    """The column and converters of ``model``'s field ``name`` on this thread's connection,
    cached on that connection (its converters are bound to its own ``ops``)."""
    conn = connections[DEFAULT_DB_ALIAS]  # the thread's own wrapper, not the shared proxy
    cache: dict[tuple[type[Model], str], tuple[Any, tuple[Converter, ...]]]
    cache = conn.__dict__.setdefault("_rawsql_converters", {})
    found = cache.get((model, name))
    if found is None:
        field: Field[Any, Any] = model._meta.get_field(name)  # type: ignore[assignment]
        col = field.get_col(model._meta.db_table)
        converters = (*conn.ops.get_db_converters(col), *field.get_db_converters(conn))  # type: ignore[attr-defined]
        found = cache[(model, name)] = (col, converters)
    return found


def from_db(model: type[Model], name: str, value: Any) -> Any:
    """The Python value of ``model``'s field ``name`` as the ORM would read ``value``."""
    if value is None:
        return None
    col, converters = _converters(model, name)
    for convert in converters:
        value = convert(value, col, connection)
    return value


def from_db_row(model: type[Model], names: Sequence[str], values: Sequence[Any]) -> list[Any]:
    return [from_db(model, name, value) for name, value in zip(names, values, strict=True)]


def instance(model: type[Model], attnames: Sequence[str], raw: Sequence[Any]) -> Any:
    """``model``'s instance from a raw row holding ``attnames`` (in the model's field order),
    its values read as the ORM reads them; a row of fewer fields defers the rest."""
    return model.from_db(connection.alias, list(attnames), from_db_row(model, attnames, raw))


def in_values(values: Sequence[Any]) -> tuple[str, list[Any]]:
    """``column <this>`` matching any of ``values``, and its parameters: one array on
    PostgreSQL (one statement text, prepared once, for any count), one parameter each on
    SQLite."""
    if connection.vendor == "postgresql":
        return "= ANY(%s)", [list(values)]
    return f"IN ({', '.join(['%s'] * len(values))})", list(values)


class AnyOf(Lookup):  # type: ignore[type-arg]
    """``filter(<integer field>__any_of=ids)``: ``in_values`` for the ORM. Thousands of ids are
    one array parameter on PostgreSQL, where ``__in`` compiles, sends and parses one
    placeholder per id (a quarter of a restore's time went there: bench/reports/maintenance.md,
    the restore section). Registered on integer fields and relations by ``MemoryConfig.ready``."""

    lookup_name = "any_of"
    prepare_rhs = False

    def get_prep_lookup(self) -> list[int]:
        return [int(value) for value in self.rhs]

    def as_sql(self, compiler: Any, conn: Any) -> tuple[str, list[Any]]:
        if not self.rhs:
            raise EmptyResultSet
        lhs, lhs_params = self.process_lhs(compiler, conn)
        return f"{lhs} IN ({', '.join(['%s'] * len(self.rhs))})", [*lhs_params, *self.rhs]

    def as_postgresql(self, compiler: Any, conn: Any) -> tuple[str, list[Any]]:
        if not self.rhs:
            raise EmptyResultSet
        lhs, lhs_params = self.process_lhs(compiler, conn)
        return f"{lhs} = ANY(%s::bigint[])", [*lhs_params, self.rhs]


@functools.cache
def _insert_fields(vendor: str, model: type[Model]) -> tuple[tuple[Any, str], ...]:
    """``model``'s stored fields with their quoted columns (generated ones are the database's)."""
    return tuple(
        (field, quote(field.column))
        for field in model._meta.concrete_fields
        if not getattr(field, "generated", False)
    )


def insert_values(instance: Model, computed: Mapping[str, str]) -> tuple[list[str], list[str], list[Any]]:
    """The quoted columns, value expressions and parameters of an INSERT of ``instance``, each
    field's value prepared as Django's insert compiler prepares it (``pre_save``, then
    ``get_db_prep_save``). A field in ``computed`` (by attname) takes that SQL expression
    instead; generated fields are the database's, and an unset primary key is left out."""
    columns, values, params = [], [], []
    for field, quoted in _insert_fields(connection.vendor, type(instance)):
        if field.attname in computed:
            columns.append(quoted)
            values.append(computed[field.attname])
        elif field.primary_key and getattr(instance, field.attname) is None:
            continue
        else:
            columns.append(quoted)
            values.append("%s")
            params.append(field.get_db_prep_save(field.pre_save(instance, True), connection))
    return columns, values, params


def update_rows(model: type[Model], names: Sequence[str], rows: Sequence[Sequence[Any]]) -> int:
    """UPDATE ``model``'s fields ``names`` of each row of ``rows`` — (primary key, *values),
    one per row — in ONE statement: on PostgreSQL ``UPDATE … FROM unnest(<one array per
    column>)``, one parameter per column whatever the rows; on SQLite (3.33 and later)
    ``UPDATE … FROM (VALUES …)``, one parameter per value, so keep ``rows`` to a few hundred
    there. Each value is prepared as the ORM prepares it for a save. What
    ``QuerySet.bulk_update`` sends instead is a ``CASE WHEN pk = … THEN …`` per field and row,
    which PostgreSQL evaluates row by row: 54 s for 28,000 proposals of a workspace of 100,000
    entries (bench/reports/maintenance.md, "Propose mode at scale"). Returns the rows updated."""
    if not rows:
        return 0
    meta = model._meta
    fields: list[Field[Any, Any]] = [meta.get_field(name) for name in names]  # type: ignore[misc]
    columns: list[list[Any]] = [[] for _ in range(len(fields) + 1)]
    for pk, *values in rows:
        columns[0].append(pk)
        for i, (field, value) in enumerate(zip(fields, values, strict=True), start=1):
            columns[i].append(field.get_db_prep_save(value, connection))
    if connection.vendor == "postgresql":
        # Arrays typed as the columns, text as text (a cast to varchar(n) would cut a longer
        # value where the assignment refuses it).
        types = [meta.pk.rel_db_type(connection), *(_value_type(f) for f in fields)]  # type: ignore[union-attr,attr-defined]
        names_of = ["k", *(f"v{i}" for i in range(len(fields)))]
        source = f"unnest({', '.join(f'%s::{t}[]' for t in types)}) AS v ({', '.join(names_of)})"
        params: list[Any] = columns
    else:
        # A VALUES list's columns are column1, column2, … (SQLite takes no names for them; and
        # its driver counts no rows for an UPDATE written after a WITH).
        names_of = [f"column{i + 1}" for i in range(len(fields) + 1)]
        one = "(" + ", ".join(["%s"] * len(names_of)) + ")"
        source = f"(VALUES {', '.join([one] * len(rows))}) AS v"
        params = [value for row in zip(*columns, strict=True) for value in row]
    sets = ", ".join(
        f"{quote(field.column)} = v.{name}" for field, name in zip(fields, names_of[1:], strict=True)
    )
    sql = (
        f"UPDATE {table(model)} SET {sets} FROM {source} "
        f"WHERE {table(model)}.{quote(meta.pk.column)} = v.{names_of[0]}"  # type: ignore[union-attr]
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def insert_records(model: type[Model], names: Sequence[str], rows: Sequence[Sequence[Any]]) -> int:
    """INSERT a row of ``model`` per item of ``rows`` (the values of fields ``names``, in that
    order; every other column takes its database default or NULL) in ONE statement. Values are
    plain: ids for relations, aware datetimes, JSON-able objects for JSON fields.

    On PostgreSQL the rows travel as one JSON document (orjson) that the server reads back as
    typed columns (``jsonb_to_recordset``): text is cast to text, so a value too long for its
    column is refused, not cut. Django's ``bulk_create`` sends a parameter per value and reads
    every new id back (80 µs a row for proposals), and arrays of columns cost psycopg about as
    much to write out, element by element (bench/reports/maintenance.md, "Propose mode's steady
    state"). On SQLite: each value prepared as the ORM prepares it, one ``executemany``.
    Returns the rows inserted."""
    if not rows:
        return 0
    meta = model._meta
    fields: list[Field[Any, Any]] = [meta.get_field(name) for name in names]  # type: ignore[misc]
    columns = ", ".join(quote(field.column) for field in fields)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            keys = [f"c{i}" for i in range(len(fields))]
            typed = ", ".join(f"{key} {_value_type(field)}" for key, field in zip(keys, fields, strict=True))
            document = orjson.dumps([dict(zip(keys, row, strict=True)) for row in rows])
            cursor.execute(
                f"INSERT INTO {table(model)} ({columns}) SELECT {', '.join(keys)} "
                f"FROM jsonb_to_recordset(%s::jsonb) AS x({typed})",
                [document.decode()],
            )
            return cursor.rowcount
        prepared = [
            [field.get_db_prep_save(value, connection) for field, value in zip(fields, row, strict=True)]
            for row in rows
        ]
        marks = ", ".join(["%s"] * len(fields))
        cursor.executemany(f"INSERT INTO {table(model)} ({columns}) VALUES ({marks})", prepared)
    return len(rows)


def _value_type(field: Field[Any, Any]) -> str:
    if isinstance(field, CharField | TextField):
        return "text"
    return str(field.db_type(connection))
