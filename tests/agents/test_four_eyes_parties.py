"""Four eyes counts everyone who caused a write (SPEC §18; issue 27, finding 1), through real worker
processes, the real HTTP API and an OpenAI-compatible stub model speaking the wire protocol
(tests/support/fake_openai_server.py): alice's credit waits for an operator; she cancels it; an
operator who may cancel runs and decide approvals retries the run, the model asks for the credit
again, and that operator may not approve it — nor record its outcome — as a party to it; another
operator may. An operator who edited a request may not decide it either."""

import json
import sys
import urllib.request

import pytest

from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import RunStatus, WaitReason
from tests.support.agents import tool_modules_setting, wait_for_run
from tests.support.api import HttpApi, grant
from tests.support.example_tools.ledger import ledger_bookings
from tests.support.factories import UserFactory
from tests.support.processes import free_port

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

CREDIT = {"id": "call_credit", "name": "ledger_credit",
          "arguments": json.dumps({"account": "acme", "amount": "20.00", "reference": "R-1"})}


def _enqueue(port: int, **answer) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/_fake/enqueue", data=json.dumps(answer).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_who_retried_a_run_may_not_approve_the_write_it_asks_for_again(procs, tmp_path, monkeypatch):
    monkeypatch.setenv("EXAMPLE_LEDGER_DIR", str(tmp_path / "ledger"))
    port = free_port()
    procs.start("fake-openai", [sys.executable, "-m", "tests.support.fake_openai_server", "--port", str(port)])
    procs.base_env |= {"WARDEN_TOOL_MODULES": tool_modules_setting(), "EXAMPLE_LEDGER_DIR": str(tmp_path / "ledger"),
                       "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "test"}
    procs.start_web(simulator=False)
    procs.start_workers(workers=1)
    procs.start_sweeper()
    admin = grant(UserFactory(username="parties-admin", is_staff=True), ("agents", "change_agent"))
    assert HttpApi(procs.base_url, admin).post("/agents", {
        "name": "Stub clerk", "slug": "stub-clerk", "instructions": "Credit what the customer asks.",
        "provider": "openai", "model": "stub", "tools": ["ledger_balance", "ledger_credit"],
        "approval_rules": {"ledger_credit": [{"when": "amount <= 10", "approval": "none"},
                                             {"when": "amount > 10", "approval": "operator"}]},
    }).status_code == 201
    retrier = grant(UserFactory(username="op-retrier", is_staff=True), ("runs_app", "change_run"),
                    ("approvals_app", "decide_approval"), ("tools_app", "reconcile_toolcall"))
    other = grant(UserFactory(username="op-other", is_staff=True), ("approvals_app", "decide_approval"))
    alice = HttpApi(procs.base_url, UserFactory(username="parties-alice"))
    retrier_api, other_api = HttpApi(procs.base_url, retrier), HttpApi(procs.base_url, other)

    _enqueue(port, tool_calls=[CREDIT], finish="tool_calls")
    session = alice.post("/sessions", {"title": "credit", "agent": "stub-clerk"}).json()["id"]
    first = alice.post(f"/sessions/{session}/messages", {"content": "credit acme 20.00 for R-1"}).json()["run"]["id"]
    wait_for_run(first, RunStatus.WAITING, WaitReason.APPROVAL)
    assert alice.post(f"/runs/{first}/cancel", {"reason": "do NOT refund"}).status_code == 202
    wait_for_run(first, RunStatus.CANCELLED)

    # The operator retries alice's cancelled run; the model asks for the credit again.
    _enqueue(port, tool_calls=[CREDIT], finish="tool_calls")
    retried = retrier_api.post(f"/runs/{first}/retry", {"reason": "customer called back"})
    assert retried.status_code == 201 and retried.json()["id"] != first, retried.text
    retry = retried.json()["id"]
    wait_for_run(retry, RunStatus.WAITING, WaitReason.APPROVAL)
    approval = Approval.objects.get(run_id=retry)

    refused = retrier_api.post(f"/approvals/{approval.pk}/decision", {"decision": "approve"})
    assert refused.status_code == 403 and "you retried this run" in refused.json()["message"], refused.text
    queue = retrier_api.get("/approvals").json()["items"]
    assert str(approval.pk) not in {item["id"] for item in queue}  # not in the retrier's queue either
    assert retrier_api.get(f"/approvals/{approval.pk}").json()["can_decide"] is False
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING and ledger_bookings() == []

    # Another operator may; the credit books once.
    _enqueue(port, text=["Credited 20.00."], finish="stop")
    assert other_api.post(f"/approvals/{approval.pk}/decision", {"decision": "approve"}).status_code == 200
    wait_for_run(retry, RunStatus.COMPLETED)
    assert [b["amount"] for b in ledger_bookings()] == ["20.00"]
