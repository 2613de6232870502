"""A human decision is bound to exactly what it approved (SPEC §18): the request and each approving
decision record a digest of the tool, the arguments and the idempotency key, and the call runs only
if it still matches — through the HTTP API, with the run driven as a worker drives it (in this
process: tests/support/drive.py)."""

import pytest
from django.contrib.auth.models import Permission

from approvals_app.models import Approval, ApprovalDecision
from demo.selectors import sim_refund_count
from runs_app.models import RunStatus, WaitReason
from tests.support.api import Api
from tests.support.drive import drive_until
from tests.support.factories import ApiKeyFactory, UserFactory
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.services import tool_call_digest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("simulator", "demo_world")]


@pytest.fixture
def desk(transactional_db):
    operator = UserFactory(username="digest-operator", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval", "view_run"]))
    return Api(ApiKeyFactory(owner=operator).secret)


def _refund_waiting_for_approval() -> tuple[str, Approval]:
    customer = Api(ApiKeyFactory(owner=UserFactory(username="digest-customer")).secret)
    session = customer.post("/sessions", {"title": "refund"}).json()
    run_id = customer.post(f"/sessions/{session['id']}/messages", {"content": "Please refund order 9527"}).json()["run"]["id"]
    drive_until(run_id, RunStatus.WAITING, WaitReason.APPROVAL)
    return run_id, Approval.objects.select_related("tool_call").get(run_id=run_id)


def test_an_approved_call_runs_when_it_is_what_was_approved(desk):
    run_id, approval = _refund_waiting_for_approval()
    assert approval.digest == tool_call_digest(approval.tool_call)
    assert desk.post(f"/approvals/{approval.pk}/decision", {"decision": "approve", "note": "ok"}).status_code == 200
    assert ApprovalDecision.objects.get(approval=approval).digest == approval.digest
    drive_until(run_id, RunStatus.COMPLETED)
    assert ToolCall.objects.get(pk=approval.tool_call_id).status == ToolCallStatus.SUCCEEDED
    assert sim_refund_count(order_id="9527") == 1


@pytest.mark.parametrize("change", ["arguments", "idempotency_key"])
def test_a_call_that_is_not_what_was_approved_sends_nothing(desk, change):
    run_id, approval = _refund_waiting_for_approval()
    assert desk.post(f"/approvals/{approval.pk}/decision", {"decision": "approve", "note": "ok"}).status_code == 200
    # Forced: the row changes between the decision and the execution (nothing in Warden does this).
    call = ToolCall.objects.filter(pk=approval.tool_call_id)
    if change == "arguments":
        call.update(arguments={**approval.tool_call.arguments, "amount": "99.00"})
    else:
        call.update(idempotency_key="execute_refund:refund:9527:another")
    drive_until(run_id, RunStatus.COMPLETED)
    refused = ToolCall.objects.get(pk=approval.tool_call_id)
    assert (refused.status, refused.error_code) == (ToolCallStatus.FAILED, "approval_mismatch")
    assert "not what was approved" in refused.error_detail and "digest-operator" in refused.error_detail
    assert sim_refund_count(order_id="9527") == 0
