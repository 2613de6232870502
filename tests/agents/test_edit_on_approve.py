"""Edit on approve (SPEC §18), through real worker processes and the real HTTP API, with the test
suite's own tool package (the ledger's credit, in EUR): an operator lowers a credit from 120.00 to
100.00 and another approves — 100.00 is booked once, and the model, the customer and the audit trail
see what happened; who edited a request is a party to it and may not decide it (four eyes); raising
it across a tier boundary needs the higher tier's quorum, and an edit voids the approvals given
before it; changing the tool, arguments the tool's schema refuses, an edit
without a reason, an edit by the customer or over a limit that refuses are refused, changing
nothing."""

import json

import pytest

from approvals_app.models import Approval, ApprovalDecision, ApprovalStatus, AuditEntry
from runs_app.events import RunEventType
from runs_app.models import RunEvent, RunStatus, WaitReason
from sessions_app.models import Message, MessageRole
from tests.support.agents import credit, credit_clerk, tool_modules_setting, wait_for_run
from tests.support.api import HttpApi, grant
from tests.support.example_tools.ledger import ledger_bookings
from tests.support.factories import UserFactory
from tools_app.models import ToolCall

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# Up to 10.00 nobody; over 150.00 two operators; in between one operator.
TIERED = {"ledger_credit": [{"when": "amount <= 10", "approval": "none"},
                            {"when": "amount > 150", "approval": "operator", "approvers": 2},
                            {"when": "amount > 10", "approval": "operator"}]}
# 400.00 a day per customer, then refused.
DAILY_400 = {"ledger_credit": [{"window": "24h", "per": "customer", "max_amount": "400.00", "over": "refuse"}]}


@pytest.fixture
def edit_world(procs, tmp_path, monkeypatch):
    monkeypatch.setenv("EXAMPLE_LEDGER_DIR", str(tmp_path / "ledger"))
    procs.base_env |= {"WARDEN_TOOL_MODULES": tool_modules_setting(), "EXAMPLE_LEDGER_DIR": str(tmp_path / "ledger")}
    procs.start_web(simulator=False)
    procs.start_workers(workers=1)
    procs.start_sweeper()
    admin = grant(UserFactory(username="edit-admin", is_staff=True), ("agents", "change_agent"))
    agent = credit_clerk("edit-clerk", turns=[{"calls": [credit(amount="120.00")]}, {"text": "Done."}], limits=DAILY_400)
    agent["approval_rules"] = TIERED
    assert HttpApi(procs.base_url, admin).post("/agents", agent).status_code == 201
    operators = [grant(UserFactory(username=name, is_staff=True), ("approvals_app", "decide_approval"))
                 for name in ("op-ana", "op-ben", "op-cid", "op-dan")]
    customer = UserFactory(username="edit-customer")
    return procs, [HttpApi(procs.base_url, op) for op in operators], HttpApi(procs.base_url, customer)


def _waiting_credit(procs, customer: HttpApi, reference: str) -> tuple[str, Approval]:
    session = customer.post("/sessions", {"title": reference, "agent": "edit-clerk"}).json()["id"]
    run = customer.post(f"/sessions/{session}/messages", {"content": reference}).json()["run"]["id"]
    wait_for_run(run, RunStatus.WAITING, WaitReason.APPROVAL)
    return run, Approval.objects.get(run_id=run)


def _edit(api: HttpApi, approval: Approval, arguments: dict, reason: str = "agreed with the customer", **more):
    return api.post(f"/approvals/{approval.pk}/edit", {"arguments": arguments, "reason": reason, **more})


def test_an_operator_lowers_a_credit_and_approves_it_books_the_edited_amount_once(edit_world):
    procs, (ana, ben, _, _), customer = edit_world
    run, approval = _waiting_credit(procs, customer, "E-1")
    asked = {"account": "acme", "amount": "120.00", "reference": "E-1"}
    assert ToolCall.objects.get(pk=approval.tool_call_id).arguments == asked

    edited = _edit(ana, approval, {"account": "acme", "amount": "100.00", "reference": "E-1"},
                   reason="goodwill capped at 100 (case 77)")
    assert edited.status_code == 200, edited.text
    shown = edited.json()
    assert shown["status"] == "pending" and shown["required_approvals"] == 1 and shown["policy"] == "operator"
    assert shown["tool_call"]["arguments"]["amount"] == "100.00" and shown["tool_call"]["money"] == "100.00 EUR"
    assert shown["tool_call"]["proposed_arguments"] == asked
    assert ledger_bookings() == []  # an edit is not a decision: the run still waits
    wait_for_run(run, RunStatus.WAITING, WaitReason.APPROVAL)

    # Four eyes: who edited it is a party to the write; another operator decides.
    own = ana.post(f"/approvals/{approval.pk}/decision", {"decision": "approve"})
    assert own.status_code == 403 and "you edited this request" in own.json()["message"], own.text
    assert ben.post(f"/approvals/{approval.pk}/decision", {"decision": "approve"}).status_code == 200
    wait_for_run(run, RunStatus.COMPLETED)
    (booking,) = ledger_bookings()
    assert booking["amount"] == "100.00" and booking["reference"] == "E-1"

    # The model is told what executed; the customer's view of the run shows it.
    tool_message = Message.objects.get(run_id=run, role=MessageRole.TOOL)
    told = json.loads(tool_message.content)
    assert told["executed_with"]["amount"] == "100.00" and told["asked"]["amount"] == "120.00"
    assert told["result"]["amount"] == "100.00"
    (call,) = [c for c in customer.get(f"/runs/{run}").json()["tool_calls"] if c["tool_name"] == "ledger_credit"]
    assert call["arguments"]["amount"] == "100.00" and call["status"] == "succeeded"
    edited_event = RunEvent.objects.get(run_id=run, type=RunEventType.APPROVAL_EDITED)
    assert edited_event.payload["arguments_before"] == asked and edited_event.payload["edited_by"] == "op-ana"
    customers_events = customer.get(f"/runs/{run}/events").json()["items"]
    (seen,) = [e for e in customers_events if e["type"] == RunEventType.APPROVAL_EDITED]
    assert seen["payload"]["reason"] == ""  # the operator's reason is the desk's
    last_card = [e for e in customers_events if e["type"] == "tool_call"][-1]["payload"]
    assert last_card["edited"].startswith("An operator changed this request before approving it: 120.00 EUR was asked")

    # The audit trail keeps both versions, with who and why.
    (entry,) = AuditEntry.objects.filter(action="edit")
    assert entry.actor.username == "op-ana" and entry.note == "goodwill capped at 100 (case 77)"
    assert entry.before["arguments"] == asked and entry.after["arguments"]["amount"] == "100.00"


def test_raising_a_credit_across_a_tier_needs_the_quorum_and_an_edit_voids_earlier_approvals(edit_world):
    procs, (ana, ben, cid, dan), customer = edit_world
    run, approval = _waiting_credit(procs, customer, "E-2")

    raised = _edit(ana, approval, {"account": "acme", "amount": "200.00", "reference": "E-2"}, reason="two invoices")
    assert raised.status_code == 200, raised.text
    assert raised.json()["required_approvals"] == 2 and raised.json()["rule"].startswith("ledger_credit[1]")
    assert ben.post(f"/approvals/{approval.pk}/decision", {"decision": "approve"}).status_code == 200
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING  # one of two

    # Cid changes it again: Ben's approval was of 200.00 and counts no more.
    again = _edit(cid, approval, {"account": "acme", "amount": "180.00", "reference": "E-2"}, reason="one invoice was paid")
    assert again.status_code == 200, again.text
    assert again.json()["approved_by"] == [] and again.json()["approvals_missing"] == 2
    assert ApprovalDecision.objects.get(approval=approval, decided_by__username="op-ben").voided_at is not None
    assert ben.post(f"/approvals/{approval.pk}/decision", {"decision": "approve"}).status_code == 200
    assert ledger_bookings() == []
    wait_for_run(run, RunStatus.WAITING, WaitReason.APPROVAL)
    # Both editors are parties to the write: neither completes the quorum.
    for editor in (ana, cid):
        assert editor.post(f"/approvals/{approval.pk}/decision", {"decision": "approve"}).status_code == 403
    assert dan.post(f"/approvals/{approval.pk}/decision", {"decision": "approve"}).status_code == 200
    wait_for_run(run, RunStatus.COMPLETED)
    (booking,) = ledger_bookings()
    assert booking["amount"] == "180.00"
    trail = AuditEntry.objects.filter(object_id=str(approval.pk)).order_by("id")
    assert [(e.action, e.actor.username) for e in trail] == [
        ("edit", "op-ana"), ("approve", "op-ben"), ("edit", "op-cid"), ("approve", "op-ben"), ("approve", "op-dan")]
    assert trail[2].before["approved_by"] == ["op-ben"] and trail[2].after["approved_by"] == []


def test_edits_the_run_time_refuses_change_nothing(edit_world):
    procs, (ana, *_), customer = edit_world
    run, approval = _waiting_credit(procs, customer, "E-3")
    call_before = ToolCall.objects.get(pk=approval.tool_call_id)
    same = {"account": "acme", "amount": "120.00", "reference": "E-3"}

    tool = _edit(ana, approval, same | {"amount": "100.00"}, tool="ledger_balance")
    assert tool.status_code == 409 and tool.json()["code"] == "tool_change_refused", tool.text
    negative = _edit(ana, approval, same | {"amount": "-5"})
    assert negative.status_code == 409 and negative.json()["code"] == "invalid_edit"
    assert "amount" in negative.json()["message"], negative.text
    missing = _edit(ana, approval, {"account": "acme", "amount": "100.00"})
    assert missing.status_code == 409 and "reference" in missing.json()["message"], missing.text
    unchanged = _edit(ana, approval, same)
    assert unchanged.status_code == 409 and "Nothing changed" in unchanged.json()["message"]
    # Malformed for any call (the schema says a reason is needed): 422; the rest fit another call: 409.
    no_reason = _edit(ana, approval, same | {"amount": "100.00"}, reason="")
    assert no_reason.status_code == 422, no_reason.text
    over_limit = _edit(ana, approval, same | {"amount": "450.00"})  # the day's 400.00 refuses
    assert over_limit.status_code == 409 and "limit" in over_limit.json()["message"], over_limit.text
    by_customer = _edit(customer, approval, same | {"amount": "100.00"})
    assert by_customer.status_code == 403, by_customer.text

    call_after = ToolCall.objects.get(pk=approval.tool_call_id)
    assert (call_after.arguments, call_after.proposed_arguments, call_after.idempotency_key) == (
        call_before.arguments, None, call_before.idempotency_key)
    assert Approval.objects.get(pk=approval.pk).digest == approval.digest
    assert not AuditEntry.objects.filter(action="edit").exists()
    assert not RunEvent.objects.filter(run_id=run, type=RunEventType.APPROVAL_EDITED).exists()
