from django.contrib import admin
from django.urls import include, path

from config import operations
from config.api import api

urlpatterns = [
    # Load balancers, orchestrators and Prometheus (docs/OPERATIONS.md).
    path("healthz", operations.healthz, name="healthz"),
    path("readyz", operations.readyz, name="readyz"),
    path("metrics", operations.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("console/", include("sessions_app.console.urls")),
    # The simulated order/payment service of the demo world (tools reach it over real HTTP).
    path("sim/", include("tools_app.demo.urls")),
]
