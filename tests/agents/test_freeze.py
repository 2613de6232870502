"""A freeze stops money movement at once (SPEC §18), through real worker processes and the real HTTP
API, with the test suite's own tool package (the ledger's credit): five runs about to credit wait
while the tool is frozen, nothing books; lifting the freeze books each once. A refusing freeze on a
customer fails their write, sending nothing. Setting and lifting are audited; a bad freeze is
refused naming the field, and nobody without the permission may set one."""

import pytest

from approvals_app.models import AuditEntry, Freeze
from runs_app.models import RunStatus, WaitReason
from tests.support.agents import credit, credit_clerk, tool_modules_setting, wait_for_run
from tests.support.api import HttpApi, grant
from tests.support.example_tools.ledger import ledger_bookings
from tests.support.factories import UserFactory
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_a_frozen_tool_books_nothing_until_the_freeze_is_lifted_then_each_credit_once(procs, tmp_path, monkeypatch):
    monkeypatch.setenv("EXAMPLE_LEDGER_DIR", str(tmp_path / "ledger"))
    procs.base_env |= {"WARDEN_TOOL_MODULES": tool_modules_setting(), "EXAMPLE_LEDGER_DIR": str(tmp_path / "ledger")}
    procs.start_web(simulator=False)
    procs.start_sweeper()
    admin = grant(UserFactory(username="freeze-admin", is_staff=True), ("agents", "change_agent"))
    on_call = grant(UserFactory(username="on-call", is_staff=True), ("approvals_app", "freeze_money"))
    customer = UserFactory(username="frozen-customer")
    admin_api, desk, customer_api = (HttpApi(procs.base_url, user) for user in (admin, on_call, customer))
    assert admin_api.post("/agents", credit_clerk("freeze-clerk", turns=[{"calls": [credit()]}, {"text": "Done."}])
                          ).status_code == 201

    # Refused: a bad freeze names its field; a customer may not freeze anything.
    bad = desk.post("/freezes", {"scope": "tool", "target": "ledger_balance", "reason": "incident"})
    assert bad.status_code == 422 and bad.json()["fields"][0]["field"] == "body.target", bad.text
    assert customer_api.post("/freezes", {"scope": "tool", "target": "ledger_credit", "reason": "x"}).status_code == 403
    assert not Freeze.objects.exists()

    frozen = desk.post("/freezes", {"scope": "tool", "target": "ledger_credit", "reason": "INC-42: bad prompt release"})
    assert frozen.status_code == 201, frozen.text
    assert desk.post("/freezes", {"scope": "tool", "target": "ledger_credit", "reason": "again"}).status_code == 409
    runs = []
    for n in range(5):
        session = customer_api.post("/sessions", {"title": f"credit {n}", "agent": "freeze-clerk"}).json()["id"]
        runs.append(customer_api.post(f"/sessions/{session}/messages", {"content": f"F-{n}"}).json()["run"]["id"])
    procs.start_workers(workers=2)
    for run in runs:
        wait_for_run(run, RunStatus.WAITING, WaitReason.FROZEN)
    assert ledger_bookings() == []
    shown = customer_api.get(f"/runs/{runs[0]}").json()
    assert shown["wait"]["reason"] == "frozen" and shown["wait"]["clock"] == "freeze"
    assert [f["target"] for f in desk.get("/freezes").json()] == ["ledger_credit"]

    lifted = desk.post(f"/freezes/{frozen.json()['id']}/lift", {"note": "INC-42 fixed"})
    assert lifted.status_code == 200 and lifted.json()["lifted_by"] == "on-call", lifted.text
    for run in runs:
        wait_for_run(run, RunStatus.COMPLETED)
    assert sorted(b["reference"] for b in ledger_bookings()) == [f"F-{n}" for n in range(5)]
    trail = AuditEntry.objects.filter(object_type="freeze").order_by("id")
    assert [(e.action, e.actor.username) for e in trail] == [("freeze", "on-call"), ("unfreeze", "on-call")]
    assert trail[0].note == "INC-42: bad prompt release" and trail[1].note == "INC-42 fixed"

    # A refusing freeze on the customer: their next credit fails, nothing is sent.
    assert desk.post("/freezes", {"scope": "customer", "target": "frozen-customer", "mode": "refuse",
                                  "reason": "account under review"}).status_code == 201
    session = customer_api.post("/sessions", {"title": "refused", "agent": "freeze-clerk"}).json()["id"]
    refused_run = customer_api.post(f"/sessions/{session}/messages", {"content": "F-9"}).json()["run"]["id"]
    wait_for_run(refused_run, RunStatus.COMPLETED)
    call = ToolCall.objects.get(run_id=refused_run, tool_name="ledger_credit")
    assert (call.status, call.error_code) == (ToolCallStatus.FAILED, "frozen")
    assert "F-9" not in [b["reference"] for b in ledger_bookings()]
