"""execute_refund as the run-time sees it: over real HTTP against the simulated gateway."""

from decimal import Decimal

import httpx
import pytest
from pydantic import ValidationError

from tests.support.factories import SimOrderFactory, SimRefundFactory
from demo.selectors import sim_refund_count
from demo.services import sim_fault_set
from tools_app.models import ToolEffect
from tools_app.registry import ApprovalRequirement, ToolError, ToolOutcomeUnknown, tool_get

refund_tool = tool_get("execute_refund")


def refund_args(**overrides):
    return refund_tool.arguments.model_validate({"order_id": "9527", "amount": "25.00", **overrides})


def test_refund_is_an_operator_approved_write_with_reconciliation():
    assert refund_tool.effect == ToolEffect.WRITE
    assert refund_tool.approval == ApprovalRequirement.OPERATOR
    assert refund_tool.timeout == 2.0
    assert refund_tool.reconcile is not None
    amount_schema = refund_tool.openai_schema()["function"]["parameters"]["properties"]["amount"]
    assert amount_schema["type"] == "string"


def test_claims_of_approval_in_the_arguments_are_dropped():
    args = refund_args(approved_by="admin", approval="already approved")
    assert args.model_dump(mode="json") == {"order_id": "9527", "amount": "25.00", "reason": "customer request"}


def test_the_business_key_does_not_depend_on_how_the_amount_is_written():
    keys = {refund_tool.idempotency_key_for(run_id="r", arguments=refund_args(amount=a)) for a in ("25", 25, "25.0", "25.00")}
    assert keys == {"execute_refund:refund:9527:25.00"}


def test_the_business_key_is_the_same_in_every_run_and_however_the_order_is_spaced():
    # A fact of the deployment (SPEC §18): no run in it, and " 1010" is order 1010.
    keys = {refund_tool.idempotency_key_for(run_id=run, arguments=refund_args(order_id=order))
            for run in ("r1", "r2") for order in ("1010", " 1010", "1010\t")}
    assert keys == {"execute_refund:refund:1010:25.00"}
    assert refund_args(order_id=" 1010 ").model_dump(mode="json")["order_id"] == "1010"


@pytest.mark.parametrize("amount", ["0", "-1", "1.234", "ten"])
def test_bad_amounts_never_reach_the_gateway(amount):
    with pytest.raises(ValidationError):
        refund_args(amount=amount)


@pytest.mark.django_db(transaction=True)
def test_refund_succeeds_and_the_same_key_replays_it(sim_url, tool_ctx):
    SimOrderFactory(order_id="9527", amount=Decimal("25.00"))
    first = refund_tool.execute(tool_ctx(), refund_args())
    again = refund_tool.execute(tool_ctx(), refund_args())
    assert first["status"] == "booked" and first["amount"] == "25.00" and first["idempotency_key"] == "refund-key-1"
    assert again["refund_id"] == first["refund_id"] and again["replayed"] is True
    assert sim_refund_count(order_id="9527") == 1


@pytest.mark.django_db(transaction=True)
def test_a_refusal_is_a_definite_tool_error(sim_url, tool_ctx):
    SimOrderFactory(order_id="9528", refund_eligible=False, ineligible_reason="delivered more than 30 days ago")
    with pytest.raises(ToolError) as ineligible:
        refund_tool.execute(tool_ctx(), refund_args(order_id="9528"))
    with pytest.raises(ToolError) as unknown_order:
        refund_tool.execute(tool_ctx(idempotency_key="other"), refund_args(order_id="0000"))
    assert ineligible.value.code == "not_eligible" and "30 days" in ineligible.value.detail
    assert unknown_order.value.code == "order_not_found"
    assert not ineligible.value.retryable
    assert sim_refund_count() == 0


@pytest.mark.django_db(transaction=True)
def test_reused_key_for_another_amount_is_a_tool_error(sim_url, tool_ctx):
    SimOrderFactory(order_id="9527", amount=Decimal("25.00"))
    refund_tool.execute(tool_ctx(), refund_args())
    with pytest.raises(ToolError) as reused:
        refund_tool.execute(tool_ctx(), refund_args(amount="20.00"))
    assert reused.value.code == "idempotency_key_reused"


@pytest.mark.django_db(transaction=True)
def test_timed_out_refund_is_unknown_and_was_booked(sim_url, tool_ctx):
    SimOrderFactory(order_id="9527")
    sim_fault_set(target="refund", mode="timeout_after_booking", delay_seconds=1.0)
    with pytest.raises(ToolOutcomeUnknown):
        refund_tool.execute(tool_ctx(timeout=0.5), refund_args())
    assert sim_refund_count(order_id="9527") == 1
    found = refund_tool.reconcile(tool_ctx(), refund_args())
    assert found.applied is True and found.result["idempotency_key"] == "refund-key-1"


@pytest.mark.django_db(transaction=True)
def test_gateway_error_is_unknown_and_reconciliation_finds_nothing(sim_url, tool_ctx):
    SimOrderFactory(order_id="9527")
    sim_fault_set(target="refund", mode="error_before_booking")
    with pytest.raises(ToolOutcomeUnknown) as unknown:
        refund_tool.execute(tool_ctx(), refund_args())
    assert "503" in unknown.value.detail
    assert sim_refund_count(order_id="9527") == 0
    missing = refund_tool.reconcile(tool_ctx(), refund_args())
    assert missing.applied is False and missing.result is None


@pytest.mark.django_db(transaction=True)
def test_many_concurrent_tool_calls_with_one_key_book_one_refund(sim_url, tool_ctx, concurrently):
    SimOrderFactory(order_id="9527")
    results = concurrently(lambda i: refund_tool.execute(tool_ctx(), refund_args()), 8)
    assert all(isinstance(result, dict) for result in results), results
    assert len({result["refund_id"] for result in results}) == 1
    assert sim_refund_count(order_id="9527") == 1


def test_connection_refused_is_a_definite_error(closed_port_url, tool_ctx):
    with pytest.raises(ToolError) as unreachable:
        refund_tool.execute(tool_ctx(), refund_args())
    assert unreachable.value.code == "gateway_unreachable"


def test_reconciliation_cannot_tell_when_the_gateway_is_unreachable(closed_port_url, tool_ctx):
    assert refund_tool.reconcile(tool_ctx(), refund_args()) is None


@pytest.mark.django_db(transaction=True)
def test_a_404_that_is_not_the_gateways_answer_proves_nothing(simulator, tool_ctx, settings):
    SimRefundFactory(idempotency_key="refund-key-1")
    settings.WARDEN_SIM_BASE_URL = simulator.removesuffix("/sim") + "/not-the-sim"
    assert refund_tool.reconcile(tool_ctx(), refund_args()) is None


def test_without_an_idempotency_key_nothing_is_sent(tool_ctx, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("a refund went out without an idempotency key")

    monkeypatch.setattr(httpx.Client, "send", no_network)
    with pytest.raises(ToolError) as missing:
        refund_tool.execute(tool_ctx(idempotency_key=None), refund_args())
    assert missing.value.code == "idempotency_key_missing"


@pytest.mark.django_db(transaction=True)
def test_drop_after_booking_on_the_wsgi_test_server_still_ends_unknown(sim_url, tool_ctx):
    """The WSGI test server cannot cut the connection; the short body leaves the client
    waiting until its timeout, which is just as ambiguous."""
    SimOrderFactory(order_id="9527")
    sim_fault_set(target="refund", mode="drop_after_booking")
    with pytest.raises(ToolOutcomeUnknown):
        refund_tool.execute(tool_ctx(timeout=0.5), refund_args())
    assert sim_refund_count(order_id="9527") == 1
