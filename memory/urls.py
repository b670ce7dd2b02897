from django.urls import path
from django.views.generic import RedirectView

from memory import views

app_name = "console"

urlpatterns = [
    path("", RedirectView.as_view(url="/console/", permanent=False)),
    path("console/", views.console_home, name="home"),
]
