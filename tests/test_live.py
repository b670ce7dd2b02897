"""The workspace live-update consumer: members only, and what a publisher sends arrives."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser

from memory import services
from memory.consumers import WorkspaceLiveConsumer, WorkspaceMembershipMiddleware
from memory.events import publish_html

pytestmark = pytest.mark.django_db(transaction=True)


def _communicator(user, slug):
    app = WorkspaceMembershipMiddleware(WorkspaceLiveConsumer.as_asgi())
    communicator = WebsocketCommunicator(app, f"/ws/workspaces/{slug}/")
    communicator.scope["user"] = user
    communicator.scope["url_route"] = {"args": (), "kwargs": {"slug": slug}}
    return communicator


@pytest.fixture
def member(workspace):
    user = get_user_model().objects.create_user("vera", password="x-very-long-password")
    services.membership_set(workspace=workspace, user=user, role="viewer")
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
