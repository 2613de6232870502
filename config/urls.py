from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from config import operations
from config.api import api
from sessions_app.console.views import console_favicon

# The demo's simulated payment service is not here in any mode: it has a server of its own
# (tools_app/demo/asgi.py), as the external system it stands for would.
urlpatterns = [
    # Load balancers, orchestrators and Prometheus (docs/OPERATIONS.md).
    path("healthz", operations.healthz, name="healthz"),
    path("readyz", operations.readyz, name="readyz"),
    path("metrics", operations.metrics, name="metrics"),
    # A visitor at the root wants the console (operators find the desk from its header).
    path("", RedirectView.as_view(pattern_name="console:home", permanent=False)),
    path("favicon.ico", console_favicon, name="favicon"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("console/", include("sessions_app.console.urls")),
]
