from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from config.api import api
from sessions_app.console.views import console_favicon

urlpatterns = [
    # A visitor at the root wants the console (operators find the desk from its header).
    path("", RedirectView.as_view(pattern_name="console:home", permanent=False)),
    path("favicon.ico", console_favicon, name="favicon"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("console/", include("sessions_app.console.urls")),
    # The simulated order/payment service of the demo world (tools reach it over real HTTP).
    path("sim/", include("tools_app.demo.urls")),
]
