"""The barrier in front of MCP tools, one run at a time in this process (the guarantees about processes
are tests/mcp/test_mcp_tools_workers.py): what each protocol failure leaves behind, reads retried and
writes never, the freeze switch, cumulative limits and business keys across runs applying to MCP
writes as to native ones, stdio servers only where the deployment allows them, and definitions that
name what does not exist refused by field (docs/EXTENDING.md, "MCP servers")."""

import asyncio
import sys
import uuid

import pytest
from django.test import override_settings

from agents.definitions import AgentDefinitionInvalid
from agents.models import AgentVersion
from agents.selectors import agent_version_get, mcp_tools_forget, version_mcp_tools
from approvals_app.models import Approval
from config.errors import WardenError
from engine.actions.freezes import freeze_set
from engine.actions.mcp_servers import McpServerInvalid, mcp_server_save
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from engine.loop import run_drive
from runs_app.models import Run, RunEvent, RunStatus, WaitReason
from tests.support.agents import define
from tests.support.factories import UserFactory
from tests.support.mcp_server import McpPaymentsServer
from tools_app.models import McpServer, ToolCall, ToolCallStatus
from tools_app.registry import tool_get

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "barrier-" + uuid.uuid4().hex
REFUND = {"name": "refund", "arguments": {"order_id": "9527", "amount": 9.0, "currency": "EUR"}}
LOOKUP = {"name": "lookup_order", "arguments": {"order_id": "9527"}}


@pytest.fixture(scope="module")
def payments():
    with McpPaymentsServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def admin_user(db, payments):
    payments.reset()
    return UserFactory(username=f"admin-{uuid.uuid4().hex[:6]}", is_staff=True, is_superuser=True)


def _server(url, admin_user, **fields):
    return mcp_server_save(acting_user=admin_user, fields={"name": "payments", "url": url, "timeout_seconds": 5, **fields},
                           credential={"Authorization": f"Bearer {TOKEN}"})


def _agent(admin_user, turns, *, options=None, rules=None, limits=None, tools=("lookup_order", "refund")):
    slug = f"mcp-{uuid.uuid4().hex[:8]}"
    return define({
        "name": slug, "slug": slug, "instructions": "Refund.", "provider": "scripted", "tools": [],
        "provider_options": {"delay": 0, "turns": turns},
        "mcp_servers": {"payments": {"tools": list(tools), "options": options or {}}},
        "approval_rules": rules if rules is not None else {"refund": [{"when": "amount <= 20", "approval": "none"}]},
        "limits": limits or {},
    }, by=admin_user)


def _run(version, customer=None, text="Refund order 9527"):
    customer = customer or UserFactory()
    session = session_open(owner=customer, title="barrier", agent=version.agent)
    run = message_post(session=session, content=text, acting_user=customer).run
    run_drive(run_id=str(run.id))
    return Run.objects.get(pk=run.pk)


@pytest.mark.parametrize("mode, status, code, words, run_state", [
    ("is_error", ToolCallStatus.FAILED, "mcp_tool_error", "insufficient funds on the merchant account", ("completed", "")),
    ("jsonrpc_error", ToolCallStatus.UNKNOWN, "outcome_unknown", "refund service unavailable (JSON-RPC error -32603)",
     ("waiting", WaitReason.RECONCILIATION)),
    ("invalid_content", ToolCallStatus.UNKNOWN, "outcome_unknown", "not valid MCP content", ("waiting", WaitReason.RECONCILIATION)),
    ("drop_after_booking", ToolCallStatus.UNKNOWN, "outcome_unknown", "failed while refund was in flight",
     ("waiting", WaitReason.RECONCILIATION)),
])
def test_each_protocol_failure_of_a_write_leaves_a_defined_state_and_is_sent_once(payments, admin_user, mode, status, code,
                                                                                   words, run_state):
    _server(payments.url, admin_user)
    payments.set_mode(mode)
    run = _run(_agent(admin_user, [{"calls": [REFUND]}, {"text": "Done."}]))
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.error_code) == (status, code)
    assert words in call.error_detail and "MCP server payments" in call.error_detail
    assert (run.status, run.wait_reason) == run_state
    assert len(payments.calls("refund")) == 1  # a write is never sent again


def test_a_version_cannot_be_saved_while_its_server_cannot_list_its_tools(admin_user):
    _server("http://127.0.0.1:9/mcp", admin_user)  # nothing listens there
    with pytest.raises(AgentDefinitionInvalid) as refused:
        _agent(admin_user, [])
    assert "could not list the tools of MCP server payments" in refused.value.errors["mcp_servers.payments"]


def test_fields_the_servers_schema_does_not_name_are_dropped_before_sending(payments, admin_user):
    _server(payments.url, admin_user)
    asked = {"name": "refund", "arguments": {**REFUND["arguments"], "approved_by": "admin", "override_limits": True}}
    run = _run(_agent(admin_user, [{"calls": [asked]}, {"text": "Done."}]))
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCallStatus.SUCCEEDED and call.arguments == REFUND["arguments"]
    (sent,) = payments.calls("refund")
    assert sent["arguments"] == REFUND["arguments"]


@pytest.mark.parametrize("fault", ["truncated_args", "invalid_json", "schema_invalid"])
def test_a_truncated_or_invalid_call_of_an_mcp_tool_is_never_sent(payments, admin_user, fault):
    _server(payments.url, admin_user)
    version = _agent(admin_user, [{"calls": [REFUND]}, {"text": "Done."}])
    customer = UserFactory()
    session = session_open(owner=customer, title="faults", agent=version.agent)
    run = message_post(session=session, content="Refund 9527", acting_user=customer,
                       provider_options={"delay": 0, "faults": [fault]}).run
    run_drive(run_id=str(run.id))
    (discarded,) = RunEvent.objects.filter(run=run, type="step_discarded")
    assert "refund" in discarded.payload["reason"] or "length" in discarded.payload["reason"] \
        or "truncated" in discarded.payload["reason"], discarded.payload
    # The model was asked again (its next turn answers in words): the refund was never made or sent.
    assert not ToolCall.objects.filter(run=run).exists() and payments.calls() == []


def test_reads_are_retried_with_backoff_and_writes_never_when_the_server_goes_away(payments, admin_user):
    server = _server(payments.url, admin_user)
    version = _agent(admin_user, [{"calls": [LOOKUP]}, {"calls": [REFUND]}, {"text": "Done."}],
                     options={"lookup_order": {"max_attempts": 3}})
    server.url = "http://127.0.0.1:9/mcp"  # the server moves away after the version was saved
    server.save(update_fields=["url"])
    run = _run(version)
    read, write = ToolCall.objects.filter(run=run).order_by("step__index", "index")
    assert (read.status, read.error_code, read.attempts) == (ToolCallStatus.FAILED, "mcp_unavailable", 3)
    assert (write.status, write.error_code, write.attempts) == (ToolCallStatus.FAILED, "mcp_unavailable", 1)
    assert "nothing was sent" in write.error_detail
    assert run.status == RunStatus.COMPLETED


def test_a_refused_credential_fails_reads_and_writes_at_once_saying_so(payments, admin_user):
    server = _server(payments.url, admin_user)
    version = _agent(admin_user, [{"calls": [LOOKUP]}, {"calls": [REFUND]}, {"text": "Done."}])
    mcp_server_save(acting_user=admin_user, server=server, fields={}, credential={"Authorization": "Bearer rotated-away"})
    run = _run(version)
    read, write = ToolCall.objects.filter(run=run).order_by("step__index", "index")
    assert (read.status, read.error_code, read.attempts) == (ToolCallStatus.FAILED, "mcp_unauthorized", 1)
    assert (write.status, write.error_code) == (ToolCallStatus.FAILED, "mcp_unauthorized")
    assert "refused Warden's credential (HTTP 401)" in write.error_detail
    assert not any(c["authorized"] for c in payments.calls())  # the server did nothing for anyone


def test_a_freeze_on_an_mcp_tool_holds_its_write_before_anything_is_sent(payments, admin_user):
    _server(payments.url, admin_user)
    version = _agent(admin_user, [{"calls": [REFUND]}, {"text": "Done."}])
    freeze_set(scope="tool", target="refund", reason="INC-42 payments outage", acting_user=admin_user)
    run = _run(version)
    assert (run.status, run.wait_reason) == ("waiting", WaitReason.FROZEN)
    assert payments.calls("refund") == []


def test_a_limit_on_an_mcp_tools_amounts_asks_an_operator_once_the_customer_is_over_it(payments, admin_user):
    _server(payments.url, admin_user)
    version = _agent(admin_user, [{"calls": [REFUND]}, {"text": "Done."}],
                     options={"refund": {"amount": "amount", "currency_argument": "currency"}},
                     limits={"refund": [{"window": "24h", "per": "customer", "max_amount": "15.00", "currency": "EUR",
                                        "over": "operator"}]})
    customer = UserFactory()
    first = _run(version, customer)
    assert first.status == RunStatus.COMPLETED  # 9.00 EUR: within the limit, no approval
    payments.reset()
    second = _run(version, customer, text="And the same again")
    assert (second.status, second.wait_reason) == ("waiting", WaitReason.APPROVAL)  # 18.00 EUR in 24 h: over it
    assert Approval.objects.get(run=second).policy == "operator"
    assert payments.calls("refund") == []


def test_a_business_key_on_an_mcp_write_books_once_across_runs(payments, admin_user):
    _server(payments.url, admin_user)
    version = _agent(admin_user, [{"calls": [REFUND]}, {"text": "Done."}], options={"refund": {"business_key": "order_id"}})
    first, second = _run(version), _run(version)
    one, other = ToolCall.objects.get(run=first), ToolCall.objects.get(run=second)
    assert one.status == other.status == ToolCallStatus.SUCCEEDED
    assert other.reused_from_id == one.pk and other.result["already_done"] is True
    assert len(payments.calls("refund")) == 1 and list(payments.bookings()) == ["refund:9527"]


def test_a_stdio_server_only_where_the_deployment_allows_it(admin_user):
    command = [sys.executable, "-m", "tests.support.mcp_payments", "--transport", "stdio"]
    with pytest.raises(McpServerInvalid) as refused:
        mcp_server_save(acting_user=admin_user, fields={"name": "local", "transport": "stdio", "command": command})
    assert "WARDEN_MCP_STDIO" in refused.value.errors["transport"]
    with override_settings(WARDEN_MCP_STDIO=True):
        mcp_server_save(acting_user=admin_user, fields={"name": "local", "transport": "stdio", "command": command})
        slug = f"mcp-{uuid.uuid4().hex[:8]}"
        version = define({"name": slug, "slug": slug, "instructions": "Look.", "provider": "scripted", "tools": [],
                          "provider_options": {"delay": 0, "turns": [{"calls": [LOOKUP]}, {"text": "Paid."}]},
                          "mcp_servers": {"local": {"tools": ["lookup_order"]}}}, by=admin_user)
        run = _run(version)
        call = ToolCall.objects.get(run=run)
        assert (run.status, call.status, call.result["customer"]) == (RunStatus.COMPLETED, ToolCallStatus.SUCCEEDED, "alice")
    # Allowed no more: the version's stdio tool is refused, never started.
    run = _run(version)
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.error_code) == (ToolCallStatus.FAILED, "mcp_stdio_not_allowed")


@pytest.mark.parametrize("servers, field, words", [
    ({"nowhere": {"tools": ["refund"]}}, "mcp_servers.nowhere", "no MCP server 'nowhere'"),
    ({"payments": {"tools": ["refund", "wire_everything"]}}, "mcp_servers.payments.tools", "offers no tool 'wire_everything'"),
    ({"payments": {"tools": ["refund"], "options": {"refund": {"reconciler": "ask_nobody"}}}},
     "mcp_servers.payments.options.refund", "the reconciler 'ask_nobody'"),
    ({"payments": {"tools": ["refund"], "options": {"refund": {"amount": "sum"}}}},
     "mcp_servers.payments.options.refund", "'sum' is not one of refund's arguments"),
    ({"payments": {"tools": ["refund"], "options": {"refund": {"timeout": 0}}}},
     "mcp_servers.payments.options.refund", "timeout is a number of seconds"),
    ({"payments": {"tools": []}}, "mcp_servers.payments.tools", "at least one"),
])
def test_a_definition_naming_what_is_not_there_is_refused_by_field_and_nothing_saved(payments, admin_user, servers, field, words):
    _server(payments.url, admin_user)
    before = AgentVersion.objects.count()
    with pytest.raises(AgentDefinitionInvalid) as refused:
        define({"name": "Bad", "slug": f"bad-{uuid.uuid4().hex[:6]}", "instructions": "x", "provider": "scripted",
                "tools": [], "mcp_servers": servers}, by=admin_user)
    assert words in refused.value.errors[field], refused.value.errors
    assert AgentVersion.objects.count() == before


def test_rules_on_an_mcp_tool_name_its_arguments_and_a_read_takes_no_rules(payments, admin_user):
    _server(payments.url, admin_user)
    with pytest.raises(AgentDefinitionInvalid) as refused:
        _agent(admin_user, [], rules={"refund": [{"when": "total <= 20", "approval": "none"}],
                                      "lookup_order": [{"when": "always", "approval": "none"}]})
    errors = refused.value.errors
    assert "total" in errors["approval_rules.refund[0].when"]
    assert "read tool" in errors["approval_rules.lookup_order"]


@pytest.mark.parametrize("url", ["https://mcp.example.com/mcp?api_key=sk-live-123", "https://u:p@mcp.example.com/mcp",
                                 "ftp://mcp.example.com/mcp"])
def test_a_url_carrying_a_secret_or_not_http_is_refused_and_nothing_saved(admin_user, url):
    with pytest.raises(McpServerInvalid) as refused:
        mcp_server_save(acting_user=admin_user, fields={"name": "leaky", "url": url})
    assert "url" in refused.value.errors and "sk-live-123" not in str(refused.value)
    assert not McpServer.objects.filter(name="leaky").exists()


def test_an_mcp_tool_is_found_by_name_from_an_event_loop_too(payments, admin_user):
    """The console's consumer asks whether a streamed call's tool exists from its event loop, where
    Django refuses queries: the lookup reads in a thread of its own when it must read at all."""
    _server(payments.url, admin_user)
    version = _agent(admin_user, [])
    agent_version_get.cache_clear()
    version_mcp_tools.cache_clear()
    mcp_tools_forget()

    async def from_a_loop():
        return tool_get("refund"), tool_get("transfer_all_funds")

    refund, unknown = asyncio.run(from_a_loop())
    assert (refund.name, refund.effect, refund.extra["mcp_server"], unknown) == ("refund", "write", "payments", None)
    assert version.mcp_tools["refund"]["input_schema"] == refund.arguments.model_json_schema()


def test_only_those_who_may_define_servers_do(admin_user):
    clerk = UserFactory(is_staff=True)
    with pytest.raises(WardenError) as refused:
        mcp_server_save(acting_user=clerk, fields={"name": "payments", "url": "http://127.0.0.1:9/mcp"})
    assert refused.value.code == "not_permitted"
