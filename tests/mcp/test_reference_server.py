"""The reference MCP payments server (tests/support/mcp_payments.py), checked with the official SDK's
client (mcp 2.3) over real HTTP and stdio. No database needed."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2
import pytest
from pydantic import ValidationError

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from tests.support.mcp_server import ROOT, McpPaymentsServer, mcp_payments_server  # noqa: F401 - the fixture

KEY = "dev.warden/idempotency-key"
REFUND_ARGS = {"order_id": "9527", "amount": 9.0, "currency": "EUR", "reason": "damaged"}
TOKEN = "tok-3f9a1c"


def client(server: McpPaymentsServer, *, headers: dict[str, str] | None = None, token: bool = True) -> Client:
    sent = dict(server.headers) if token else {}
    sent.update(headers or {})
    return Client(streamable_http_client(server.url, http_client=httpx2.AsyncClient(headers=sent)))


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(fn)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups: leaving `async with Client(...)` wraps them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def tools_by_name(result: Any) -> dict[str, Any]:
    return {tool.name: tool for tool in result.tools}


# ------------------------------------------------------------------------------------------------
# tools/list and variants


def test_list_tools_shows_the_five_tools_and_a_fresh_client_sees_variant_v2(mcp_payments_server):
    server = mcp_payments_server

    async def listing():
        async with client(server) as c:
            return tools_by_name(await c.list_tools())

    tools = run(listing)
    assert set(tools) == {"lookup_order", "refund", "find_refund", "close_account", "send_newsletter"}

    lookup, refund, find = tools["lookup_order"], tools["refund"], tools["find_refund"]
    assert lookup.annotations.read_only_hint is True
    assert lookup.input_schema["required"] == ["order_id"]
    assert lookup.input_schema["properties"]["order_id"]["type"] == "string"

    assert refund.annotations.read_only_hint is False
    assert refund.annotations.destructive_hint is True
    assert refund.annotations.idempotent_hint is True
    assert set(refund.input_schema["required"]) == {"order_id", "amount", "currency"}
    assert refund.input_schema["properties"]["amount"]["type"] == "number"
    assert refund.input_schema["properties"]["reason"]["default"] == ""
    assert "note" not in refund.input_schema["properties"]
    assert "v2" not in refund.description
    assert set(refund.output_schema["properties"]) == {"refund_id", "order_id", "amount", "currency", "status"}

    assert find.annotations.read_only_hint is True
    assert find.input_schema["required"] == ["idempotency_key"]

    close = tools["close_account"].annotations
    assert (close.read_only_hint, close.destructive_hint) == (False, True)
    newsletter = tools["send_newsletter"].annotations
    assert (newsletter.read_only_hint, newsletter.destructive_hint) == (False, False)
    assert all(tool.description for tool in tools.values())

    server.set_variant("v2")
    tools = run(listing)
    assert set(tools) == {"refund", "find_refund", "close_account", "send_newsletter"}
    refund = tools["refund"]
    assert "note" in refund.input_schema["required"]
    assert refund.input_schema["properties"]["note"]["type"] == "string"
    assert "v2" in refund.description
    assert server.state()["variant"] == "v2"

    server.reset()
    assert "lookup_order" in run(listing)


def test_calls_under_v2_a_removed_tool_and_stale_arguments_fail_as_the_sdk_does(mcp_payments_server):
    server = mcp_payments_server
    server.set_variant("v2")

    async def calls():
        async with client(server) as c:
            removed = await c.call_tool("lookup_order", {"order_id": "9527"})
            stale = await c.call_tool("refund", REFUND_ARGS, meta={KEY: "v1-shaped"})
            fresh = await c.call_tool("refund", {**REFUND_ARGS, "note": "ok"}, meta={KEY: "v2-shaped"})
            return removed, stale, fresh

    removed, stale, fresh = run(calls)
    assert removed.is_error and removed.content[0].text == "Unknown tool: lookup_order"
    assert stale.is_error and "note" in stale.content[0].text
    assert not fresh.is_error and fresh.structured_content["status"] == "booked"
    assert list(server.bookings()) == ["v2-shaped"]
    assert [call["tool"] for call in server.calls()] == ["lookup_order", "refund", "refund"]


# ------------------------------------------------------------------------------------------------
# tools and idempotency


def test_lookup_order_returns_the_order_or_an_error(mcp_payments_server):
    async def calls():
        async with client(mcp_payments_server) as c:
            return await c.call_tool("lookup_order", {"order_id": "9527"}), await c.call_tool(
                "lookup_order", {"order_id": "1"}
            )

    found, missing = run(calls)
    assert not found.is_error
    assert found.structured_content == {
        "order_id": "9527", "customer": "alice", "amount": "9.00", "currency": "EUR", "status": "paid",
    }
    assert json.loads(found.content[0].text)["customer"] == "alice"
    assert missing.is_error and missing.content[0].text == "no order 1"


def test_refund_books_once_per_key_from_meta_or_header_and_find_refund_reconciles(mcp_payments_server):
    server = mcp_payments_server

    async def calls():
        async with client(server) as c:
            first = await c.call_tool("refund", REFUND_ARGS, meta={KEY: "k-meta"})
            again = await c.call_tool("refund", REFUND_ARGS, meta={KEY: "k-meta"})
            unkeyed = await c.call_tool("refund", {**REFUND_ARGS, "order_id": "9528"})
        async with client(server, headers={"Idempotency-Key": "k-header"}) as c:
            by_header = await c.call_tool("refund", REFUND_ARGS)
            by_header_again = await c.call_tool("refund", REFUND_ARGS)
            found = await c.call_tool("find_refund", {"idempotency_key": "k-meta"})
            not_found = await c.call_tool("find_refund", {"idempotency_key": "never-sent"})
        return first, again, unkeyed, by_header, by_header_again, found, not_found

    first, again, unkeyed, by_header, by_header_again, found, not_found = run(calls)
    assert first.structured_content == {
        "refund_id": "R-1", "order_id": "9527", "amount": 9.0, "currency": "EUR", "status": "booked",
    }
    assert again.structured_content == first.structured_content
    assert unkeyed.structured_content["refund_id"] == "R-2"
    assert by_header.structured_content["refund_id"] == "R-3"
    assert by_header_again.structured_content["refund_id"] == "R-3"
    assert found.structured_content == {"applied": True, "result": first.structured_content}
    assert not_found.structured_content == {"applied": False}

    state = server.state()
    assert set(state["bookings"]) == {"k-meta", "k-header"}
    assert [booking["refund_id"] for booking in state["unkeyed_bookings"]] == ["R-2"]
    refunds = server.calls(tool="refund")
    assert [(c["meta_key"], c["header_key"]) for c in refunds] == [
        ("k-meta", None), ("k-meta", None), (None, None), (None, "k-header"), (None, "k-header"),
    ]
    assert refunds[0]["arguments"] == REFUND_ARGS
    assert server.calls(tool="send_newsletter") == []


# ------------------------------------------------------------------------------------------------
# auth


@pytest.mark.parametrize("mcp_payments_server", [TOKEN], indirect=True)
def test_the_bearer_token_is_required_recorded_as_authorized_and_never_stored(mcp_payments_server):
    server = mcp_payments_server
    assert server.token == TOKEN

    raw = httpx2.post(server.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "refund", "arguments": REFUND_ARGS}})
    assert raw.status_code == 401
    assert raw.headers["www-authenticate"].startswith("Bearer")

    async def without_token():
        async with client(server, token=False) as c:
            await c.list_tools()

    with pytest.raises(BaseException) as refused:  # noqa: PT011 - the group is unwrapped below
        run(without_token)
    assert any(isinstance(e, MCPError) for e in leaves(refused.value)), refused.value

    async def with_token():
        async with client(server) as c:
            return await c.call_tool("lookup_order", {"order_id": "9528"})

    assert run(with_token).structured_content["customer"] == "bob"

    calls = server.calls()
    assert [(c["tool"], c["authorized"]) for c in calls] == [("refund", False), ("lookup_order", True)]
    assert server.bookings() == {}
    assert TOKEN not in json.dumps(server.state())


# ------------------------------------------------------------------------------------------------
# fault modes


async def refund_outcome(server: McpPaymentsServer, key: str, read_timeout: float | None = None) -> Any:
    """The refund's result, or the exception the call raised inside the client block."""
    async with client(server) as c:
        try:
            return await c.call_tool("refund", REFUND_ARGS, read_timeout_seconds=read_timeout, meta={KEY: key})
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            return exc


def test_hang_after_booking_times_the_client_out_and_the_booking_exists(mcp_payments_server):
    server = mcp_payments_server
    server.set_mode("hang_after_booking", seconds=10)
    outcome = run(lambda: refund_outcome(server, "k-hang", read_timeout=1.0))
    assert isinstance(outcome, MCPError), outcome
    assert "timed out" in outcome.error.message
    assert server.bookings()["k-hang"]["status"] == "booked"


def test_slow_books_only_after_the_delay(mcp_payments_server):
    server = mcp_payments_server
    server.set_mode("slow", seconds=1.5)

    async def scenario():
        async with anyio.create_task_group() as tg:
            outcome: dict[str, Any] = {}

            async def call():
                outcome["result"] = await refund_outcome(server, "k-slow")

            tg.start_soon(call)
            await anyio.sleep(0.7)
            outcome["early"] = await anyio.to_thread.run_sync(server.bookings)
        return outcome

    outcome = run(scenario)
    assert outcome["early"] == {}
    assert outcome["result"].structured_content["refund_id"] == "R-1"
    assert list(server.bookings()) == ["k-slow"]


def test_is_error_books_nothing_and_returns_an_error_result(mcp_payments_server):
    server = mcp_payments_server
    server.set_mode("is_error")
    outcome = run(lambda: refund_outcome(server, "k-err"))
    assert outcome.is_error
    assert outcome.content[0].text == "insufficient funds on the merchant account"
    assert server.bookings() == {}
    assert server.calls(tool="refund")[0]["meta_key"] == "k-err"


def test_jsonrpc_error_raises_the_sdk_error_and_books_nothing(mcp_payments_server):
    server = mcp_payments_server
    server.set_mode("jsonrpc_error")
    outcome = run(lambda: refund_outcome(server, "k-rpc"))
    assert isinstance(outcome, MCPError), outcome
    assert outcome.error.code == -32603
    assert outcome.error.message == "refund service unavailable"
    assert server.bookings() == {}


def test_invalid_content_books_and_fails_client_validation(mcp_payments_server):
    server = mcp_payments_server
    server.set_mode("invalid_content")
    outcome = run(lambda: refund_outcome(server, "k-bad"))
    assert isinstance(outcome, ValidationError), outcome
    assert "content" in str(outcome)
    assert server.bookings()["k-bad"]["refund_id"] == "R-1"


def test_drop_after_booking_is_a_transport_error_and_the_booking_exists(mcp_payments_server):
    server = mcp_payments_server
    server.set_mode("drop_after_booking")

    async def call():
        async with client(server) as c:
            await c.call_tool("refund", REFUND_ARGS, meta={KEY: "k-drop"})

    # The dropped POST crashes the transport's task group: call_tool is cancelled inside the block and
    # the httpx2 error surfaces, in an exception group, when the block is left.
    with pytest.raises(BaseExceptionGroup) as dropped:
        run(call)
    assert any(isinstance(e, httpx2.RemoteProtocolError) for e in leaves(dropped.value)), dropped.value
    assert server.bookings()["k-drop"]["status"] == "booked"

    server.set_mode("normal")
    again = run(lambda: refund_outcome(server, "k-drop"))
    assert again.structured_content["refund_id"] == "R-1"
    assert len(server.calls(tool="refund")) == 2


def test_modes_and_variants_are_validated_and_reset(mcp_payments_server):
    server = mcp_payments_server
    server.set_mode("slow", seconds=2)
    server.set_variant("v2")
    assert (server.state()["mode"], server.state()["seconds"], server.state()["variant"]) == ("slow", 2, "v2")
    with pytest.raises(Exception, match="400"):
        server.set_mode("explode")
    server.reset()
    state = server.state()
    assert (state["mode"], state["variant"], state["bookings"], state["calls"]) == ("normal", "v1", {}, [])


# ------------------------------------------------------------------------------------------------
# stdio


def test_stdio_transport_lists_tools_and_looks_up_an_order():
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "tests.support.mcp_payments", "--transport", "stdio"], cwd=str(ROOT)
    )

    async def session():
        async with Client(params) as c:
            tools = tools_by_name(await c.list_tools())
            return tools, await c.call_tool("lookup_order", {"order_id": "9527"})

    tools, found = run(session)
    assert set(tools) == {"lookup_order", "refund", "find_refund", "close_account", "send_newsletter"}
    assert found.structured_content["customer"] == "alice"
