"""The web server's URLs: every interface, wired (the top of the layers, docs/ARCHITECTURE.md)."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from api import health
from api.v1 import api
from console.views import console_favicon

# The demo's simulated payment service is not here in any mode: it has a server of its own
# (demo/asgi.py), as the external system it stands for would.
urlpatterns = [
    # Load balancers, orchestrators and Prometheus (docs/OPERATIONS.md).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    # A visitor at the root wants the console (operators find the desk from its header).
    path("", RedirectView.as_view(pattern_name="console:home", permanent=False)),
    path("favicon.ico", console_favicon, name="favicon"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("console/", include("console.urls")),
]
