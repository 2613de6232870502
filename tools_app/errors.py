"""The refusals of tool calls: reconciling them (config/errors.py)."""

from config.errors import Refusal


class ToolCallRefusal(Refusal):
    NOT_PERMITTED = "not_permitted", 403
    NOT_UNKNOWN = "not_unknown", 409  # its outcome is known already: nothing to reconcile
    EVIDENCE_REQUIRED = "evidence_required", 422


class McpServerRefusal(Refusal):
    NOT_PERMITTED = "not_permitted", 403
    INVALID_MCP_SERVER = "invalid_mcp_server", 422  # refused field by field; nothing saved
    MCP_SERVER_NAME_TAKEN = "mcp_server_name_taken", 409
