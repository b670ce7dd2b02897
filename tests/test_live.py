"""The workspace live-update consumer: members only, and what a publisher sends arrives —
from this process directly, from another process through the outbox relay (embedded mode),
only after commit, and without ever breaking the run that announces; whichever door a change
comes through (the JSON API, a management command), open pages get the new review counts."""

import asyncio
import json
import logging
import re
from datetime import timedelta
from io import StringIO
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import BaseChannelLayer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.management import call_command
from django.db import connections, transaction
from django.test import Client
from django.utils import timezone

from console import live
from console.consumers import WorkspaceLiveConsumer, WorkspaceMembershipMiddleware
from maintenance.models import Dispute, MaintenanceRun
from maintenance.run_start import run_maintenance
from maintenance.runs import steps
from memory import accounts, entry_changes, events, new_entries
from memory.events import Relay, publish_html
from memory.models import LiveMessage

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_relay_task(monkeypatch):
    # The relay is driven step by step here; one test below lets it run by itself.
    monkeypatch.setattr(events, "RELAY_AUTOSTART", False)


def _communicator(user, slug):
    app = WorkspaceMembershipMiddleware(WorkspaceLiveConsumer.as_asgi())
    communicator = WebsocketCommunicator(app, f"/ws/workspaces/{slug}/")
    communicator.scope["user"] = user
    communicator.scope["url_route"] = {"args": (), "kwargs": {"slug": slug}}
    return communicator


@pytest.fixture
def member(workspace):
    user = get_user_model().objects.create_user("vera", password="x-very-long-password")
    accounts.membership_set(workspace=workspace, user=user, role="viewer")
    return user


def test_a_member_receives_what_is_published_for_the_workspace(workspace, member):
    fragment = '<div id="runs" hx-swap-oob="true">run 7</div>'

    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        connected, _ = await communicator.connect()
        assert connected
        await sync_to_async(publish_html)(workspace.pk, fragment)
        received = await communicator.receive_from(timeout=2)
        await communicator.disconnect()
        return received

    assert scenario() == fragment


def test_a_member_of_another_workspace_is_refused(workspace, other_workspace, member):
    @async_to_sync
    async def scenario():
        return await _communicator(member, other_workspace.slug).connect()

    assert scenario() == (False, 4403)


def test_updates_of_another_workspace_never_arrive(workspace, other_workspace, member):
    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        await communicator.connect()
        await sync_to_async(publish_html)(other_workspace.pk, "<p>secret</p>")
        nothing = await communicator.receive_nothing(timeout=0.3)
        await communicator.disconnect()
        return nothing

    assert scenario() is True


def test_anonymous_visitors_are_refused(workspace):
    @async_to_sync
    async def scenario():
        return await _communicator(AnonymousUser(), workspace.slug).connect()

    assert scenario() == (False, 4403)


# --- runs and the queue, announced after commit ------------------------------------------------


def _while_a_page_is_open(user, slug, action):
    """``action()`` run while ``user`` has the workspace's page open: (its result, the first
    message the page received)."""

    @async_to_sync
    async def scenario():
        communicator = _communicator(user, slug)
        await communicator.connect()
        result = await sync_to_async(action)()
        received = await communicator.receive_from(timeout=2)
        await communicator.disconnect()
        return result, received

    return scenario()


def _entry(workspace, content, **fields):
    return new_entries.entry_create(workspace=workspace, content=content, **fields)


def test_a_run_announces_its_start_and_its_end_with_the_live_runs_fragment(workspace, member):
    _entry(workspace, "The deploy script needs the staging key before it runs")

    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        await communicator.connect()
        result = await sync_to_async(run_maintenance)(workspace=workspace, dry_run=True, trigger="ui")
        started = await communicator.receive_from(timeout=2)
        finished = await communicator.receive_from(timeout=2)
        await communicator.disconnect()
        return result, started, finished

    result, started, finished = scenario()
    run_id = result["run_id"]
    for html in (started, finished):
        assert html.lstrip().startswith('<section id="live-runs"')
        assert f'href="/console/{workspace.slug}/runs/{run_id}/"' in html
    assert f'data-run-id="{run_id}" data-status="running"' in started
    assert f'data-run-id="{run_id}" data-status="succeeded"' in finished
    assert "dry run" in finished and "scored 1" in finished
    # A dry run changes no review work: no queue fragment.
    assert 'id="live-queue"' not in finished


def test_an_applied_run_also_sends_the_review_counts(workspace, member):
    old = timezone.now() - timedelta(days=400)
    for i in range(3):
        _entry(workspace, f"An old unimportant note number {i} about the lunch menu", created_at=old)

    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        await communicator.connect()
        await sync_to_async(run_maintenance)(workspace=workspace)
        messages = await _until_ended(communicator)
        await communicator.disconnect()
        return messages

    messages = scenario()
    finished = messages[-1]
    assert '<span id="live-queue"' in finished
    counts = live.queue_counts(workspace)
    assert f'data-automatic="{counts["automatic"]}"' in finished
    assert f'data-tombstones="{counts["tombstones"]}"' in finished
    # The dashboard's entries by status, as the dashboard itself renders them.
    assert '<section id="status-counts" class="panel" hx-swap-oob="true">' in finished
    statuses = dict(live.status_context(workspace)["counts"])
    assert statuses["active"] + statuses["archived"] + statuses["tombstoned"] == 3
    for status, n in statuses.items():
        assert re.search(rf'status-{status}">.*?<span class="stat-n">{n}</span>', finished, re.S)


def test_a_finished_run_sends_the_next_scheduled_runs_it_moved(workspace, member):
    """The dashboard's "Next scheduled run" follows the runs: after a full run the next sweep
    is an interval after it started, not the time shown before it."""

    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        await communicator.connect()
        await sync_to_async(run_maintenance)(workspace=workspace, kind="full")
        messages = await _until_ended(communicator)
        await communicator.disconnect()
        return messages

    finished = scenario()[-1]
    assert '<div id="next-run" hx-swap-oob="true">' in finished
    run = MaintenanceRun.objects.get()
    sweep = timezone.localtime(run.started_at + timedelta(seconds=600)).strftime("%Y-%m-%d %H:%M")
    full = timezone.localtime(run.finished_at + timedelta(hours=24)).strftime("%Y-%m-%d %H:%M")
    assert sweep in finished and full in finished


async def _until_ended(communicator: Any, limit: int = 100) -> list[str]:
    """The messages up to the one that says the run ended (its progress fragment)."""
    messages: list[str] = []
    while len(messages) < limit:
        messages.append(await communicator.receive_from(timeout=2))
        if 'data-ended="1"' in messages[-1]:
            return messages
    raise AssertionError(f"no end of the run in {limit} messages")


def test_a_run_pushes_its_progress_once_per_pass_to_its_page(workspace, member):
    old = timezone.now() - timedelta(days=400)
    _entry(workspace, "An old unimportant note about the lunch menu", created_at=old)

    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        await communicator.connect()
        result = await sync_to_async(run_maintenance)(workspace=workspace, kind="decay")
        messages = await _until_ended(communicator)
        await communicator.disconnect()
        return result, messages

    result, messages = scenario()
    run_id = result["run_id"]
    fragment = f'<div id="run-progress-{run_id}"'
    assert fragment in messages[0] and 'data-status="running"' in messages[0]  # started
    passes = [m for m in messages[1:-1] if fragment in m]
    keys = [key for key, _ in steps("decay")]
    # The apply phase's passes, in order (the plan's happen inside its transaction: not pushed).
    applying = [re.search(r'<span title="(\w+)">', m).group(1) for m in passes if "applying" in m]
    assert applying == keys
    assert "rows done so far" in passes[-1]
    assert fragment in messages[-1] and 'data-status="succeeded"' in messages[-1]


def test_the_live_runs_fragment_lists_the_last_ten_runs_in_one_query(workspace, django_assert_num_queries):
    for _ in range(12):
        MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="cli", counts={"scored": 2})
    with django_assert_num_queries(1):
        html = live.render_runs(workspace.pk)
    assert html.count("data-run-id=") == live.RUNS_SHOWN
    newest = MaintenanceRun.objects.order_by("-pk").first()
    assert html.index(f'data-run-id="{newest.pk}"') < html.index(f'data-run-id="{newest.pk - 1}"')
    assert "scored 2" in html


def test_the_runs_fragment_of_a_workspace_without_runs_says_so(workspace):
    assert "No run yet." in live.render_runs(workspace.pk)


def test_the_queue_counts_open_disputes_tombstones_and_recent_automatic_changes(workspace, other_workspace):
    a = _entry(workspace, "Always use tabs for indentation", entry_type="rule")
    b = _entry(workspace, "Never use tabs for indentation", entry_type="rule")
    Dispute.objects.create(workspace=workspace, entry_a_id=a.pk, entry_b_id=b.pk, detected_by="sweep")
    gone = _entry(workspace, "A scratch note nobody needs")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk, actor="user:vera")
    _entry(other_workspace, "Another workspace's note")

    nothing = dict.fromkeys(live.QUEUE_KEYS, 0)
    assert live.queue_counts(workspace) == {**nothing, "disputes": 1, "tombstones": 1}
    assert live.queue_counts(other_workspace) == nothing
    html = live.render_queue(workspace.pk)
    assert html.lstrip().startswith('<span id="live-queue"')
    assert "1 dispute" in html and "1 tombstone" in html and "0 automatic changes" in html
    assert f"/console/{workspace.slug}/review/?tab=disputes" in html


def test_a_rolled_back_transaction_announces_nothing(workspace, member):
    class Undo(Exception):
        pass

    def write_and_roll_back():
        try:
            with transaction.atomic():
                live.announce_runs(workspace.pk)
                live.announce_queue(workspace.pk)
                publish_html(workspace.pk, "<p>never</p>")
                raise Undo
        except Undo:
            pass

    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        await communicator.connect()
        await sync_to_async(write_and_roll_back)()
        nothing = await communicator.receive_nothing(timeout=0.3)
        await communicator.disconnect()
        return nothing

    assert scenario() is True
    assert not LiveMessage.objects.exists()


def test_an_announcement_waits_for_the_commit(workspace, member):
    def write():
        with transaction.atomic():
            live.announce_runs(workspace.pk)
            assert not LiveMessage.objects.exists()
        assert LiveMessage.objects.count() == 1

    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        await communicator.connect()
        await sync_to_async(write)()
        received = await communicator.receive_from(timeout=2)
        await communicator.disconnect()
        return received

    assert 'id="live-runs"' in scenario()


class BrokenLayer(BaseChannelLayer):
    async def group_send(self, group, message):
        raise ConnectionError("the channel layer is down")

    async def group_add(self, group, channel):
        raise ConnectionError("the channel layer is down")


def test_a_broken_channel_layer_never_breaks_a_run(workspace, settings, caplog):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.test_live.BrokenLayer"}}
    _entry(workspace, "A note that is scored by the run")
    with caplog.at_level(logging.WARNING, logger="memory.events"):
        result = run_maintenance(workspace=workspace)
    assert result["status"] == "succeeded"
    assert "not sent" in caplog.text
    # Not the in-memory layer: the layer is shared, so nothing goes to the outbox.
    assert not LiveMessage.objects.exists()


def test_a_fragment_that_fails_to_render_is_logged_and_dropped(workspace, monkeypatch, caplog):
    def broken(workspace_id):
        raise RuntimeError("template exploded")

    monkeypatch.setattr(live, "render_runs", broken)
    with caplog.at_level(logging.ERROR, logger="console.live"):
        live.announce_runs(workspace.pk)  # autocommit: runs now, must not raise
    assert "not rendered" in caplog.text
    assert not LiveMessage.objects.exists()


class RecordingLayer(BaseChannelLayer):
    sent: list = []

    async def group_send(self, group, message):
        RecordingLayer.sent.append((group, message["html"]))


def test_with_a_shared_layer_the_fragment_goes_straight_to_the_layer(workspace, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.test_live.RecordingLayer"}}
    RecordingLayer.sent = []
    live.announce_runs(workspace.pk)
    assert [group for group, _ in RecordingLayer.sent] == [f"workspace.{workspace.pk}"]
    assert not LiveMessage.objects.exists()


# --- the outbox relay (embedded mode: another process wrote the message) --------------------------


def _foreign(workspace, html, **fields):
    """An outbox row as another process (a django-q2 worker) writes it."""
    return LiveMessage.objects.create(
        workspace_id=workspace.pk, html=html, origin="worker:4242:abcd", **fields
    )


def test_the_relay_forwards_what_another_process_wrote(workspace, other_workspace, member):
    fragment = '<section id="live-runs">from the worker</section>'
    _foreign(workspace, "<p>written before the relay started: pages show it already</p>")

    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        await communicator.connect()
        relay = Relay(events.get_channel_layer())
        await relay.start()
        await sync_to_async(_foreign)(workspace, fragment)
        await sync_to_async(_foreign)(other_workspace, "<p>not for this workspace</p>")
        forwarded = await relay.step()
        received = await communicator.receive_from(timeout=2)
        nothing_more = await communicator.receive_nothing(timeout=0.2)
        again = await relay.step()  # each row once
        await communicator.disconnect()
        return forwarded, received, nothing_more, again

    forwarded, received, nothing_more, again = scenario()
    assert received == fragment
    assert forwarded == 2  # one per workspace: the other one goes to its own group
    assert nothing_more is True
    assert again == 0


def test_the_relay_skips_what_its_own_process_sent_directly(workspace, member):
    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        await communicator.connect()
        relay = Relay(events.get_channel_layer())
        await relay.start()
        await sync_to_async(publish_html)(workspace.pk, "<p>once</p>")
        direct = await communicator.receive_from(timeout=2)
        forwarded = await relay.step()
        nothing = await communicator.receive_nothing(timeout=0.2)
        await communicator.disconnect()
        return direct, forwarded, nothing

    direct, forwarded, nothing = scenario()
    assert direct == "<p>once</p>"
    assert forwarded == 0
    assert nothing is True
    assert LiveMessage.objects.count() == 1  # written for the other processes


def test_a_row_committed_after_a_newer_one_is_still_forwarded(workspace):
    # On PostgreSQL a smaller id can commit after a larger one: the relay looks back a little.
    @async_to_sync
    async def scenario():
        relay = Relay(events.get_channel_layer())
        await relay.start()
        await sync_to_async(_foreign)(workspace, "<p>late</p>")
        newer = await sync_to_async(_foreign)(workspace, "<p>newer</p>")
        relay.cursor = newer.pk  # as if the newer row had been read first
        relay.seen[newer.pk] = 0.0
        return await relay.step()

    assert scenario() == 1


def test_old_outbox_rows_are_deleted(workspace):
    now = timezone.now()
    old = _foreign(workspace, "<p>old</p>")
    LiveMessage.objects.filter(pk=old.pk).update(created_at=now - events.RETENTION - timedelta(seconds=1))
    fresh = _foreign(workspace, "<p>fresh</p>")

    assert events.clean_outbox() == 1
    assert list(LiveMessage.objects.values_list("pk", flat=True)) == [fresh.pk]

    # The relay cleans too, once a minute.
    LiveMessage.objects.filter(pk=fresh.pk).update(created_at=now - timedelta(hours=1))

    @async_to_sync
    async def scenario():
        relay = Relay(events.get_channel_layer())
        await relay.start()
        relay.last_clean = 0.0
        await relay.step()

    scenario()
    assert not LiveMessage.objects.exists()


def _spy_on_fetch(monkeypatch) -> list[Any]:
    """The database wrapper each relay read used (on the relay's thread), in order."""
    used: list[Any] = []
    real = events._fetch

    def fetch(*args: Any) -> Any:
        rows = real(*args)
        used.append(connections["default"])
        return rows

    monkeypatch.setattr(events, "_fetch", fetch)
    return used


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql",
    reason="SQLite's test database is in memory: Django ignores a close of its connections",
)
def test_a_stopped_relay_hands_back_its_connection_even_while_channels_clean_up_is_off(
    workspace, monkeypatch
):
    # Channels' test communicator replaces channels' clean-up after a database call with a
    # no-op, for the whole process, while it sends or receives; a relay read that ran then
    # kept its connection, which stayed open until a garbage collection (a session left on
    # the test database at the end of the run).
    used = _spy_on_fetch(monkeypatch)

    @async_to_sync
    async def scenario():
        relay = Relay(events.get_channel_layer())
        await relay.start()
        with mock.patch("channels.db.close_old_connections", lambda: None):
            await relay.step()
        kept_open = used[-1].connection is not None
        await asyncio.wrap_future(relay.close())
        return kept_open

    assert scenario() is True  # the read's connection outlived it, as under the communicator
    assert used[-1].connection is None


def test_the_first_websocket_starts_the_relay_task_which_delivers_by_itself(workspace, member, monkeypatch):
    monkeypatch.setattr(events, "RELAY_AUTOSTART", True)
    monkeypatch.setattr(events, "RELAY_INTERVAL", 0.05)
    fragment = '<section id="live-runs">run 12 from the worker</section>'
    used = _spy_on_fetch(monkeypatch)

    @async_to_sync
    async def scenario():
        communicator = _communicator(member, workspace.slug)
        await communicator.connect()
        for _ in range(100):  # the relay reads its starting point first
            if events._relay is not None and events._relay.cursor is not None:
                break
            await asyncio.sleep(0.02)
        await sync_to_async(_foreign)(workspace, fragment)
        received = await communicator.receive_from(timeout=3)
        await communicator.disconnect()
        return received

    assert scenario() == fragment
    # The scenario's end cancelled the relay task, which handed back its thread's connection
    # (polls also ran while the communicator received, with channels' clean-up off).
    events._relay.thread.shutdown(wait=True)
    assert used
    if used[-1].vendor == "postgresql":  # SQLite's test database is in memory: never closed
        assert used[-1].connection is None


def test_the_context_processor_gives_the_queue_counts_of_the_page_only_when_used(
    workspace, rf, django_assert_num_queries
):
    from django.template import Context, Template

    from console.access import Console

    request = rf.get("/")
    assert live.context(request) == {}  # not a workspace page
    request.console = Console(workspace=workspace, role="viewer", actor="user:vera")
    with django_assert_num_queries(0):
        extra = live.context(request)
    template = Template('{% include "console/partials/live_queue.html" with queue=live_queue workspace=ws %}')
    with django_assert_num_queries(1):
        html = template.render(Context({**extra, "ws": workspace}))
    assert '<span id="live-queue"' in html and 'data-disputes="0"' in html


def test_announcements_inside_coalesced_go_out_once_per_workspace_at_the_end(
    workspace, other_workspace, monkeypatch
):
    sent: list[tuple[int, str]] = []
    monkeypatch.setattr(live, "deliver", lambda workspace_id, html: sent.append((workspace_id, html)))

    with live.coalesced():
        for _ in range(3):
            with transaction.atomic():
                live.announce_queue(workspace.pk)
        with live.coalesced():  # nested: announced by the outer block
            live.announce_runs(workspace.pk)
            live.announce_queue(other_workspace.pk)
        assert sent == []

    assert sorted(ws for ws, _ in sent) == sorted([workspace.pk, other_workspace.pk])
    mine = next(html for ws, html in sent if ws == workspace.pk)
    assert mine.count('id="live-queue"') == 1 and 'id="live-runs"' in mine
    live.announce_queue(workspace.pk)  # outside: at once (after its autocommit)
    assert len(sent) == 3


# --- every door updates open pages: the JSON API, a management command --------------------------


def test_a_hygiene_apply_through_the_api_updates_the_open_pages_review_counts(workspace, member):
    junk = _entry(workspace, "wip...", created_at=timezone.now() - timedelta(days=40))
    a = _entry(workspace, "Always use tabs for indentation", entry_type="rule")
    b = _entry(workspace, "Never use tabs for indentation", entry_type="rule")
    Dispute.objects.create(workspace=workspace, entry_a_id=a.pk, entry_b_id=b.pk, detected_by="sweep")
    gone = _entry(workspace, "A scratch note nobody needs")
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk, actor="user:vera")
    secret = accounts.api_key_create(workspace=workspace, name="operator key", role="operator")[1]
    last = LiveMessage.objects.order_by("-pk").values_list("pk", flat=True).first() or 0

    def apply() -> Any:
        return Client().post(
            "/api/v1/hygiene/apply",
            data=json.dumps({"ids": [junk.pk]}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {secret}",
        )

    response, received = _while_a_page_is_open(member, workspace.slug, apply)
    assert response.status_code == 200, response.content
    assert response.json()["archived"] == [junk.pk]
    # The page's header and review tabs get the counts as they are after the archive.
    assert received.lstrip().startswith('<span id="live-queue"')
    assert received == live.render_queue(workspace.pk)
    assert 'data-disputes="1"' in received and 'data-tombstones="1"' in received
    assert '<span class="count" id="review-count-disputes">1</span>' in received
    # And the outbox row that other web processes forward to the pages they serve.
    told = LiveMessage.objects.filter(workspace_id=workspace.pk, pk__gt=last).values_list("html", flat=True)
    assert list(told) == [received]


def test_revert_run_from_the_command_line_updates_the_open_pages_review_counts(workspace, member):
    old = timezone.now() - timedelta(days=400)
    for i in range(3):
        _entry(workspace, f"An old unimportant note number {i} about the lunch menu", created_at=old)
    run_id = run_maintenance(workspace=workspace)["run_id"]
    before = live.queue_counts(workspace)
    assert before["automatic"] == 3 and before["tombstones"] == 3
    last = LiveMessage.objects.order_by("-pk").values_list("pk", flat=True).first() or 0

    def revert() -> str:
        out = StringIO()
        call_command("revert_run", str(run_id), "--workspace", workspace.slug, stdout=out, stderr=StringIO())
        return out.getvalue()

    said, received = _while_a_page_is_open(member, workspace.slug, revert)
    assert f"run {run_id}: reverted 3 entries" in said
    assert received.lstrip().startswith('<span id="live-queue"')
    assert 'data-automatic="0"' in received and 'data-tombstones="0"' in received
    assert '<span class="count" id="review-count-automatic">0</span>' in received
    assert '<span class="count" id="review-count-tombstones">0</span>' in received
    # A command runs in a process of its own: the outbox row is what reaches the web processes.
    told = LiveMessage.objects.filter(workspace_id=workspace.pk, pk__gt=last).values_list("html", flat=True)
    assert list(told) == [received]
