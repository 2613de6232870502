"""The refusals of approval decisions (config/errors.py)."""

from config.errors import Refusal


class ApprovalRefusal(Refusal):
    NOT_PERMITTED = "not_permitted", 403
    ALREADY_DECIDED = "already_decided", 409
    EXPIRED = "expired", 409
    INVALID_DECISION = "approval_error", 422  # not approve/reject, or a message for the customer too long
    # An edit of a pending write the run-time refuses: arguments the tool's schema refuses, no
    # reason, nothing changed, over a limit that refuses, a business key another request holds.
    INVALID_EDIT = "invalid_edit", 422
    TOOL_CHANGE_REFUSED = "tool_change_refused", 422  # an edit may change the arguments, never the tool
    FREEZE_EXISTS = "freeze_exists", 409
    FREEZE_LIFTED = "freeze_lifted", 409
    INVALID_FREEZE = "invalid_freeze", 422
