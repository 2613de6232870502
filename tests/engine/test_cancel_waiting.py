"""Cancelling a run that waits for a person closes the request and logs it (SPEC §9)."""

import pytest

from approvals_app.models import Approval, ApprovalStatus
from engine.actions.cancel import run_cancel_request
from runs_app.models import Run, RunEvent, RunStatus, WaitReason
from sessions_app.models import Message, MessageRole
from tests.support.chaos import post
from tests.support.drive import drive_until
from tests.support.factories import ApprovalFactory, RunFactory, StepFactory, ToolCallFactory
from tools_app.models import ToolCall, ToolCallStatus

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


def test_the_deadline_does_not_fail_a_run_that_waits_for_an_operator():
    """An hour's deadline, a day's approval: waiting for a person does not use up the run's own
    time (SPEC §16), so the sweeper leaves it waiting; the approval's expiry ends that wait."""
    from datetime import timedelta

    from django.utils import timezone

    from engine.sweeper import sweep_once
    from runs_app.models import Run, WaitReason

    run, approval = _waiting_for_approval()
    Run.objects.filter(pk=run.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert sweep_once()["deadlines_failed"] == 0
    run.refresh_from_db(), approval.refresh_from_db()
    assert (run.status, run.wait_reason) == (RunStatus.WAITING, WaitReason.APPROVAL)
    assert approval.status == ApprovalStatus.PENDING


def test_a_run_that_fails_withdraws_its_approval_and_closes_the_call():
    """However a run fails, its request must not stay in the operators' queue, where approving
    it would record a decision that runs nothing."""
    from approvals_app.errors import ApprovalRefusal
    from config.errors import WardenError
    from engine.actions.approvals import approval_decide
    from engine.actions.runs import run_end
    from runs_app.models import RunErrorCode
    from sessions_app.models import Message, MessageRole
    from tests.support.factories import UserFactory

    run, approval = _waiting_for_approval()
    assert run_end(run=run, to=RunStatus.FAILED, lease_token=None, error_code=RunErrorCode.INTERNAL, error_detail="test")
    run.refresh_from_db(), approval.refresh_from_db(), approval.tool_call.refresh_from_db()
    assert (run.status, run.error_code) == (RunStatus.FAILED, RunErrorCode.INTERNAL)
    assert (approval.status, approval.decided_by, approval.note) == (ApprovalStatus.WITHDRAWN, None, "run failed")
    assert (approval.tool_call.status, approval.tool_call.error_code) == (ToolCallStatus.CANCELLED, "run_failed")
    # The history answers the call, so the next run's context holds no dangling tool call.
    assert Message.objects.filter(session=run.session, role=MessageRole.TOOL, tool_call_id=approval.tool_call.tool_call_id).exists()
    operator = UserFactory(is_staff=True, is_superuser=True)
    with pytest.raises(WardenError) as refused:
        approval_decide(approval=approval, decision="approve", note="too late", acting_user=operator)
    assert refused.value.code is ApprovalRefusal.ALREADY_DECIDED


def test_applied_effects_list_a_write_once_even_when_the_model_asked_for_it_twice():
    from django.utils import timezone

    from tools_app.selectors import applied_effects

    run, approval = _waiting_for_approval()
    first = approval.tool_call
    first.status, first.result, first.finished_at = ToolCallStatus.SUCCEEDED, {"refund_id": "r1"}, timezone.now()
    first.save()
    ToolCallFactory(run=run, step=first.step, index=1, tool_name="execute_refund", effect="write",
                    status=ToolCallStatus.SUCCEEDED, reused_from=first, result={"refund_id": "r1"},
                    finished_at=timezone.now())
    assert [effect["tool_call"] for effect in applied_effects(run_id=run.id)] == [str(first.id)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("simulator", "demo_world")
def test_a_run_that_reached_its_approval_cancels_at_once_and_closes_it():
    """A run driven as a worker drives it to its refund's approval, then cancelled: nothing is in
    flight, so it ends at once; the request is withdrawn and the call answered in the history."""
    run = post("Check order 9527 and refund it if it's eligible")
    drive_until(run, RunStatus.WAITING, WaitReason.APPROVAL)
    run_cancel_request(run=run, acting_user=run.created_by, reason="no longer needed")
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED  # nothing in flight: at once
    approval = Approval.objects.get(run=run)
    assert approval.status == ApprovalStatus.WITHDRAWN and approval.decided_by == run.created_by
    refund = ToolCall.objects.get(run=run, tool_name="execute_refund")
    assert refund.status == ToolCallStatus.CANCELLED
    answer = Message.objects.get(run=run, role=MessageRole.TOOL, tool_call_id=refund.tool_call_id)
    assert "run_cancelled" in answer.content or "approval_rejected" in answer.content
