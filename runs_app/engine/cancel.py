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
        for c in ToolCall.objects.filter(run_id=run_id, effect=ToolEffect.WRITE, status=ToolCallStatus.SUCCEEDED).order_by("finished_at")
    ]


def run_cancel_request(*, run: Run, acting_user, reason: str = "") -> Run:
    """Record a cancel request (by whom, why); cancel at once when nothing is in flight
    (queued, or waiting on anything but reconciliation). A running run is stopped by its
    worker at the next delta or safe point."""
    from approvals_app.services import audit_record

    with transaction.atomic():
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
        if run.status == RunStatus.QUEUED or (run.status == RunStatus.WAITING and run.wait_reason != WaitReason.RECONCILIATION):
            run_cancel_finalize(run=run, lease_token=None)
    return run


def run_cancel_by_worker(*, cp, lease) -> str:
    """The worker noticed a cancel request at a safe point."""
    if any(c.status == ToolCallStatus.UNKNOWN for c in cp.open_tool_calls):
        from runs_app.engine.tool_exec import _wait_for_reconciliation

        unknown = next(c for c in cp.open_tool_calls if c.status == ToolCallStatus.UNKNOWN)
        _wait_for_reconciliation(run=cp.run, lease=lease, call=unknown)  # raises StopDriving
    run_cancel_finalize(run=cp.run, lease_token=lease.token)
    return "cancelled"


def run_cancel_finalize(*, run: Run, lease_token: int | None) -> bool:
    """Close everything that will never start, then store `cancelled` with the applied effects."""
    from approvals_app.models import Approval, ApprovalStatus
    from approvals_app.services import approval_close_for_cancel
    from runs_app.engine.tool_exec import tool_message
    from sessions_app.services import messages_append, session_start_next_run
    from tools_app.services import tool_call_transition

    with transaction.atomic():
        for approval in Approval.objects.filter(run_id=run.id, status=ApprovalStatus.PENDING):
            approval_close_for_cancel(approval=approval, cancelled_by=run.cancel_requested_by, lease_token=lease_token)
        closed = []
        for call in ToolCall.objects.filter(run_id=run.id, status__in=[ToolCallStatus.PENDING, ToolCallStatus.RUNNING]):
            if call.status == ToolCallStatus.RUNNING and call.effect == ToolEffect.WRITE:
                continue  # cannot happen at a safe point; never pretend a write did not start
            if tool_call_transition(tool_call=call, to=ToolCallStatus.CANCELLED, lease_token=lease_token,
                                    error_code="run_cancelled", error_detail="the run was cancelled before this call started"):
                closed.append(call)
        if closed:
            messages_append(session_id=run.session_id, messages=[tool_message(c) for c in closed])
        Step.objects.filter(run_id=run.id, status=StepStatus.RUNNING).update(
            status=StepStatus.DISCARDED, discard_reason="run cancelled", finished_at=timezone.now()
        )
        won = run_transition(
            run=run, to=RunStatus.CANCELLED, lease_token=lease_token,
            event_payload={"applied_effects": applied_effects(run_id=run.id), "reason": run.cancel_reason},
        )
        if won:
            session_start_next_run(session_id=run.session_id)
    return won
