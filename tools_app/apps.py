from importlib import import_module

from django.apps import AppConfig
from django.conf import settings

from config.errors import StartupRefused


class ToolsAppConfig(AppConfig):
    name = "tools_app"
    verbose_name = "Tools"

    def ready(self) -> None:
        # Tools register themselves when their module is imported (tools_app.registry.tool_register).
        for module in settings.WARDEN_TOOL_MODULES:
            try:
                import_module(module)
            except ImportError as exc:
                raise StartupRefused(f"WARDEN_TOOL_MODULES names {module!r}, which cannot be imported: {exc} "
                                     "(is its package installed, or on PYTHONPATH?)") from exc
            except Exception as exc:
                raise StartupRefused(f"WARDEN_TOOL_MODULES names {module!r}, whose import failed: "
                                     f"{type(exc).__name__}: {exc} (python -c 'import {module}' shows where)") from exc
