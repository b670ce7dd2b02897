"""Every paginated list of the API reports the true total in ``count`` whatever the offset:
before the last page, on it, at its end and past it. An agent that pages until a
page comes back empty and trusts the last ``count`` gets the right total."""

import itertools
import json
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from maintenance.backups import write_backup
from maintenance.models import Backup, Dispute, MaintenanceRun
from memory import accounts, entry_changes, new_entries, selectors
from memory.models import Entry, LifecycleEvent

pytestmark = pytest.mark.django_db

TOTAL = 5
LIMIT = 2
OFFSETS = [0, 1, 2, 3, 4, TOTAL, TOTAL + 1, 100, 10_000]


def get(path: str, secret: str) -> dict:
    response = Client().get(f"/api/v1{path}", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200, response.content
    return json.loads(response.content)


def entries(workspace) -> str:
    for n in range(TOTAL):
        new_entries.entry_create(workspace=workspace, content=f"listed memory {n} about retry storms")
    return "/entries"


def versions(workspace) -> str:
    entry = new_entries.entry_create(workspace=workspace, content="version 0 of a retry note")
    for n in range(1, TOTAL):
        entry = entry_changes.entry_update(
            workspace=workspace, entry_id=entry.pk, content=f"version {n}"
        ).entry
    return f"/entries/{entry.pk}/versions"


def history(workspace) -> str:
    entry = new_entries.entry_create(workspace=workspace, content="a note with a history")
    LifecycleEvent.objects.filter(workspace=workspace).delete()
    LifecycleEvent.objects.bulk_create(
        LifecycleEvent(workspace=workspace, entry=entry, entry_ref=entry.pk, to_status="active", reason="t")
        for _ in range(TOTAL)
    )
    return f"/entries/{entry.pk}/history"


def search(workspace) -> str:
    entries(workspace)
    new_entries.entry_create(workspace=workspace, content="an unrelated note about caching")
    return "/search?q=retry"


def runs(workspace) -> str:
    start = timezone.now() - timedelta(days=1)
    MaintenanceRun.objects.bulk_create(
        MaintenanceRun(workspace=workspace, kind="full", trigger="cli", status="succeeded", started_at=start)
        for _ in range(TOTAL)
    )
    return "/maintenance/runs"


def tombstones(workspace) -> str:
    for n in range(TOTAL):
        entry = new_entries.entry_create(workspace=workspace, content=f"a note to forget {n}")
        entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk)
    return "/tombstones"


def backups(workspace) -> str:
    new_entries.entry_create(workspace=workspace, content="a note worth a backup")
    for n in range(TOTAL):
        write_backup(workspace, now=timezone.now() - timedelta(hours=n))
    return "/backups"


def hygiene(workspace) -> str:
    for n in range(TOTAL):
        new_entries.entry_create(
            workspace=workspace, content=f"wip {n}...", created_at=timezone.now() - timedelta(days=40)
        )
    return "/hygiene/preview"


def disputes(workspace) -> str:
    made = [new_entries.entry_create(workspace=workspace, content=f"rule {n}") for n in range(TOTAL + 1)]
    for a, b in itertools.pairwise(made):
        Dispute.objects.create(workspace=workspace, entry_a=a, entry_b=b, detected_by="sweep")
    return "/disputes"


LISTS: dict[str, Callable] = {
    "entries": entries,
    "versions": versions,
    "history": history,
    "search": search,
    "runs": runs,
    "tombstones": tombstones,
    "backups": backups,
    "hygiene": hygiene,
    "disputes": disputes,
}


def items(body: dict) -> list:
    return body["candidates"] if "candidates" in body else body["items"]


@pytest.fixture
def agent(workspace) -> str:
    return accounts.api_key_create(workspace=workspace, name="lists", role="agent")[1]


def page_path(path: str, **query) -> str:
    joiner = "&" if "?" in path else "?"
    return path + joiner + "&".join(f"{k}={v}" for k, v in query.items())


@pytest.mark.parametrize("name", LISTS)
def test_every_list_counts_its_true_total_before_at_and_past_its_end(workspace, agent, name):
    path = LISTS[name](workspace)
    shown = []
    for offset in OFFSETS:
        body = get(page_path(path, limit=LIMIT, offset=offset), agent)
        assert (body["count"], body["limit"], body["offset"]) == (TOTAL, LIMIT, offset), offset
        assert len(items(body)) == max(0, min(LIMIT, TOTAL - offset)), offset
        if offset % LIMIT == 0:
            shown += [row["id"] for row in items(body)]
    whole = get(page_path(path, limit=500), agent)
    assert whole["count"] == TOTAL
    assert [row["id"] for row in items(whole)] == shown  # the pages tile the list


def _first_two(queryset) -> list[int]:
    return list(queryset.order_by("pk").values_list("pk", flat=True)[:2])


SHRINK: dict[str, Callable] = {
    "entries": lambda ws: Entry.objects.filter(pk__in=_first_two(ws.entries)).delete(),
    "runs": lambda ws: MaintenanceRun.objects.filter(pk__in=_first_two(ws.runs)).delete(),
    "backups": lambda ws: Backup.objects.filter(pk__in=_first_two(ws.backups)).delete(),
    "tombstones": lambda ws: [
        entry_changes.entry_restore(workspace=ws, entry_id=t.entry_id)
        for t in ws.tombstones.order_by("pk")[:2]
    ],
}


@pytest.mark.parametrize("name", SHRINK)
def test_a_page_past_the_end_counts_exactly_when_a_larger_total_was_cached(
    workspace, agent, name, monkeypatch
):
    # Above COUNT_EXACT_UP_TO a full page serves a count cached for a while; a page past the
    # end must not repeat a total that has shrunk since (rows restored, purged, deleted).
    monkeypatch.setattr(selectors, "COUNT_EXACT_UP_TO", 1)
    path = LISTS[name](workspace)
    assert get(page_path(path, limit=1, offset=1), agent)["count"] == TOTAL  # counted, then cached
    SHRINK[name](workspace)
    assert get(page_path(path, limit=1, offset=1), agent)["count"] == TOTAL  # the cached total
    past = get(page_path(path, limit=1, offset=TOTAL), agent)
    assert (past["count"], items(past)) == (TOTAL - 2, [])
