"""docs/EXTENDING.md, "MCP servers": every snippet of the section is exercised. The agent definition
is saved against the reference payments server (tests/support/mcp_payments.py) over real HTTP; the
example server a payment team would write — the refund that honours Warden's idempotency key and its
reconciler — is this module's own code (the section's excerpts), called in process with the SDK's
client the way Warden calls it: the key in `_meta`, the reconciler asked by key."""

import json
from typing import Annotated

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field
from typing_extensions import NotRequired, TypedDict  # pydantic needs these on Python < 3.12

from agents.definitions import approval_requirement
from agents.selectors import version_mcp_tools
from engine.actions.mcp_servers import mcp_server_save
from tests.support.agents import define, extending_snippet
from tests.support.api import grant
from tests.support.mcp_server import McpPaymentsServer
from tools_app.mcp import IDEMPOTENCY_META_KEY as WARDENS_META_KEY, RECONCILER_ARGUMENT
from tools_app.models import ToolEffect
from tools_app.registry import ApprovalRequirement

TOKEN = "tok-extending-mcp"


# --- the example MCP server docs/EXTENDING.md shows (excerpted verbatim) ------------------------------

IDEMPOTENCY_META_KEY = "dev.warden/idempotency-key"

payments = MCPServer("payments")
# Stands in for your ledger's table of refunds, unique on the idempotency key. None: a key the
# reconciler answered "not applied" for, which can never book afterwards.
BOOKINGS: dict[str, dict | None] = {}


class Refund(TypedDict):
    refund_id: str
    order_id: str
    amount: float


def warden_key(ctx: Context) -> str | None:
    """The write's idempotency key: in the request's _meta and, over HTTP, the Idempotency-Key header."""
    meta = ctx.request_context.meta or {}
    return meta.get(IDEMPOTENCY_META_KEY) or (ctx.headers or {}).get("idempotency-key")


@payments.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True))
def refund(order_id: Annotated[str, Field(description="The order to refund, e.g. '9527'.")],
           amount: Annotated[float, Field(gt=0, description="In the order's currency, e.g. 9.0.")],
           ctx: Context) -> Refund:
    """Refund (part of) an order: one refund per idempotency key."""
    key = warden_key(ctx)
    if key is None:
        raise ToolError("refusing to move money without an idempotency key")  # isError: nothing booked
    # In a real ledger, one transaction: INSERT … ON CONFLICT (key) DO NOTHING, then the key's row.
    booked = BOOKINGS.setdefault(key, Refund(refund_id=f"R-{len(BOOKINGS) + 1}", order_id=order_id, amount=amount))
    if booked is None:
        raise ToolError("this key was reconciled as not applied; nothing was booked")
    return booked


class Found(TypedDict):
    applied: bool
    result: NotRequired[Refund]


@payments.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
def find_refund(idempotency_key: str) -> Found:
    """Whether a refund was booked under this key. "No" is final: the key is spent, so a request
    still on its way cannot book under it afterwards."""
    booked = BOOKINGS.setdefault(idempotency_key, None)
    return Found(applied=True, result=booked) if booked is not None else Found(applied=False)


# --- the tests ----------------------------------------------------------------------------------------

@pytest.fixture
def bookings():
    BOOKINGS.clear()
    yield BOOKINGS
    BOOKINGS.clear()


def call(tool: str, arguments: dict, *, key: str | None = None):
    """One call of the example server's tool, in process, as Warden sends it."""

    async def calling():
        async with Client(payments) as client:
            return await client.call_tool(tool, arguments, meta={WARDENS_META_KEY: key} if key else None)

    return anyio.run(calling)


@pytest.fixture
def payments_server(agent_admin):
    """The reference payments server, defined as the desk defines it: named "payments", its bearer
    token as the credential (a server listed without it answers 401, and the save is refused)."""
    with McpPaymentsServer(token=TOKEN) as server:
        mcp_server_save(acting_user=grant(agent_admin, ("tools_app", "change_mcpserver")),
                        fields={"name": "payments", "url": server.url}, credential={"Authorization": f"Bearer {TOKEN}"})
        yield server


def mcp_definition() -> dict:
    return json.loads(extending_snippet("request", "POST /api/v1/agents (mcp_servers)"))


def test_the_agent_definition_snapshots_the_chosen_mcp_tools_with_their_effects_and_rules(payments_server, agent_admin):
    definition = mcp_definition()
    version = define(definition, by=agent_admin)
    assert payments_server.calls() == []  # saving lists the tools; it calls none

    assert set(version.mcp_tools) == {"lookup_order", "refund"}
    assert version.mcp_tools["refund"]["options"]["reconciler"] == "find_refund"
    assert set(version.mcp_tools["refund"]["input_schema"]["properties"]) == {"order_id", "amount", "currency", "reason"}
    tools = version_mcp_tools(version.pk)
    assert tools["lookup_order"].effect == ToolEffect.READ and tools["lookup_order"].approval == ApprovalRequirement.NONE
    refund_tool = tools["refund"]
    assert refund_tool.effect == ToolEffect.WRITE and refund_tool.reconcile is not None
    assert refund_tool.business_key(refund_tool.arguments.model_validate(
        {"order_id": "9527", "amount": 9.0, "currency": "EUR"})) == "9527:9"

    def tier(amount: float) -> tuple[str, int]:
        match = approval_requirement(version=version, tool=refund_tool,
                                     arguments={"order_id": "9527", "amount": amount, "currency": "EUR"})
        return match.approval, match.approvers

    assert [tier(9.0), tier(150.0), tier(900.0)] == [
        (ApprovalRequirement.NONE, 1), (ApprovalRequirement.OPERATOR, 1), (ApprovalRequirement.OPERATOR, 2)]
    (limit,) = version.limits["refund"]
    assert limit.items() >= {"window": "24h", "per": "customer", "max_amount": "100.00", "currency": "EUR",
                             "over": "operator"}.items()


def test_the_api_takes_the_definition_as_shown(payments_server, agent_admin_api):
    created = agent_admin_api.post("/agents", mcp_definition())
    assert created.status_code == 201, created.content
    assert [(t["name"], t["server"], t["effect"]) for t in created.json()["version"]["mcp_tools"]] == [
        ("lookup_order", "payments", "read"), ("refund", "payments", "write")]


def test_the_example_refund_books_once_per_idempotency_key(bookings):
    first = call("refund", {"order_id": "9527", "amount": 9.0}, key="run-1:refund:abc")
    again = call("refund", {"order_id": "9527", "amount": 9.0}, key="run-1:refund:abc")
    assert not first.is_error and again.structured_content == first.structured_content
    assert first.structured_content == {"refund_id": "R-1", "order_id": "9527", "amount": 9.0}
    assert len(bookings) == 1

    other = call("refund", {"order_id": "9527", "amount": 9.0}, key="run-2:refund:def")
    assert other.structured_content["refund_id"] == "R-2" and len(bookings) == 2


def test_the_example_refund_refuses_without_a_key_and_books_nothing(bookings):
    refused = call("refund", {"order_id": "9527", "amount": 9.0})
    assert refused.is_error and "idempotency key" in refused.content[0].text
    assert bookings == {}


def test_the_example_reconciler_answers_by_key_and_a_spent_key_never_books(bookings):
    booked = call("refund", {"order_id": "9528", "amount": 25.0}, key="k-booked").structured_content
    assert call("find_refund", {RECONCILER_ARGUMENT: "k-booked"}).structured_content == {"applied": True, "result": booked}
    assert call("find_refund", {RECONCILER_ARGUMENT: "k-unknown"}).structured_content == {"applied": False}

    late = call("refund", {"order_id": "9528", "amount": 25.0}, key="k-unknown")
    assert late.is_error and [b for b in bookings.values() if b is not None] == [booked]
