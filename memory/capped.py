"""Counts that stop counting at a display limit.

A count shown on every console page (the header's review counts, the review queue's tab
badges) must not cost a scan of the workspace: at a million entries the open tombstones and
the automatic changes a revert would undo are hundreds of thousands of rows, each checked by
subqueries, and counting them exactly took seconds on every page. A capped count reads at most
``CAP + 1`` rows (``SELECT COUNT(*) FROM (… LIMIT CAP + 1)``), so the database stops as soon as
it knows the answer is "more than CAP"; pages show such a count as "1,000+" (the ``capped``
template filter). The list a count links to still pages through every row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import QuerySet

CAP = 1000


def _limited(rows: QuerySet[Any], cap: int) -> tuple[str, tuple[Any, ...]]:
    """``(SELECT COUNT(*) FROM (rows LIMIT cap + 1))`` as SQL and parameters; ``(SELECT 0)`` for
    a queryset that can match nothing (Django refuses to compile one: ``EmptyResultSet``)."""
    limited = rows.order_by().values("pk")[: cap + 1]
    try:
        sql, params = limited.query.get_compiler(using=limited.db).as_sql()
    except EmptyResultSet:
        return "(SELECT 0)", ()
    return f"(SELECT COUNT(*) FROM ({sql}) capped)", tuple(params)


def capped_counts(lists: Mapping[str, QuerySet[Any]], *, cap: int | None = None) -> dict[str, int]:
    """Name → the number of rows of each queryset, at most ``cap + 1`` (more than ``cap`` reads
    as ``cap + 1``; ``CAP`` unless given): one statement for all of them (querysets of one
    database)."""
    if not lists:
        return {}
    cap = CAP if cap is None else cap
    parts: list[str] = []
    params: list[Any] = []
    using = next(iter(lists.values())).db
    for rows in lists.values():
        sql, found = _limited(rows, cap)
        parts.append(sql)
        params.extend(found)
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        row = cursor.fetchone()
    return {name: int(n) for name, n in zip(lists, row, strict=True)}


def capped_count(rows: QuerySet[Any], *, cap: int | None = None) -> int:
    """The number of ``rows``, at most ``cap + 1`` (one statement)."""
    return capped_counts({"rows": rows}, cap=cap)["rows"]


def label(n: Any, cap: int | None = None) -> str:
    """``n`` for a page: thousands separated, "1,000+" past the cap (``CAP`` unless given)."""
    if not isinstance(n, int):
        return str(n)
    cap = CAP if cap is None else cap
    return f"{cap:,}+" if n > cap else f"{n:,}"
