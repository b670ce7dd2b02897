"""Capped counts (``memory.capped``): exact up to the cap, ``cap + 1`` past it, in one
statement, of the workspace's own rows only; the console's header and review tabs show a count
past the cap as "N+", and the hygiene count stops early once it knows it is past the cap.
The cap is lowered to 2 here instead of writing a thousand rows."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console import live
from console.selectors_maintenance import review_counts
from maintenance import hygiene
from memory import accounts, capped, entry_changes, new_entries
from memory.models import Entry, Tombstone

pytestmark = pytest.mark.django_db

JUNK = "half done {}..."  # a hygiene candidate (fragment + truncated)


@pytest.fixture
def cap_2(monkeypatch):
    monkeypatch.setattr(capped, "CAP", 2)


def _entries(workspace, now, n, text="A note about the deploy pipeline number {}."):
    return [
        new_entries.entry_create(workspace=workspace, content=text.format(i), created_at=now, now=now)
        for i in range(n)
    ]


def _tombstone(workspace, entries):
    for e in entries:
        entry_changes.entry_tombstone(workspace=workspace, entry_id=e.pk, actor="user:vera")


def test_counts_are_exact_up_to_the_cap_and_cap_plus_one_past_it_in_one_statement(
    workspace, other_workspace, now
):
    made = _entries(workspace, now, 7)
    _entries(other_workspace, now, 7)
    ours = Entry.objects.filter(workspace=workspace)
    with CaptureQueriesContext(connection) as queries:
        found = capped.capped_counts(
            {
                "below": ours.filter(pk__in=[e.pk for e in made[:3]]),
                "at": ours.filter(pk__in=[e.pk for e in made[:5]]),
                "past": ours,
                "none": ours.filter(pk=0),
                "empty": ours.none(),  # compiles to nothing: counted as 0, not an error
                "no ids": ours.filter(pk__in=[]),
            },
            cap=5,
        )
    assert len(queries.captured_queries) == 1
    assert found == {"below": 3, "at": 5, "past": 6, "none": 0, "empty": 0, "no ids": 0}
    assert capped.capped_count(ours, cap=4) == 5  # past the cap: cap + 1
    assert capped.capped_count(ours, cap=7) == 7
    assert capped.capped_count(Entry.objects.filter(workspace=other_workspace), cap=100) == 7
    assert capped.capped_counts({}) == {}


def test_the_label_marks_a_count_past_the_cap():
    assert capped.label(0) == "0"
    assert capped.label(999) == "999"
    assert capped.label(1000) == "1,000"
    assert capped.label(1001) == "1,000+"
    assert capped.label(7, cap=5) == "5+"


def test_the_header_and_the_review_tabs_show_counts_past_the_cap_as_n_plus(
    client, workspace, other_workspace, now, cap_2
):
    _tombstone(workspace, _entries(workspace, now, 4))
    _tombstone(other_workspace, _entries(other_workspace, now, 1, text="Elsewhere {}."))
    assert Tombstone.objects.filter(workspace=workspace).count() == 4
    assert live.queue_counts(workspace)["tombstones"] == 3  # capped at 2: cap + 1
    assert live.queue_counts(other_workspace)["tombstones"] == 1
    assert review_counts(workspace)["tombstones"] == 3
    assert "2+ tombstones" in live.render_queue(workspace.pk)

    user, _ = get_user_model().objects.get_or_create(username="olga")
    accounts.membership_set(workspace=workspace, user=user, role="operator")
    client.force_login(user)
    page = client.get(f"/console/{workspace.slug}/review/?tab=disputes").content.decode()
    assert re.search(r'id="review-count-tombstones">\s*2\+\s*<', page)
    assert "2+ tombstones" in page  # the header
    # The listed tab's summary counts exactly (its paginator counts the list); its badge reads
    # past the cap like the others (a live update pushes capped counts into it).
    page = client.get(f"/console/{workspace.slug}/review/?tab=tombstones").content.decode()
    assert re.search(r'id="review-count-tombstones">\s*2\+\s*<', page)
    assert "4 open tombstones" in page


def test_the_hygiene_count_stops_past_the_cap_and_counts_exactly_below_it(workspace, now, cap_2):
    _entries(workspace, now, 3, text=JUNK)
    assert hygiene.count(workspace) == 3  # assesses the new entries, exact
    assert hygiene.count(workspace, cap=capped.CAP) == 3  # past the cap of 2: cap + 1
    assert hygiene.count(workspace, cap=5) == 3  # below the cap: exact
    # Entries still to assess are counted exactly while the assessed ones are below the cap.
    _entries(workspace, now, 2, text="more " + JUNK)
    assert hygiene.count(workspace, cap=10) == 5
    assert review_counts(workspace)["hygiene"] == 3
