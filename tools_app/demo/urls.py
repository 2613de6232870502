"""The simulated order/payment service, mounted at /sim/ by config/urls.py."""

from django.urls import path

from tools_app.demo import views

app_name = "sim"

urlpatterns = [
    path("orders/<str:order_id>", views.order_detail_view, name="order-detail"),
    path("users/<str:user_id>/level", views.user_level_view, name="user-level"),
    path("weather", views.weather_view, name="weather"),
    path("refunds", views.refunds_view, name="refunds"),
    path("refunds/count", views.refund_count_view, name="refund-count"),
    path("faults", views.faults_view, name="faults"),
    # Demo mode only: where the demo's webhook endpoint delivers, and a page listing what came.
    path("webhooks/", views.webhook_receiver_view, name="webhooks"),
]
