from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The simulated order/payment service of the demo world (tools reach it over real HTTP).
    path("sim/", include("tools_app.demo.urls")),
]
