"""The refusals of approval decisions (config/errors.py)."""

from config.errors import Refusal


class ApprovalRefusal(Refusal):
    NOT_PERMITTED = "not_permitted", 403
    ALREADY_DECIDED = "already_decided", 409
    EXPIRED = "expired", 409
    INVALID_DECISION = "approval_error", 422  # not approve/reject, or a message for the customer too long
    FREEZE_EXISTS = "freeze_exists", 409
    FREEZE_LIFTED = "freeze_lifted", 409
    INVALID_FREEZE = "invalid_freeze", 422
