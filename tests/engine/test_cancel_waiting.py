"""Cancelling a run that waits for a person closes the request and logs it (SPEC §9)."""

import pytest

from approvals_app.models import ApprovalStatus
from runs_app.engine.cancel import run_cancel_request
from runs_app.models import RunEvent, RunStatus
from tests.factories import ApprovalFactory, RunFactory, StepFactory, ToolCallFactory
from tools_app.models import ToolCallStatus

pytestmark = pytest.mark.django_db


def _waiting_for_approval():
    run = RunFactory(status=RunStatus.WAITING, phase="", wait_reason="approval")
    call = ToolCallFactory(run=run, step=StepFactory(run=run, kind="tools"), tool_name="execute_refund", effect="write",
                           idempotency_key="refund:k")
    return run, ApprovalFactory(tool_call=call, run=run)


@pytest.mark.parametrize("by_person", [True, False])
def test_cancel_withdraws_the_open_approval_and_cancels_the_run(by_person):
    """Withdrawn, not rejected: the customer who cancels did not decide an operator-level
    request (and may not); not expired: its time did not run out."""
    run, approval = _waiting_for_approval()
    canceller = run.session.owner if by_person else None
    run_cancel_request(run=run, acting_user=canceller, reason="stop")
    run.refresh_from_db(), approval.refresh_from_db(), approval.tool_call.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert (approval.status, approval.decided_by, approval.note) == (ApprovalStatus.WITHDRAWN, canceller, "run cancelled")
    assert approval.decided_at is not None
    assert approval.tool_call.status == ToolCallStatus.CANCELLED
    types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert "approval_withdrawn" in types and types.index("approval_withdrawn") < types.index("run_status")
    assert "approval_decided" not in types
