"""The refusals of approval decisions (config/errors.py)."""

from config.errors import Refusal


class ApprovalRefusal(Refusal):
    NOT_PERMITTED = "not_permitted", 403
    ALREADY_DECIDED = "already_decided", 409
    EXPIRED = "expired", 409
    INVALID_DECISION = "approval_error", 422  # not approve/reject, or a message for the customer too long
    # An edit of a pending write the run-time refuses: arguments this call's tool refuses, nothing
    # changed, over a limit that refuses, a business key another request holds. A conflict with the
    # call as it stands (409), not a malformed request: the same body fits another call (issue 27,
    # finding 11; the API's schema says what any call accepts).
    INVALID_EDIT = "invalid_edit", 409
    TOOL_CHANGE_REFUSED = "tool_change_refused", 409  # an edit may change the arguments, never the tool
    # A notification's decision link that may not carry this decision: used, expired, sent to someone
    # else, or for the call as it was before an edit (approvals_app.links).
    LINK_UNUSABLE = "link_unusable", 409
    FREEZE_EXISTS = "freeze_exists", 409
    FREEZE_LIFTED = "freeze_lifted", 409
    INVALID_FREEZE = "invalid_freeze", 422
    # An out-of-office delegation the run-time refuses to set (engine.actions.delegations): to nobody
    # known, to oneself or an inactive account, ending before it starts, in the past or after too
    # long, for a delegator who may not decide. A conflict with the people and the clock as they
    # stand (409), as INVALID_EDIT: the API's schema says what any delegation accepts. Then one
    # overlapping another of the same delegator, and one revoked or ended already.
    INVALID_DELEGATION = "invalid_delegation", 409
    DELEGATION_OVERLAPS = "delegation_overlaps", 409
    DELEGATION_ENDED = "delegation_ended", 409
