from django.contrib import admin
from django.urls import include, path

from config.api import api

# The demo's simulated payment service is not here in any mode: it has a server of its own
# (tools_app/demo/asgi.py), as the external system it stands for would.
urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("console/", include("sessions_app.console.urls")),
]
