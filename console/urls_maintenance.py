"""Console pages of maintenance: the review queue and the runs (under /console/<slug>/, in the
``console`` namespace of console/urls.py)."""

from django.urls import path

from console import views_maintenance as views
from console import views_settings

urlpatterns = [
    path("review/", views.review, name="review"),
    path("review/approve/", views.approve_proposals, name="approve_proposals"),
    path("review/reject/", views.reject_proposals, name="reject_proposals"),
    path("review/release/", views.release_holds, name="release_holds"),
    path("review/hygiene/", views.hygiene_action, name="hygiene_action"),
    path("review/revert/", views.revert_entries, name="revert_entries"),
    path("review/restore/", views.restore_tombstones, name="restore_tombstones"),
    path("disputes/<int:dispute_id>/resolve/", views.resolve_dispute, name="resolve_dispute"),
    path("runs/", views.runs, name="runs"),
    path("runs/<int:run_id>/", views.run, name="run"),
    path("runs/<int:run_id>/revert/", views.revert_run, name="revert_run"),
    path("settings/", views_settings.settings_page, name="settings"),
    path("settings/policy/", views_settings.settings_policy, name="settings_policy"),
    path("settings/keys/", views_settings.settings_keys, name="settings_keys"),
]
