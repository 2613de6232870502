"""Automatic reconciliation asks the payment service by idempotency key (SPEC §6)."""

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from tests.support.factories import RunFactory, StepFactory, ToolCallFactory
from tools_app.models import ToolCall, ToolCallStatus
from engine.actions.reconciliation import tool_call_reconcile_auto

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def unknown_refund(simulator, demo_world):
    run = RunFactory(status="waiting", phase="", wait_reason="reconciliation")
    call = ToolCallFactory(
        run=run, step=StepFactory(run=run), tool_name="execute_refund", effect="write", status=ToolCallStatus.UNKNOWN,
        arguments={"order_id": "9527", "amount": "25.00", "reason": "customer request"},
        idempotency_key="execute_refund:test-key", finished_at=timezone.now(), next_attempt_at=timezone.now(),
    )
    with override_settings(WARDEN_RECONCILE_GRACE_SECONDS=30):
        yield call


def test_not_found_right_after_the_timeout_is_not_yet_not_applied(unknown_refund):
    assert tool_call_reconcile_auto(tool_call=unknown_refund) == "unresolved"
    assert ToolCall.objects.get(pk=unknown_refund.pk).status == ToolCallStatus.UNKNOWN


def test_not_found_after_the_grace_period_resolves_to_not_applied(unknown_refund):
    ToolCall.objects.filter(pk=unknown_refund.pk).update(finished_at=timezone.now() - timedelta(minutes=5))
    unknown_refund.refresh_from_db()
    assert tool_call_reconcile_auto(tool_call=unknown_refund) == "resolved"
    stored = ToolCall.objects.get(pk=unknown_refund.pk)
    assert (stored.status, stored.resolution) == (ToolCallStatus.FAILED, "not_applied")
    assert stored.resolved_by is None and "idempotency key" in stored.evidence


def test_a_booked_refund_is_found_by_its_key_at_once(unknown_refund):
    from decimal import Decimal

    from demo.services import sim_refund_book

    sim_refund_book(order_id="9527", amount=Decimal("25.00"), reason="customer request", idempotency_key="execute_refund:test-key")
    assert tool_call_reconcile_auto(tool_call=unknown_refund) == "resolved"
    stored = ToolCall.objects.get(pk=unknown_refund.pk)
    assert (stored.status, stored.resolution) == (ToolCallStatus.SUCCEEDED, "applied")
    assert stored.result["order_id"] == "9527"


def test_an_operators_query_is_permission_checked_and_audited(unknown_refund):
    from django.contrib.auth.models import Permission

    from approvals_app.models import AuditEntry
    from tests.support.factories import UserFactory
    from config.errors import WardenError

    outsider = UserFactory()
    with pytest.raises(WardenError) as refused:
        tool_call_reconcile_auto(tool_call=unknown_refund, acting_user=outsider)
    assert refused.value.code == "not_permitted" and not AuditEntry.objects.exists()
    operator = UserFactory()
    operator.user_permissions.add(Permission.objects.get(codename="reconcile_toolcall"))
    operator = type(operator).objects.get(pk=operator.pk)
    assert tool_call_reconcile_auto(tool_call=unknown_refund, acting_user=operator) == "unresolved"
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.action, entry.object_id) == (operator, "reconcile_query", str(unknown_refund.pk))


def test_an_expired_request_can_no_longer_be_approved(transactional_db):
    from django.contrib.auth.models import Permission

    from approvals_app.models import Approval, ApprovalStatus
    from approvals_app.errors import ApprovalRefusal
    from config.errors import WardenError
    from engine.actions.approvals import approval_decide
    from tests.support.factories import ApprovalFactory, UserFactory

    approval = ApprovalFactory(expires_at=timezone.now() - timedelta(seconds=1))
    Run = type(approval.run)
    Run.objects.filter(pk=approval.run_id).update(status="waiting", phase="", wait_reason="approval")
    operator = UserFactory()
    operator.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    operator = type(operator).objects.get(pk=operator.pk)
    with pytest.raises(WardenError, match="expired") as refused:
        approval_decide(approval=approval, decision="approve", note="late", acting_user=operator)
    assert refused.value.code is ApprovalRefusal.EXPIRED
    stored = Approval.objects.get(pk=approval.pk)
    assert stored.status == ApprovalStatus.EXPIRED and stored.decided_by is None
    assert ToolCall.objects.get(pk=approval.tool_call_id).status == ToolCallStatus.CANCELLED
