"""Cancellation: requested is not done (SPEC §9).

A request is recorded first (status unchanged), audited, and signalled to the worker through its
heartbeat. The run becomes `cancelled` only when no write is in flight: an `unknown` write is
reconciled first. Effects already applied are listed, never rolled back silently.
"""

from django.db import transaction

from approvals_app.services import audit_record
from config.errors import WardenError
from engine.actions.runs import run_end
from engine.state import run_cancel_request as run_cancel_request_record
from engine.state import run_row_lock
from runs_app.errors import RunRefusal
from runs_app.models import TERMINAL_STATUSES, Run, RunStatus, WaitReason
from sessions_app.services import session_lock
from tools_app.selectors import writes_in_doubt


def run_cancel_request(*, run: Run, acting_user, reason: str = "") -> Run:
    """Record a cancel request (by whom, why); cancel at once when nothing is in flight (queued,
    or waiting on anything but reconciliation). A running run is stopped by its worker at the
    next delta or safe point; one with a write in doubt once the write is reconciled."""
    with transaction.atomic():
        session_lock(session_id=run.session_id)  # before the run's row, as posting input does
        run = run_row_lock(run_id=run.pk)
        if run.status in TERMINAL_STATUSES:
            raise WardenError(RunRefusal.RUN_TERMINAL, f"The run is already {run.status}.")
        if run_cancel_request_record(run=run, by_id=getattr(acting_user, "pk", None),
                                     by_username=acting_user.get_username() if acting_user else None, reason=reason):
            run.cancel_requested_by = acting_user
            if acting_user is not None:
                audit_record(actor=acting_user, action="cancel", obj=run, run_id=run.id,
                             before={"status": run.status}, after={"cancel_requested": True}, note=reason)
        at_rest = run.status == RunStatus.QUEUED or (
            run.status == RunStatus.WAITING and run.wait_reason != WaitReason.RECONCILIATION)
        if at_rest and not writes_in_doubt(run_id=run.id).exists():
            run_end(run=run, to=RunStatus.CANCELLED, lease_token=None)
    return run


def run_cancel_by_worker(*, run: Run, lease_token: int) -> str:
    """The worker noticed a cancel request at a safe point (the loop has already recovered and
    waited out any write in doubt)."""
    run_end(run=run, to=RunStatus.CANCELLED, lease_token=lease_token)
    return "cancelled"
