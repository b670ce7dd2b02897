"""Websocket routes. The live-update consumers of the console join here (operator console
issue); the ASGI router already serves the websocket protocol."""

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
