"""Console pages of maintenance: the review queue and the runs (under /console/<slug>/)."""

from django.urls import path  # noqa: F401

urlpatterns: list = []
