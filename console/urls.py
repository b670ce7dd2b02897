from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from console import views

app_name = "console"

urlpatterns = [
    path("", RedirectView.as_view(url="/console/", permanent=False)),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("console/", views.console_home, name="home"),
    path("console/<slug:slug>/", views.dashboard, name="dashboard"),
    path("console/<slug:slug>/run/", views.run_now, name="run_now"),
    path("console/<slug:slug>/entries/", views.entries, name="entries"),
    path("console/<slug:slug>/entries/<int:entry_id>/", views.entry, name="entry"),
    path(
        "console/<slug:slug>/entries/<int:entry_id>/<str:action>/",
        views.entry_action,
        name="entry_action",
    ),
    # The review queue and the runs (console/urls_maintenance.py) share the console namespace.
    path("console/<slug:slug>/", include("console.urls_maintenance")),
]
