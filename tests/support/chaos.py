from approvals_app.models import Approval, ApprovalStatus
from engine.actions.approvals import approval_decide
from runs_app.models import TERMINAL_STATUSES, Run, RunEvent, RunStatus, WaitReason
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from tests.support.factories import UserFactory
from tools_app.models import ToolCall, ToolCallStatus


def post(text: str, **kwargs) -> Run:
    user = UserFactory()
    session = session_open(owner=user, title="chaos")
    return message_post(session=session, content=text, acting_user=user, **kwargs).run


def approve_pending(operator) -> int:
    decided = 0
    for approval in Approval.objects.filter(status=ApprovalStatus.PENDING):
        approval_decide(approval=approval, decision="approve", note="chaos test", acting_user=operator)
        decided += 1
    return decided


def statuses(run_ids) -> list[str]:
    return list(Run.objects.filter(pk__in=run_ids).values_list("status", flat=True))


def all_terminal(run_ids) -> bool:
    return all(s in TERMINAL_STATUSES for s in statuses(run_ids))


def seqs_gap_free(run_id) -> bool:
    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    return seqs == list(range(1, len(seqs) + 1))


def refund_outcomes_are_honest(run_ids) -> list[str]:
    """At most one refund per order; exactly one where the run says it succeeded, none where
    it says it was not applied. Returns the problems found (empty when all is well)."""
    from demo.selectors import sim_refund_count

    problems = []
    for call in ToolCall.objects.filter(run_id__in=run_ids, tool_name="execute_refund", reused_from__isnull=True):
        booked = sim_refund_count(order_id=call.arguments["order_id"])
        if booked > 1:
            problems.append(f"{call.arguments['order_id']}: booked {booked} times")
        if call.status == ToolCallStatus.SUCCEEDED and booked != 1:
            problems.append(f"{call.arguments['order_id']}: succeeded but booked {booked} times")
        if call.status in (ToolCallStatus.FAILED, ToolCallStatus.CANCELLED) and booked != 0:
            problems.append(f"{call.arguments['order_id']}: {call.status} but booked {booked} times")
        if call.status in (ToolCallStatus.RUNNING, ToolCallStatus.PENDING):
            problems.append(f"{call.arguments['order_id']}: left {call.status}")
    return problems


def resting_correctly(run: Run) -> bool:
    """Terminal, or waiting for a reason that still holds."""
    if run.status in TERMINAL_STATUSES:
        return True
    if run.status != RunStatus.WAITING:
        return False
    if run.wait_reason == WaitReason.APPROVAL:
        return Approval.objects.filter(run=run, status=ApprovalStatus.PENDING).exists()
    if run.wait_reason == WaitReason.RECONCILIATION:
        return ToolCall.objects.filter(run=run, status=ToolCallStatus.UNKNOWN).exists()
    return False
