"""The refusals of tool calls: reconciling them (config/errors.py)."""

from config.errors import Refusal


class ToolCallRefusal(Refusal):
    NOT_PERMITTED = "not_permitted", 403
    NOT_UNKNOWN = "not_unknown", 409  # its outcome is known already: nothing to reconcile
    EVIDENCE_REQUIRED = "evidence_required", 422
