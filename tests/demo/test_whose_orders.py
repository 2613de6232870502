"""Tools know whom they serve (SPEC §18): the run-time tells a tool the verified customer — the
session's owner — and the demo's tools show and refund that customer's orders only. alice (the
shop's customer u1) asking for u2's order is told it does not exist, and nothing is refunded;
through the HTTP API, the run driven as a worker drives it (tests/support/drive.py)."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from demo.accounts import DEMO_CUSTOMER
from demo.selectors import sim_refund_count
from demo.tools import RefundArguments, execute_refund
from engine.actions.sessions import session_open
from runs_app.models import RunStatus
from tests.support.api import Api
from tests.support.drive import drive_to_end
from tests.support.factories import ApiKeyFactory
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.registry import ToolContext, ToolError

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("simulator")]


@pytest.fixture
def alice(transactional_db, settings):
    settings.WARDEN_DEMO = True
    call_command("demo_setup", verbosity=0)  # alice, linked to the shop's customer u1, and the demo world
    return get_user_model().objects.get(username=DEMO_CUSTOMER[0])


def _ask(user, text: str):
    api = Api(ApiKeyFactory(owner=user).secret)
    session = api.post("/sessions", {"title": text}).json()
    run_id = api.post(f"/sessions/{session['id']}/messages", {"content": text}).json()["run"]["id"]
    return api, drive_to_end(run_id)


def test_alice_asking_for_another_customers_order_is_told_it_does_not_exist(alice):
    api, run = _ask(alice, "Please refund order 9529")  # u2's order
    assert run.status == RunStatus.COMPLETED
    (lookup,) = ToolCall.objects.filter(run_id=run.pk, tool_name="query_order")
    assert (lookup.status, lookup.error_code) == (ToolCallStatus.FAILED, "order_not_found")
    assert not ToolCall.objects.filter(run_id=run.pk, tool_name="execute_refund").exists()
    assert sim_refund_count(order_id="9529") == 0
    shown = api.get(f"/runs/{run.pk}").json()
    (call,) = shown["tool_calls"]
    assert call["message"] == "There is no order with that number."  # exactly what a missing order says


def test_alice_sees_her_own_order(alice):
    _, run = _ask(alice, "What is the status of order 9527?")  # u1's
    (lookup,) = ToolCall.objects.filter(run_id=run.pk, tool_name="query_order")
    assert lookup.status == ToolCallStatus.SUCCEEDED and lookup.result["user_id"] == "u1"


def test_a_refund_of_another_customers_order_is_refused_before_anything_is_sent(alice):
    session = session_open(owner=alice, title="straight to the refund")
    ctx = ToolContext(run_id="r", session_id=str(session.pk), tool_call_id="c",
                      idempotency_key="execute_refund:refund:9529:120.00", timeout=5.0)
    assert ctx.customer.username == alice.username
    with pytest.raises(ToolError) as refused:
        execute_refund(ctx, RefundArguments(order_id="9529", amount="120.00"))
    assert refused.value.code == "order_not_found"
    assert sim_refund_count(order_id="9529") == 0
