from django.apps import AppConfig


class CliConfig(AppConfig):
    """Warden's management commands (serve_all, sweep, embedded_db, create_api_key, erase_sessions)."""

    name = "cli"
    verbose_name = "Command line"
