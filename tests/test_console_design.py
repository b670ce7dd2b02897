"""What the console's pages say, beyond their look: an entry without a title is named by its
first line everywhere (imported memories have none: they all read "(untitled)"); retention is
explained where it appears (it is not a 0–1 score); a run's metrics stand apart from its
changes; the automatic changes of a run count the same on its page as on the review tab."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client

from console.labels import COUNT_LABELS, REASON_LABELS
from console.selectors import LABEL_CHARS, entry_label, interval
from console.templatetags.steward import excerpt_after_label
from maintenance.hygiene_text import POINTS
from maintenance.models import MaintenanceRun
from maintenance.run_results import COUNT_KEYS
from maintenance.run_start import run_maintenance
from maintenance.selectors import hygiene_reason_codes
from memory import entry_changes, new_entries
from memory.models import Entry, Workspace
from memory.policy_model import MaintenancePolicy
from tests.helpers_console import login

pytestmark = pytest.mark.django_db

IMPORTED = "Imported note {}: the deploy key lives in the vault\nSecond line of the note\nThird line"


def page(client: Client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, path
    return response.content.decode()


def imported(workspace: Workspace, now, n: int = 3, days: int = 400) -> list[Entry]:
    """Untitled entries old and unread enough for a full run to tombstone them (decay)."""
    return [
        new_entries.entry_create(
            workspace=workspace, content=IMPORTED.format(i), created_at=now - timedelta(days=days), now=now
        )
        for i in range(n)
    ]


# --- names of entries ---------------------------------------------------------------------------


def test_an_entry_is_named_by_its_title_else_its_first_line():
    assert entry_label("Runbook", "anything") == "Runbook"
    assert entry_label("", "\n\n  First line  \nsecond") == "First line"
    assert entry_label(None, "one line only") == "one line only"
    assert entry_label("  ", "   \n ") == "(empty)"
    long = entry_label("", "x" * 500)
    assert len(long) == LABEL_CHARS and long.endswith("…")


def test_the_excerpt_under_a_label_does_not_repeat_the_first_line():
    assert excerpt_after_label("First\nSecond\nThird") == "Second\nThird"
    assert excerpt_after_label("Only line") == ""
    assert excerpt_after_label("First\nSecond", "A title") == "First\nSecond"


def test_untitled_entries_are_named_by_their_first_line_on_every_page(client, workspace, now):
    entries = imported(workspace, now)
    run_id = run_maintenance(workspace=workspace, now=now)["run_id"]
    tombstoned = Entry.objects.filter(pk__in=[e.pk for e in entries], status="tombstoned").count()
    assert tombstoned == 3
    restored = entries[0]
    entry_changes.entry_restore(workspace=workspace, entry_id=restored.pk)
    login(client, workspace)
    first = "Imported note {}: the deploy key lives in the vault"

    pages = {
        "entries": page(client, "/console/acme/entries/"),
        "entry": page(client, f"/console/acme/entries/{restored.pk}/"),
        "automatic": page(client, "/console/acme/review/?tab=automatic"),
        "tombstones": page(client, "/console/acme/review/?tab=tombstones"),
        "run": page(client, f"/console/acme/runs/{run_id}/"),
    }

    for name, html in pages.items():
        assert "(untitled)" not in html, name
        assert "Second line of the note" not in html.split("<main>")[1].split("Third line")[0] or name in (
            "entry",
            "automatic",
            "tombstones",
        )
    assert f"#{restored.pk} {first.format(0)}</a>" in pages["entries"]
    assert f"<h1>{first.format(0)} <small" in pages["entry"]
    assert f"#{entries[1].pk} {first.format(1)}</a>" in pages["automatic"]
    assert f"#{entries[2].pk} {first.format(2)}</a>" in pages["tombstones"]
    assert f"#{entries[1].pk} {first.format(1)}</a>" in pages["run"]
    # Under the label, the excerpt goes on from the second line: the first is not shown twice.
    row = pages["automatic"].split(f'id="auto-row-{entries[1].pk}"', 1)[1].split("</tr>", 1)[0]
    assert row.count(first.format(1)) == 1 and "Second line of the note" in row


# --- retention, metrics, automatic changes ------------------------------------------------------


def test_retention_is_explained_where_it_appears(client, workspace, now):
    entry = new_entries.entry_create(workspace=workspace, content="A fresh memory")
    MaintenancePolicy.objects.filter(workspace=workspace).update(cold_threshold=0.35)
    login(client, workspace, "viewer")

    for html in (page(client, "/console/acme/entries/"), page(client, f"/console/acme/entries/{entry.pk}/")):
        assert 'id="retention-note"' in html and 'href="#retention-note"' in html
        assert "is not a 0–1 score" in html
        assert "cold threshold (0.35 in this workspace)" in html


def test_a_decay_proposal_says_what_retention_is(client, propose_workspace, now):
    imported(propose_workspace, now, n=2)
    run_maintenance(workspace=propose_workspace, now=now)
    login(client, propose_workspace)

    html = page(client, "/console/initech/review/?tab=pending")

    assert "decayed: retention below the cold threshold" in html
    assert 'id="retention-note"' in html and "is not a 0–1 score" in html


def test_the_runs_tables_show_metrics_in_their_own_column(client, workspace, now):
    imported(workspace, now, n=2)
    run_id = run_maintenance(workspace=workspace, now=now)["run_id"]
    login(client, workspace)

    for html in (page(client, "/console/acme/runs/"), page(client, "/console/acme/")):
        assert ">Measured</th>" in html
        row = html[html.index(f"/runs/{run_id}/") :].split("</tr>", 1)[0]
        changes = row.split('class="changes"', 1)[1].split("</td>", 1)[0]
        metrics = row.split('class="metrics"', 1)[1].split("</td>", 1)[0]
        assert "evicted 2" in changes and "scored" not in changes
        assert "scored" in metrics and "evicted" not in metrics


def test_a_run_page_counts_its_automatic_changes_as_the_review_tab_does(client, workspace, now):
    entries = imported(workspace, now, n=3)
    run_id = run_maintenance(workspace=workspace, now=now)["run_id"]
    entry_changes.entry_restore(workspace=workspace, entry_id=entries[0].pk)  # undone by hand
    login(client, workspace)

    run_page = page(client, f"/console/acme/runs/{run_id}/")
    tab = page(client, f"/console/acme/review/?tab=automatic&run={run_id}")
    header = int(re.search(r'data-automatic="(\d+)"', tab).group(1))

    listed = tab.count('class="queue-row auto-row"')
    assert listed == header == 2
    assert f'?tab=automatic&amp;run={run_id}">2 automatic changes</a> of this run a revert would' in run_page
    assert "2 automatic changes that a revert would undo" in tab


def test_every_count_and_hygiene_reason_has_words():
    # A key added to the API without words here would be shown as an identifier.
    assert set(COUNT_LABELS) == set(COUNT_KEYS)
    assert set(REASON_LABELS) == set(hygiene_reason_codes()) == set(POINTS)


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(45, "45 s"), (90, "90 s"), (600, "10 min"), (3600, "1 h"), (5400, "1 h 30 min"), (86400, "24 h")],
)
def test_an_interval_reads_as_a_person_says_it(seconds, words):
    assert interval(seconds) == words


def test_a_queued_run_says_when_it_was_queued_not_started(client, workspace, now):
    queued = MaintenanceRun.objects.create(workspace=workspace, kind="full", status="queued", trigger="api")
    login(client, workspace)

    row = page(client, "/console/acme/runs/").split(f'id="run-row-{queued.pk}"', 1)[1].split("</tr>", 1)[0]
    run = page(client, f"/console/acme/runs/{queued.pk}/")

    assert "queued <time" in row
    assert "<dt>Queued</dt>" in run and "<dt>Started</dt>" not in run
