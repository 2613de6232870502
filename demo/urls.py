"""The simulated order/payment service's URLconf — the root URLconf of its own server
(demo/asgi.py), never part of the main application's (server/urls.py): it stands for
an external payment system, so it listens on a port of its own (demo mode only)."""

from django.urls import include, path

from demo import views

service = [
    # What `serve_all`'s banner links to: the service's own description, so the link answers.
    path("", views.service_index_view, name="index"),
    path("orders/<str:order_id>", views.order_detail_view, name="order-detail"),
    path("users/<str:user_id>/level", views.user_level_view, name="user-level"),
    path("weather", views.weather_view, name="weather"),
    path("refunds", views.refunds_view, name="refunds"),
    path("refunds/count", views.refund_count_view, name="refund-count"),
    path("faults", views.faults_view, name="faults"),
    # Demo mode only: where the demo's webhook endpoint delivers, and a page listing what came.
    path("webhooks/", views.webhook_receiver_view, name="webhooks"),
]

urlpatterns = [path("sim/", include((service, "sim")))]
