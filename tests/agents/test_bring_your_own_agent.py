"""A deployment's own agent on Warden, through real worker processes and the real HTTP API: the
example tool package (tests/support/example_tools, outside the apps) registered only through
WARDEN_TOOL_MODULES, its agent defined over the API as docs/EXTENDING.md says. Its run uses its
tools; a second agent of the same deployment cannot call them; editing the agent while its run
waits for approval leaves that run its version, and the next run takes the new one."""

import copy

import pytest

from approvals_app.models import Approval
from agents.models import AgentVersion
from runs_app.models import Run, RunErrorCode, RunEvent, RunStatus, Step, StepKind, StepStatus, WaitReason
from tests.support.agents import extending_snippet, ledger_agent_definition, tool_modules_setting, wait_for_run
from tests.support.api import HttpApi
from tests.support.api import grant
from tests.support.factories import UserFactory
from tests.support.example_tools.ledger import ledger_bookings
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def _session_and_message(api: HttpApi, *, agent: str, content: str):
    session = api.post("/sessions", {"title": content[:40], "agent": agent})
    assert session.status_code == 201, session.text
    posted = api.post(f"/sessions/{session.json()['id']}/messages", {"content": content})
    assert posted.status_code == 201, posted.text
    return session.json()["id"], posted.json()["run"]["id"]


def test_a_deployments_own_tools_and_agent_run_through_real_workers(procs, tmp_path, monkeypatch):
    ledger = tmp_path / "ledger"
    monkeypatch.setenv("EXAMPLE_LEDGER_DIR", str(ledger))  # this process reads the same ledger as the workers
    procs.base_env |= {"WARDEN_TOOL_MODULES": f"{tool_modules_setting()},demo.tools",
                       "EXAMPLE_LEDGER_DIR": str(ledger)}
    procs.start_web(simulator=False)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    definer = grant(UserFactory(username="agent-admin", is_staff=True), ("agents", "change_agent"))
    operator = grant(UserFactory(username="ledger-operator", is_staff=True), ("approvals_app", "decide_approval"))
    customer = UserFactory(username="acme-customer")
    admin_api, operator_api, customer_api = (HttpApi(procs.base_url, user) for user in (definer, operator, customer))

    # The agent of docs/EXTENDING.md, defined over HTTP: the web server knows the package's tools.
    defined = admin_api.post("/agents", ledger_agent_definition())
    assert defined.status_code == 201, defined.text
    session_id, run_id = _session_and_message(customer_api, agent="ledger-clerk", content=extending_snippet(
        "request", "POST /api/v1/sessions/{id}/messages").split('"content": "')[1].split('"')[0])

    # 150.00 matches the agent's second rule: the run waits for an operator, and says why.
    wait_for_run(run_id, RunStatus.WAITING, WaitReason.APPROVAL)
    approval = Approval.objects.get(run_id=run_id)
    assert approval.rule.startswith("ledger_credit[1]: amount <= 1000") and "amount is 150.00" in approval.rule_reason
    assert ledger_bookings() == []

    # Meanwhile the agent is edited: credits need no approval at all now, new instructions.
    edited = copy.deepcopy(ledger_agent_definition())
    edited["instructions"] = "Version two: credit at once."
    edited["approval_rules"] = {"ledger_credit": [{"when": "always", "approval": "none"}]}
    edited["provider_options"]["turns"][1]["calls"][0]["arguments"]["reference"] = "INV-2"
    assert admin_api.put("/agents/ledger-clerk", edited).status_code == 200
    run = Run.objects.get(pk=run_id)
    assert run.agent_version.number == 1  # the waiting run keeps the version it started with

    decided = operator_api.post(f"/approvals/{approval.pk}/decision", {"decision": "approve", "note": "invoice checked"})
    assert decided.status_code == 200, decided.text
    wait_for_run(run_id, RunStatus.COMPLETED, "")
    calls = {c.tool_name: c for c in ToolCall.objects.filter(run_id=run_id)}
    assert set(calls) == {"ledger_balance", "ledger_credit"}
    assert all(c.status == ToolCallStatus.SUCCEEDED for c in calls.values())
    assert [(b["account"], b["amount"], b["reference"]) for b in ledger_bookings()] == [("acme", "150.00", "INV-1")]
    first_model_step = Step.objects.filter(run_id=run_id, kind=StepKind.MODEL).order_by("index").first()
    assert first_model_step.context_manifest["tools"] == ["ask_user", "ledger_balance", "ledger_credit"]
    detail = customer_api.get(f"/runs/{run_id}").json()
    assert detail["agent"]["slug"] == "ledger-clerk" and detail["agent"]["version"] == 1
    assert detail["agent"]["instructions"].startswith("You settle customers' invoices")

    # The next run of the session takes version 2: its rule lets the credit through unapproved.
    second = customer_api.post(f"/sessions/{session_id}/messages", {"content": "And invoice INV-2, 150.00"})
    assert second.status_code == 201, second.text
    second_id = second.json()["run"]["id"]
    wait_for_run(second_id, RunStatus.COMPLETED, "")
    assert Run.objects.get(pk=second_id).agent_version == AgentVersion.objects.get(agent__slug="ledger-clerk", number=2)
    assert not Approval.objects.filter(run_id=second_id).exists()
    started = RunEvent.objects.filter(run_id=second_id, type="tool_call", payload__tool="ledger_credit",
                                      payload__status="running").first()
    assert started.payload["approval_rule"] == "ledger_credit[0]: always → no approval"
    assert sorted(b["reference"] for b in ledger_bookings()) == ["INV-1", "INV-2"]

    # A second agent of the same deployment, without the ledger tools: its model is never shown
    # them, and when it asks for one anyway the call is refused before anything runs.
    other = {"name": "Weather desk", "instructions": "Answer weather questions.", "provider": "scripted", "tools": ["get_weather"],
             # Its model asks for the ledger's credit twice in a row: refused both times, the run fails.
             "provider_options": {"turns": 2 * [{"calls": [{"name": "ledger_credit", "arguments": {
                 "account": "acme", "amount": "9.00", "reference": "INV-3"}}]}]}}
    assert admin_api.post("/agents", other).status_code == 201
    _, intruder_id = _session_and_message(customer_api, agent="weather-desk", content="credit acme 9.00")
    wait_for_run(intruder_id, RunStatus.FAILED, "")
    intruder = Run.objects.get(pk=intruder_id)
    assert intruder.error_code == RunErrorCode.INVALID_OUTPUT
    assert not ToolCall.objects.filter(run_id=intruder_id).exists()
    discarded = Step.objects.filter(run_id=intruder_id, kind=StepKind.MODEL, status=StepStatus.DISCARDED)
    assert discarded.exists() and all("does not offer" in s.discard_reason for s in discarded)
    assert all(s.context_manifest["tools"] == ["ask_user", "get_weather"] for s in discarded)
    assert sorted(b["reference"] for b in ledger_bookings()) == ["INV-1", "INV-2"]
