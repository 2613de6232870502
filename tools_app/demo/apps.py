from django.apps import AppConfig


class DemoWorldConfig(AppConfig):
    name = "tools_app.demo"
    label = "demo"
    verbose_name = "Demo world (simulated order and payment service)"
