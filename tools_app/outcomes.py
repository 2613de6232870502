"""What a tool call's outcome means, in plain words, for the customer — who reads it in the
console — and for the model, which is told it in the call's tool message and talks to the
customer. Only these texts leave the desk: an operator's note on a decision and the evidence of
a reconciliation stay on the desk and in the audit trail (SPEC §7, §13).

A tool may add texts for the error codes its downstream system answers with
(`Tool.extra["customer_texts"]`, code → sentence); the run-time's own codes are here."""

from tools_app.models import ToolCallStatus, ToolEffect
from tools_app.registry import tool_get

# The run-time's own reasons for a call that did not run or did not take effect.
ENGINE_TEXTS = {
    "approval_rejected": "It was declined.",
    "approval_expired": "Nobody approved it in time.",
    "approval_withdrawn": "The request was withdrawn before anyone decided.",
    "run_cancelled": "The request was cancelled before this step.",
    "run_failed": "The request stopped before this step.",
    "not_applied": "The other side confirmed it did not go through.",
    "interrupted": "We are checking whether this went through; it will not be done twice.",
    "outcome_unknown": "We are checking whether this went through; it will not be done twice.",
    # The agent's guards on money (SPEC §18): nothing was done.
    "approval_mismatch": "It changed after it was approved, so it was not done.",
    "frozen": "Payments are paused right now; this was not done.",
    "write_cap_turn": "Only one such action can be done at a time; this one was not done — ask for it again on its own.",
    "write_cap_run": "This conversation has made as many such actions as it may; this one was not done.",
    "limit_refused": "This would go over a limit on such actions; it was not done.",
    # Asked before under the same business key, by this or another conversation (SPEC §18).
    "already_requested": "The same request is already being handled; it was not sent again.",
    "already_in_doubt": "The same request was made earlier and we are checking whether it went through; "
                        "it will not be done twice.",
}
# A write answered by an earlier call with the same business key that succeeded: the call's
# error code says so (its status is `succeeded`, nothing was sent).
ALREADY_DONE = "already_done"
ALREADY_DONE_TEXT = "This was already done earlier, under the same reference; it was not done again."
REJECTED_BY_OPERATOR = "An operator declined it."
REJECTED_BY_CUSTOMER = "You declined it."
DEFAULT_FAILURE = "This did not work."
STATUS_TEXTS = {
    ToolCallStatus.RUNNING: "In progress…",
    ToolCallStatus.UNKNOWN: ENGINE_TEXTS["outcome_unknown"],
    ToolCallStatus.SUCCEEDED: "Done.",
}
WAITING_FOR_APPROVAL = "Waiting for approval; nothing has been done yet."
ABOUT_TO_RUN = "About to run."
# A customer's own words that the model passes on are bounded like a decision note.
CUSTOMER_MESSAGE_CHARS = 300


def code_text(*, tool_name: str, error_code: str) -> str:
    """The sentence for an error code: the tool's own texts first, then the run-time's."""
    tool = tool_get(tool_name)
    own = (tool.extra.get("customer_texts") or {}) if tool is not None else {}
    if error_code.startswith("duplicate_of_"):
        error_code = error_code.removeprefix("duplicate_of_")
    return own.get(error_code) or ENGINE_TEXTS.get(error_code) or DEFAULT_FAILURE


def tool_call_customer_text(*, tool_name: str, effect: str, status: str, error_code: str = "", error_detail: str = "",
                            waiting_for_approval: bool = False) -> str:
    """One sentence saying where the call stands, for someone who knows nothing of our codes."""
    if error_code == "approval_rejected" and error_detail.startswith((REJECTED_BY_OPERATOR, REJECTED_BY_CUSTOMER)):
        return error_detail  # decision_text: who declined, and the decider's words for the customer
    if status == ToolCallStatus.PENDING:
        return WAITING_FOR_APPROVAL if waiting_for_approval or effect == ToolEffect.WRITE else ABOUT_TO_RUN
    if status == ToolCallStatus.SUCCEEDED and error_code == ALREADY_DONE:
        return ALREADY_DONE_TEXT
    if status in (ToolCallStatus.FAILED, ToolCallStatus.CANCELLED):
        return code_text(tool_name=tool_name, error_code=error_code)
    return STATUS_TEXTS.get(status, DEFAULT_FAILURE)


def decision_text(*, rejected_by_customer: bool, customer_message: str = "") -> str:
    """What the model (and so the customer) is told about a rejection: who declined, in general
    terms, and the words the decider chose to pass on — never their internal note."""
    text = REJECTED_BY_CUSTOMER if rejected_by_customer else REJECTED_BY_OPERATOR
    message = " ".join(customer_message.split())[:CUSTOMER_MESSAGE_CHARS]
    return f"{text} {message}" if message else text
