from django.apps import AppConfig


class ToolsAppConfig(AppConfig):
    name = "tools_app"
    verbose_name = "Tools"

    def ready(self) -> None:
        # Tools register themselves on import; the demo world's tools are part of every deployment
        # of this demo build (a production build would list its own tool modules here).
        from tools_app.demo import tools  # noqa: F401
