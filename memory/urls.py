from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from memory import views

app_name = "console"

urlpatterns = [
    path("", RedirectView.as_view(url="/console/", permanent=False)),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("console/", views.console_home, name="home"),
    # The review queue and the runs (maintenance/urls.py) share the console namespace.
    path("console/<slug:slug>/", include("maintenance.urls")),
]
