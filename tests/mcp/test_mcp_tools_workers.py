"""MCP tools behind Warden's barrier, through real django-q2 workers, the sweeper and a real MCP server
built with the official SDK (tests/support/mcp_payments.py): the refund scenario end to end with the
idempotency key on the wire, a timeout after booking settled by the server's reconciler or by an
operator with evidence, destructive tools waiting for an operator, tools outside the agent's choice
and schema-invalid calls never sent, a kill -9 mid-write, and a run keeping its snapshot while the
server's tools change (docs/EXTENDING.md, "MCP servers")."""

import json
import signal
import uuid

import pytest
from django.urls import reverse

from approvals_app.models import Approval
from engine.actions.approvals import approval_decide
from engine.actions.mcp_servers import mcp_server_save
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from runs_app.models import Run, RunEvent, WaitReason
from tests.support.agents import define, run_state, wait_for_run
from tests.support.desk import csrf_client, csrf_token_of, messages_of, staff_user
from tests.support.factories import UserFactory
from tests.support.mcp_server import McpPaymentsServer
from tests.support.processes import LOG_DIR, wait_for
from tools_app.models import Resolution, ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

TOKEN = "mcp-secret-" + uuid.uuid4().hex
LOOKUP = {"name": "lookup_order", "arguments": {"order_id": "9527"}}
REFUND = {"name": "refund", "arguments": {"order_id": "9527", "amount": 9.0, "currency": "EUR", "reason": "late"}}
DONE = {"text": "Your refund of 9.00 EUR is booked."}


@pytest.fixture
def payments():
    with McpPaymentsServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def admin_user(db):
    return UserFactory(username="mcp-admin", is_staff=True, is_superuser=True)


def _server(payments, admin_user, *, timeout: float = 10.0):
    return mcp_server_save(acting_user=admin_user, fields={"name": "payments", "url": payments.url, "timeout_seconds": timeout},
                           credential={"Authorization": f"Bearer {TOKEN}"})


def _agent(admin_user, *, turns, rules=None, options=None, tools=("lookup_order", "refund")):
    slug = f"mcp-{uuid.uuid4().hex[:8]}"
    return define({
        "name": slug, "slug": slug, "instructions": "Refund what the customer asks.", "provider": "scripted",
        "tools": [], "provider_options": {"turns": turns},
        "mcp_servers": {"payments": {"tools": list(tools), "options": options if options is not None else {
            "refund": {"reconciler": "find_refund", "amount": "amount", "currency_argument": "currency",
                       "business_key": "order_id"}}}},
        "approval_rules": rules if rules is not None else {"refund": [{"when": "amount <= 20", "approval": "user"}]},
    }, by=admin_user)


def _ask(version, text="Please refund order 9527, it came late.", **kwargs):
    customer = UserFactory()
    session = session_open(owner=customer, title="mcp", agent=version.agent)
    return customer, message_post(session=session, content=text, acting_user=customer, **kwargs).run


def _refund_call(run) -> ToolCall:
    return ToolCall.objects.get(run=run, tool_name="refund")


def test_a_refund_on_an_mcp_server_reads_waits_for_approval_books_once_and_completes(procs, payments, admin_user):
    _server(payments, admin_user)
    version = _agent(admin_user, turns=[{"calls": [LOOKUP]}, {"calls": [REFUND]}, DONE])
    procs.start_workers(workers=2)
    customer, run = _ask(version)

    wait_for_run(run.id, "waiting", WaitReason.APPROVAL)
    call = _refund_call(run)
    assert call.status == ToolCallStatus.PENDING and call.idempotency_key == "refund:9527"
    assert payments.calls("refund") == []  # nothing sent before the approval
    (looked_up,) = payments.calls("lookup_order")
    assert looked_up["authorized"] and looked_up["meta_key"] is None  # a read carries no key
    approval = Approval.objects.get(tool_call=call)
    assert approval.policy == "user"  # the agent's rule on the MCP tool's own argument

    approval_decide(approval=approval, decision="approve", acting_user=customer)
    wait_for_run(run.id, "completed")
    call.refresh_from_db()
    assert call.status == ToolCallStatus.SUCCEEDED and call.result["refund_id"].startswith("R-")
    (sent,) = payments.calls("refund")
    # The key committed before the call is on the wire, in _meta and in the header, and the server
    # booked one refund under it.
    assert sent["meta_key"] == sent["header_key"] == call.idempotency_key and sent["authorized"]
    assert sent["arguments"] == REFUND["arguments"]
    assert list(payments.bookings()) == [call.idempotency_key]
    assert ToolCall.objects.get(run=run, tool_name="lookup_order").result["amount"] == "9.00"
    # The credential went to the server (it said authorized) and into none of the workers' log lines.
    log = (LOG_DIR / f"{procs.name}-workers.log").read_text()
    assert str(run.id) in log and TOKEN not in log


def test_a_timeout_after_booking_becomes_unknown_and_the_reconciler_finds_the_booking(procs, payments, admin_user):
    _server(payments, admin_user)
    version = _agent(admin_user, turns=[{"calls": [REFUND]}, DONE], rules={"refund": [{"when": "amount <= 20", "approval": "none"}]},
                     options={"refund": {"reconciler": "find_refund", "timeout": 2}})
    payments.set_mode("hang_after_booking", seconds=60)
    procs.start_workers(workers=1)
    procs.start_sweeper()
    _, run = _ask(version)

    wait_for_run(run.id, "completed", timeout=180)
    call = _refund_call(run)
    assert (call.status, call.resolution) == (ToolCallStatus.SUCCEEDED, Resolution.APPLIED)
    assert "find_refund" in call.evidence and call.idempotency_key in call.evidence
    assert call.result == payments.bookings()[call.idempotency_key]
    assert RunEvent.objects.filter(run=run, type="run_status", payload__wait_reason=WaitReason.RECONCILIATION).exists()
    assert len(payments.calls("refund")) == 1  # never sent again
    (asked,) = [c for c in payments.calls("find_refund")]
    assert asked["arguments"] == {"idempotency_key": call.idempotency_key}


def test_without_a_reconciler_an_unknown_mcp_write_waits_for_an_operator_who_decides_with_evidence(procs, payments, admin_user):
    _server(payments, admin_user)
    version = _agent(admin_user, turns=[{"calls": [REFUND]}, DONE], rules={"refund": [{"when": "amount <= 20", "approval": "none"}]},
                     options={"refund": {"timeout": 2}})
    payments.set_mode("hang_after_booking", seconds=60)
    procs.start_workers(workers=1)
    procs.start_sweeper()
    _, run = _ask(version)

    wait_for_run(run.id, "waiting", WaitReason.RECONCILIATION)
    call = wait_for(lambda: ToolCall.objects.filter(pk=_refund_call(run).pk, next_attempt_at__isnull=True,
                                                    status=ToolCallStatus.UNKNOWN).first(),
                    message="the sweeper to hand the call to a person")
    assert call.error_detail == "MCP server payments gave no answer to refund within 2 s"
    reconciler = staff_user("mcp-reconciler", "reconcile_toolcall")
    client = csrf_client(reconciler)
    queue = client.get(reverse("admin:tools_app_unknowntoolcall_changelist"))
    assert str(call.pk)[:8] in queue.content.decode()
    page = client.get(reverse("admin:tools_app_unknowntoolcall_resolve", args=[call.pk]))
    booked = payments.bookings()[call.idempotency_key]
    response = client.post(reverse("admin:tools_app_unknowntoolcall_resolve", args=[call.pk]), {
        "outcome": "applied", "evidence": f"payments console shows {booked['refund_id']} under the key",
        "result": json.dumps(booked), "csrfmiddlewaretoken": csrf_token_of(page),
    }, follow=True)
    assert any(m.startswith("Recorded: refund was applied") for m in messages_of(response)), messages_of(response)
    wait_for_run(run.id, "completed")
    call.refresh_from_db()
    assert (call.status, call.resolution, call.resolved_by) == (ToolCallStatus.SUCCEEDED, Resolution.APPLIED, reconciler)
    assert len(payments.calls("refund")) == 1


def test_destructive_unchosen_and_schema_invalid_mcp_calls(procs, payments, admin_user):
    """close_account is destructive and has no rule: an operator must approve. send_newsletter is on
    the server but not chosen: the step asking for it is discarded. A refund with arguments of the
    wrong types is discarded too. Neither of the last two ever reaches the server."""
    _server(payments, admin_user)
    turns = [{"calls": [{"name": "send_newsletter", "arguments": {"text": "Hello all"}}]},
             {"calls": [REFUND]},
             {"calls": [{"name": "close_account", "arguments": {"customer": "alice"}}]}, DONE]
    version = _agent(admin_user, turns=turns, tools=("lookup_order", "refund", "close_account"),
                     rules={"refund": [{"when": "amount <= 20", "approval": "none"}]}, options={})
    procs.start_workers(workers=1)
    procs.start_sweeper()  # it wakes the run after each discarded step's backoff
    _, run = _ask(version, provider_options={"faults": [None, "schema_invalid"]})

    wait_for(lambda: run_state(run.id) in (("waiting", WaitReason.APPROVAL), ("completed", ""), ("failed", "")),
             timeout=180, message="the run to stop")
    assert run_state(run.id) == ("waiting", WaitReason.APPROVAL), list(
        RunEvent.objects.filter(run=run).order_by("seq").values_list("type", "payload"))
    discarded = list(RunEvent.objects.filter(run=run, type="step_discarded").order_by("seq").values_list("payload", flat=True))
    assert discarded[0]["reason"] == "the model asked for unknown tool 'send_newsletter'"  # not one of its tools
    assert "refund" in discarded[1]["reason"] and "schema" in discarded[1]["reason"]
    call = ToolCall.objects.get(run=run)
    assert (call.tool_name, call.status) == ("close_account", ToolCallStatus.PENDING)
    assert Approval.objects.get(tool_call=call).policy == "operator"
    assert payments.calls() == []  # nothing was sent: not the unchosen tool, not the invalid call, not the unapproved one


def test_kill_9_while_an_mcp_write_is_in_flight_is_taken_over_and_never_sent_twice_without_its_key(procs, payments, admin_user):
    _server(payments, admin_user, timeout=60)
    version = _agent(admin_user, turns=[{"calls": [REFUND]}, DONE], rules={"refund": [{"when": "amount <= 20", "approval": "none"}]})
    payments.set_mode("hang_after_booking", seconds=120)
    procs.start_workers("doomed", workers=1)
    _, run = _ask(version)

    wait_for(lambda: payments.calls("refund"), timeout=180, message="the refund to reach the server")
    procs.signal("doomed", signal.SIGKILL)
    payments.set_mode("normal")
    procs.start_workers("survivor", workers=1)
    procs.start_sweeper()

    wait_for_run(run.id, "completed", timeout=180)
    call = _refund_call(run)
    assert (call.status, call.resolution) == (ToolCallStatus.SUCCEEDED, Resolution.APPLIED)
    assert RunEvent.objects.filter(run=run, type="tool_call", payload__recovered=True).exists()
    sent = payments.calls("refund")
    assert sent and {c["meta_key"] for c in sent} == {call.idempotency_key}  # any resend carries the same key
    assert list(payments.bookings()) == [call.idempotency_key] and not payments.state()["unkeyed_bookings"]


def test_a_run_waiting_for_approval_keeps_its_snapshot_when_the_servers_tools_change(procs, payments, admin_user):
    _server(payments, admin_user)
    version = _agent(admin_user, turns=[{"calls": [REFUND]}, {"calls": [LOOKUP]}, DONE])
    procs.start_workers(workers=1)
    customer, run = _ask(version)
    wait_for_run(run.id, "waiting", WaitReason.APPROVAL)

    # The server drops lookup_order and changes refund; a version saved now sees that ...
    payments.set_variant("v3")
    newer = _agent(admin_user, turns=[], tools=("refund",), options={})
    assert "lookup_order" not in newer.mcp_tools and "v3" in newer.mcp_tools["refund"]["description"]
    assert "note" in newer.mcp_tools["refund"]["input_schema"]["properties"]
    # ... while the waiting run keeps the tools its version saw.
    approval_decide(approval=Approval.objects.get(tool_call=_refund_call(run)), decision="approve", acting_user=customer)
    wait_for_run(run.id, "completed")
    assert Run.objects.get(pk=run.pk).agent_version_id == version.pk
    assert "note" not in version.mcp_tools["refund"]["input_schema"]["properties"]
    assert _refund_call(run).status == ToolCallStatus.SUCCEEDED
    # lookup_order was still offered to the run's model (its step was not discarded as unknown or
    # not offered); the server, which no longer has it, said so, in the call's outcome.
    assert not RunEvent.objects.filter(run=run, type="step_discarded").exists()
    looked_up = ToolCall.objects.get(run=run, tool_name="lookup_order")
    assert looked_up.status == ToolCallStatus.FAILED and "lookup_order" in looked_up.error_detail
    assert len(payments.bookings()) == 1
