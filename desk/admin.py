"""The admin's autodiscovery imports this module: it registers every ModelAdmin of the desk."""

from desk import (  # noqa: F401
    agents, approvals, delegations, endpoints, freezes, ledger, notifications, operations, runs, sessions, tool_calls,
)
