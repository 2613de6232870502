"""A connection dropped after booking, against the project served the way it runs: daphne."""

import httpx
import pytest

from tests.support.factories import SimOrderFactory
from demo.selectors import sim_refund_count
from demo.services import sim_fault_set
from tools_app.registry import ToolOutcomeUnknown, tool_get

refund_tool = tool_get("execute_refund")


@pytest.mark.django_db(transaction=True)
def test_dropped_connection_after_booking_is_unknown_and_reconciles_to_applied(daphne_sim, tool_ctx):
    SimOrderFactory(order_id="9527")
    sim_fault_set(target="refund", mode="drop_after_booking")
    args = refund_tool.arguments.model_validate({"order_id": "9527", "amount": "25.00"})
    with pytest.raises(ToolOutcomeUnknown) as unknown:
        refund_tool.execute(tool_ctx(), args)
    assert isinstance(unknown.value.__cause__, httpx.RemoteProtocolError)
    assert sim_refund_count(order_id="9527") == 1
    found = refund_tool.reconcile(tool_ctx(), args)
    assert found.applied is True and found.result["order_id"] == "9527"
    # The server itself is unharmed, and the key still answers with the one refund.
    assert refund_tool.execute(tool_ctx(), args)["replayed"] is True
    assert sim_refund_count(order_id="9527") == 1


@pytest.mark.django_db(transaction=True)
def test_timeout_after_booking_under_daphne(daphne_sim, tool_ctx):
    SimOrderFactory(order_id="9527")
    sim_fault_set(target="refund", mode="timeout_after_booking", delay_seconds=1.0)
    args = refund_tool.arguments.model_validate({"order_id": "9527", "amount": "25.00"})
    with pytest.raises(ToolOutcomeUnknown):
        refund_tool.execute(tool_ctx(timeout=0.5), args)
    assert sim_refund_count(order_id="9527") == 1
    assert refund_tool.reconcile(tool_ctx(), args).applied is True
