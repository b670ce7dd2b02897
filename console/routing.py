from django.urls import path, re_path

from console.consumers import NotFoundConsumer, WorkspaceLiveConsumer, WorkspaceMembershipMiddleware

websocket_urlpatterns = [
    path("ws/workspaces/<slug:slug>/", WorkspaceMembershipMiddleware(WorkspaceLiveConsumer.as_asgi())),
    re_path(r"", NotFoundConsumer.as_asgi()),
]
