"""The read tools: results, definite errors, and retryable failures."""

from decimal import Decimal

import httpx
import pytest

from tests.support.factories import SimOrderFactory, SimUserLevelFactory
from demo.services import sim_fault_set
from tools_app.models import ToolEffect
from tools_app.registry import ToolError, tool_get

query_order = tool_get("query_order")


def test_read_tools_are_registered_as_reads():
    for name in ("query_order", "query_user_level", "get_weather", "noop"):
        tool = tool_get(name)
        assert tool.effect == ToolEffect.READ and tool.reconcile is None, name


@pytest.mark.django_db(transaction=True)
def test_query_order_returns_the_order(sim_url, tool_ctx):
    SimOrderFactory(order_id="9527", amount=Decimal("25.00"))
    order = query_order.execute(tool_ctx(), query_order.arguments.model_validate({"order_id": "9527", "junk": 1}))
    assert order["order_id"] == "9527" and order["amount"] == "25.00" and order["refund_eligible"] is True


@pytest.mark.django_db(transaction=True)
def test_unknown_order_is_a_final_error(sim_url, tool_ctx):
    with pytest.raises(ToolError) as missing:
        query_order.execute(tool_ctx(), query_order.arguments(order_id="0000"))
    assert (missing.value.code, missing.value.retryable) == ("order_not_found", False)


@pytest.mark.django_db(transaction=True)
def test_order_service_outage_is_retryable(sim_url, tool_ctx):
    sim_fault_set(target="order", mode="error_before_booking")
    with pytest.raises(ToolError) as outage:
        query_order.execute(tool_ctx(), query_order.arguments(order_id="9527"))
    assert outage.value.retryable is True


@pytest.mark.django_db(transaction=True)
def test_slow_order_service_is_a_retryable_timeout(sim_url, tool_ctx):
    SimOrderFactory(order_id="9527")
    sim_fault_set(target="order", mode="delay", delay_seconds=1.0)
    with pytest.raises(ToolError) as slow:
        query_order.execute(tool_ctx(timeout=0.3), query_order.arguments(order_id="9527"))
    assert (slow.value.code, slow.value.retryable) == ("sim_timeout", True)
    # The fault is spent: the retry gets the order.
    assert query_order.execute(tool_ctx(), query_order.arguments(order_id="9527"))["order_id"] == "9527"


def test_unreachable_order_service_is_retryable(closed_port_url, tool_ctx):
    with pytest.raises(ToolError) as unreachable:
        query_order.execute(tool_ctx(), query_order.arguments(order_id="9527"))
    assert (unreachable.value.code, unreachable.value.retryable) == ("sim_unreachable", True)


@pytest.mark.django_db(transaction=True)
def test_query_user_level(sim_url, tool_ctx):
    SimUserLevelFactory(user_id="u1", level="gold")
    tool = tool_get("query_user_level")
    assert tool.execute(tool_ctx(), tool.arguments(user_id="u1")) == {"user_id": "u1", "level": "gold"}
    with pytest.raises(ToolError) as missing:
        tool.execute(tool_ctx(), tool.arguments(user_id="nobody"))
    assert missing.value.code == "user_not_found"


@pytest.mark.django_db(transaction=True)
def test_get_weather_is_stable(sim_url, tool_ctx):
    tool = tool_get("get_weather")
    first = tool.execute(tool_ctx(), tool.arguments(city="Paris"))
    assert first == tool.execute(tool_ctx(), tool.arguments(city="Paris"))
    assert first["city"] == "Paris"


@pytest.mark.django_db(transaction=True)
def test_weather_outage_is_retryable(sim_url, tool_ctx):
    sim_fault_set(target="weather", mode="error_before_booking")
    tool = tool_get("get_weather")
    with pytest.raises(ToolError) as outage:
        tool.execute(tool_ctx(), tool.arguments(city="Paris"))
    assert outage.value.retryable is True


def test_noop_needs_no_network(tool_ctx, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("noop touched the network")

    monkeypatch.setattr(httpx.Client, "send", no_network)
    tool = tool_get("noop")
    assert tool.execute(tool_ctx(), tool.arguments(i=7)) == {"i": 7}
    assert tool.execute(tool_ctx(), tool.arguments()) == {"i": 0}
