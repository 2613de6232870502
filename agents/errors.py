"""The refusals of agents and their definitions (config/errors.py)."""

from config.errors import Refusal


class AgentRefusal(Refusal):
    NOT_PERMITTED = "not_permitted", 403
    INVALID_AGENT = "invalid_agent", 422  # a definition refused field by field; nothing saved
    UNKNOWN_AGENT = "unknown_agent", 404  # the agent named does not exist (or is not the caller's to see)
