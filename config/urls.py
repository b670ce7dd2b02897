from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path

from config.api import api


def favicon(request: HttpRequest) -> HttpResponse:
    """Pages without the console's icon link (the admin, the API docs) still ask for
    /favicon.ico: the console's icon answers it."""
    return HttpResponseRedirect(static("favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("", include("console.urls")),
]
