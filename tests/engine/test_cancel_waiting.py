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


@pytest.mark.parametrize(("by_person", "closed_as", "event"), [
    (True, ApprovalStatus.REJECTED, "approval_decided"),
    (False, ApprovalStatus.EXPIRED, "approval_expired"),
])
def test_cancel_closes_the_open_approval_and_the_run(by_person, closed_as, event):
    run, approval = _waiting_for_approval()
    run_cancel_request(run=run, acting_user=run.session.owner if by_person else None, reason="stop")
    run.refresh_from_db(), approval.refresh_from_db(), approval.tool_call.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert approval.status == closed_as
    assert approval.tool_call.status == ToolCallStatus.CANCELLED
    types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert event in types and types.index(event) < types.index("run_status")
