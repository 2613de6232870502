"""Automatic reconciliation asks the payment service by idempotency key (SPEC §6)."""

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from tests.factories import RunFactory, StepFactory, ToolCallFactory
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.reconciliation import tool_call_reconcile_auto

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def unknown_refund(live_server, demo_world):
    run = RunFactory(status="waiting", phase="", wait_reason="reconciliation")
    call = ToolCallFactory(
        run=run, step=StepFactory(run=run), tool_name="execute_refund", effect="write", status=ToolCallStatus.UNKNOWN,
        arguments={"order_id": "9527", "amount": "25.00", "reason": "customer request"},
        idempotency_key="execute_refund:test-key", finished_at=timezone.now(), next_attempt_at=timezone.now(),
    )
    with override_settings(WARDEN_SIM_BASE_URL=live_server.url + "/sim", WARDEN_RECONCILE_GRACE_SECONDS=30):
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

    from tools_app.demo.services import sim_refund_book

    sim_refund_book(order_id="9527", amount=Decimal("25.00"), reason="customer request", idempotency_key="execute_refund:test-key")
    assert tool_call_reconcile_auto(tool_call=unknown_refund) == "resolved"
    stored = ToolCall.objects.get(pk=unknown_refund.pk)
    assert (stored.status, stored.resolution) == (ToolCallStatus.SUCCEEDED, "applied")
    assert stored.result["order_id"] == "9527"
