"""What cancelling a run would and would not change, in the customer's words: the console asks
before it cancels (issue 29). It follows the cancel protocol (engine/actions/cancel.py): a write
already made stays made, a write on its way is waited for and never undone, an approval request
nobody decided is withdrawn, a call that never started is not made, and input added to the
request is held for its user (engine.actions.runs.run_end)."""

from dataclasses import dataclass, field

from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import Run, RunStatus
from sessions_app.selectors import pending_inputs_meant_for_the_active_run
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect
from tools_app.outcomes import ALREADY_DONE
from tools_app.registry import tool_get

# A tool name's leading verb the customer need not read: `execute_refund` → "Refund".
_VERBS = {"execute", "make", "send", "do", "create", "issue", "perform", "submit"}
WILL_NOT = "The agent stops working on this request and will not answer it."


@dataclass
class CancelPreview:
    run: Run
    done: list[str] = field(default_factory=list)  # writes made: cancelling does not undo them
    in_flight: list[str] = field(default_factory=list)  # writes on their way: waited for, never undone
    approved: list[str] = field(default_factory=list)  # approved, not started
    withdrawn: list[str] = field(default_factory=list)  # approval requests nobody decided
    held: list[str] = field(default_factory=list)  # the customer's additions the run never read
    will_not: list[str] = field(default_factory=list)

    @property
    def at_stake(self) -> bool:
        """A write was made, is on its way, approved or asked for: the confirmation says so."""
        return bool(self.done or self.in_flight or self.approved or self.withdrawn)

    @property
    def already_requested(self) -> bool:
        return self.run.cancel_requested_at is not None

    @property
    def ended(self) -> bool:
        return self.run.is_terminal


def write_text(call: ToolCall) -> str:
    """"Refund of 25.00 USD for order 9527": the write, as the customer knows it."""
    words = call.tool_name.split("_")
    if len(words) > 1 and words[0].lower() in _VERBS:
        words = words[1:]
    text = " ".join(words).strip().capitalize() or call.tool_name
    tool = tool_get(call.tool_name)
    arguments = call.arguments or {}
    money = tool.money_text(arguments) if tool is not None else None
    if money:
        text += f" of {money}"
    if tool is not None and tool.reference and arguments.get(tool.reference) not in (None, ""):
        name = tool.reference.removesuffix("_id").replace("_", " ")
        text += f" for {name} {arguments[tool.reference]}"
    return text


def _the(text: str) -> str:
    return "the " + text[:1].lower() + text[1:]


def cancel_preview(*, run: Run) -> CancelPreview:
    """What cancelling `run` now would leave done, wait for, stop and hold."""
    preview = CancelPreview(run=run)
    approvals = {a.tool_call_id: a.status for a in Approval.objects.filter(run_id=run.id)}
    writes = ToolCall.objects.filter(run_id=run.id, effect=ToolEffect.WRITE).order_by("created_at")
    for call in writes:
        what = write_text(call)
        approval = approvals.get(call.pk)
        if call.status == ToolCallStatus.SUCCEEDED:
            made = "was already made"
            if call.error_code == ALREADY_DONE:  # answered by an earlier call with the same business key
                made = "had already been made earlier, and was not made again"
            preview.done.append(f"{what} {made}. Cancelling does not undo it.")
        elif call.status == ToolCallStatus.RUNNING:
            preview.in_flight.append(f"The{_the(what)[3:]} is being sent now: cancelling waits for its outcome "
                                     "and will not undo it.")
        elif call.status == ToolCallStatus.UNKNOWN:
            preview.in_flight.append(f"We are checking whether {_the(what)} went through: cancelling waits for the "
                                     "answer and will not undo it.")
        elif call.status == ToolCallStatus.PENDING and approval == ApprovalStatus.PENDING:
            preview.withdrawn.append(f"The request to approve {_the(what)} will be withdrawn: it will not be sent.")
        elif call.status == ToolCallStatus.PENDING and run.status == RunStatus.RUNNING:
            approved = "was approved and " if approval == ApprovalStatus.APPROVED else ""
            preview.approved.append(f"{what} {approved}is about to be sent: if it is already on its way when the "
                                    "cancel reaches it, cancelling waits for its outcome and will not undo it; "
                                    "otherwise it will not be sent.")
        elif call.status == ToolCallStatus.PENDING:
            approved = "was approved but " if approval == ApprovalStatus.APPROVED else ""
            preview.approved.append(f"{what} {approved}has not been sent: cancelling stops it, and it will not be sent.")
    preview.held = [item.content for item in pending_inputs_meant_for_the_active_run(session_id=run.session_id)]
    preview.will_not.append(WILL_NOT)
    return preview
