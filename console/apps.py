from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The customers' live console: pages, the websocket consumer, view-models, static files."""

    name = "console"
    verbose_name = "Console"
