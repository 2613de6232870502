"""Cancellation: requested is not done (SPEC §9).

A request is recorded first (status unchanged) and signalled to the worker through its
heartbeat. The run becomes `cancelled` only when no write is in flight: an `unknown` write
is reconciled first. Effects already applied are listed, never rolled back silently.
"""

from django.db import transaction
from django.utils import timezone

from runs_app.models import TERMINAL_STATUSES, Run, RunStatus, Step, StepStatus, WaitReason
from runs_app.services import run_transition, run_write
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect


class RunNotCancellable(Exception):
    code = "run_terminal"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def applied_effects(*, run_id) -> list[dict]:
    """Writes of this run that took effect downstream: what a cancelled or failed run must show."""
    return [
        {"tool_call": str(c.id), "tool": c.tool_name, "arguments": c.arguments, "result": c.result,
         "idempotency_key": c.idempotency_key, "finished_at": c.finished_at.isoformat() if c.finished_at else None}
        # A call answered from an earlier identical one (reused_from) did not write again.
        for c in ToolCall.objects.filter(run_id=run_id, effect=ToolEffect.WRITE, status=ToolCallStatus.SUCCEEDED,
                                         reused_from__isnull=True).order_by("finished_at")
    ]


def writes_in_doubt(*, run_id):
    """Writes of the run that started and whose outcome is not known: `running` (possibly in a
    worker that died) or `unknown`. No run ends — cancelled or failed — while there is one
    (SPEC §9, §10): it is recovered and reconciled first."""
    return ToolCall.objects.filter(run_id=run_id, effect=ToolEffect.WRITE,
                                   status__in=[ToolCallStatus.RUNNING, ToolCallStatus.UNKNOWN])


def run_cancel_request(*, run: Run, acting_user, reason: str = "") -> Run:
    """Record a cancel request (by whom, why); cancel at once when nothing is in flight
    (queued, or waiting on anything but reconciliation). A running run is stopped by its
    worker at the next delta or safe point."""
    from approvals_app.services import audit_record
    from sessions_app.services import session_lock

    with transaction.atomic():
        session_lock(session_id=run.session_id)  # before the run's row, as message_post does
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.status in TERMINAL_STATUSES:
            raise RunNotCancellable(f"The run is already {run.status}.")
        if run.cancel_requested_at is None:
            now = timezone.now()
            run_write(
                run_id=run.id,
                changes={"cancel_requested_at": now, "cancel_requested_by_id": getattr(acting_user, "pk", None), "cancel_reason": reason[:300]},
                events=[("cancel_requested", {"by": acting_user.get_username() if acting_user else None, "reason": reason})],
            )
            run.cancel_requested_at = now
            run.cancel_requested_by = acting_user
            run.cancel_reason = reason[:300]
            if acting_user is not None:
                audit_record(actor=acting_user, action="cancel", obj=run, run_id=run.id,
                             before={"status": run.status}, after={"cancel_requested": True}, note=reason)
        at_rest = run.status == RunStatus.QUEUED or (
            run.status == RunStatus.WAITING and run.wait_reason != WaitReason.RECONCILIATION)
        if at_rest and not writes_in_doubt(run_id=run.id).exists():
            run_cancel_finalize(run=run, lease_token=None)
        # Otherwise a worker ends it: at once when it is running, or — a write that a dead
        # worker left in flight — once that write is reconciled.
    return run


def run_cancel_by_worker(*, cp, lease) -> str:
    """The worker noticed a cancel request at a safe point (the loop has already recovered and
    waited out any write in doubt)."""
    run_cancel_finalize(run=cp.run, lease_token=lease.token)
    return "cancelled"


def run_cancel_finalize(*, run: Run, lease_token: int | None) -> bool:
    """Close everything that will never start, then store `cancelled` with the applied effects."""
    from sessions_app.services import session_lock, session_start_next_run

    with transaction.atomic():
        # The session first, as message_post takes it: an input posted while the run ends is
        # then either seen here (and starts the next run) or sees the run ended.
        session_lock(session_id=run.session_id)
        run_close_unstarted(run=run, lease_token=lease_token, code="run_cancelled", why="the run was cancelled",
                            withdrawn_by=run.cancel_requested_by)
        won = run_transition(
            run=run, to=RunStatus.CANCELLED, lease_token=lease_token,
            event_payload={"applied_effects": applied_effects(run_id=run.id), "reason": run.cancel_reason},
        )
        if won:
            session_start_next_run(session_id=run.session_id)
    return won


def run_close_unstarted(*, run: Run, lease_token: int | None, code: str, why: str, withdrawn_by=None) -> None:
    """A run is ending (cancelled or failed): open approval requests are withdrawn, calls that
    never started are cancelled (with tool messages, so the history holds no dangling call),
    running steps discarded. Never a write in doubt: callers end runs only without one."""
    from approvals_app.models import Approval, ApprovalStatus
    from approvals_app.services import approval_withdraw
    from runs_app.engine.tool_exec import tool_message
    from sessions_app.services import messages_append
    from tools_app.services import tool_call_transition

    with transaction.atomic():
        for approval in Approval.objects.filter(run_id=run.id, status=ApprovalStatus.PENDING):
            approval_withdraw(approval=approval, withdrawn_by=withdrawn_by, note=code.replace("_", " "),
                              lease_token=lease_token)
        closed = []
        for call in ToolCall.objects.filter(run_id=run.id, status__in=[ToolCallStatus.PENDING, ToolCallStatus.RUNNING]):
            if call.status == ToolCallStatus.RUNNING and call.effect == ToolEffect.WRITE:
                continue  # a write in doubt: never pretend it did not start
            if tool_call_transition(tool_call=call, to=ToolCallStatus.CANCELLED, lease_token=lease_token,
                                    error_code=code, error_detail=f"{why} before this call started"):
                closed.append(call)
        if closed:
            messages_append(session_id=run.session_id, messages=[tool_message(c) for c in closed])
        Step.objects.filter(run_id=run.id, status=StepStatus.RUNNING).update(
            status=StepStatus.DISCARDED, discard_reason=code.replace("_", " "), finished_at=timezone.now()
        )
