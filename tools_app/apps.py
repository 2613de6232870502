from importlib import import_module

from django.apps import AppConfig
from django.conf import settings


class ToolsAppConfig(AppConfig):
    name = "tools_app"
    verbose_name = "Tools"

    def ready(self) -> None:
        # Tools register themselves when their module is imported (tools_app.registry.tool_register).
        for module in settings.WARDEN_TOOL_MODULES:
            import_module(module)
