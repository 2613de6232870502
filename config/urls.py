from django.contrib import admin
from django.urls import include, path

from config.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("console/", include("sessions_app.console.urls")),
    # The simulated order/payment service of the demo world (tools reach it over real HTTP).
    path("sim/", include("tools_app.demo.urls")),
]
