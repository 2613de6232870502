from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Agents"

    def ready(self) -> None:
        # An agent version's MCP tools are found by name where no run puts them in scope.
        from agents.selectors import mcp_tool_latest  # models are ready only now
        from tools_app.registry import tool_resolver_add  # beside the line above, where it is used

        tool_resolver_add(mcp_tool_latest)
