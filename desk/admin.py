"""The admin's autodiscovery imports this module: it registers every ModelAdmin of the desk."""

from desk import agents, approvals, endpoints, freezes, notifications, operations, runs, sessions, tool_calls  # noqa: F401
