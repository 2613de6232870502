"""Guards that see the whole flow of money (SPEC §18), through real worker processes and the real
HTTP API, with the test suite's own tool package (the ledger's credit, amounts in EUR): a daily
limit per customer sends the call that would cross it to an operator, showing the day's total; 50
runs of one customer racing for it never book past it; a model turn asking for three credits gets
one, the others refused with the cap's reason."""

from decimal import Decimal

import pytest

from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import Run, RunStatus, WaitReason
from tests.support.agents import credit, credit_clerk, tool_modules_setting, wait_for_run
from tests.support.api import HttpApi, grant
from tests.support.example_tools.ledger import ledger_bookings
from tests.support.factories import UserFactory
from tests.support.processes import wait_for
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

DAILY_30 = {"ledger_credit": [{"window": "24h", "per": "customer", "max_amount": "30.00", "over": "operator"}]}


@pytest.fixture
def ledger_world(procs, tmp_path, monkeypatch):
    ledger = tmp_path / "ledger"
    monkeypatch.setenv("EXAMPLE_LEDGER_DIR", str(ledger))  # this process reads the workers' ledger
    procs.base_env |= {"WARDEN_TOOL_MODULES": tool_modules_setting(), "EXAMPLE_LEDGER_DIR": str(ledger)}
    procs.start_web(simulator=False)
    procs.start_sweeper()
    admin = grant(UserFactory(username="limits-admin", is_staff=True), ("agents", "change_agent"))
    return procs, HttpApi(procs.base_url, admin)


def _message(api: HttpApi, session_id: str, content: str) -> str:
    posted = api.post(f"/sessions/{session_id}/messages", {"content": content})
    assert posted.status_code == 201, posted.text
    return posted.json()["run"]["id"]


def _session(api: HttpApi, agent: str) -> str:
    created = api.post("/sessions", {"title": agent, "agent": agent})
    assert created.status_code == 201, created.text
    return created.json()["id"]


def test_a_daily_limit_sends_the_credit_that_would_cross_it_to_an_operator_with_the_days_total(ledger_world):
    procs, admin_api = ledger_world
    procs.start_workers(workers=2)
    assert admin_api.post("/agents", credit_clerk("daily-clerk", turns=[{"calls": [credit()]}, {"text": "Done."}],
                                                  limits=DAILY_30)).status_code == 201
    customer = HttpApi(procs.base_url, UserFactory(username="daily-customer"))
    session = _session(customer, "daily-clerk")
    runs = []
    for reference in ("C-1", "C-2", "C-3", "C-4"):
        runs.append(_message(customer, session, reference))
        wait_for(lambda: Run.objects.get(pk=runs[-1]).status in (RunStatus.COMPLETED, RunStatus.WAITING),
                 timeout=120, message=f"run {reference} to complete or wait")
    # 9 + 9 + 9 = 27.00 at once; a fourth 9.00 would make 36.00 of 30.00: an operator decides.
    assert [Run.objects.get(pk=r).status for r in runs] == [RunStatus.COMPLETED] * 3 + [RunStatus.WAITING]
    assert sorted(b["reference"] for b in ledger_bookings()) == ["C-1", "C-2", "C-3"]
    wait_for_run(runs[3], RunStatus.WAITING, WaitReason.APPROVAL)
    approval = Approval.objects.get(run_id=runs[3])
    assert approval.status == ApprovalStatus.PENDING and approval.policy == "operator"
    assert approval.rule == "ledger_credit: over a limit → an operator"
    assert "36.00 EUR of 30.00" in approval.rule_reason and "in 24h" in approval.rule_reason
    shown = customer.get(f"/runs/{runs[3]}").json()
    (waiting,) = [c for c in shown["tool_calls"] if c["tool_name"] == "ledger_credit"]
    assert waiting["status"] == ToolCallStatus.PENDING and waiting["idempotency_key"] == "ledger_credit:credit:acme:C-4"


def test_fifty_runs_of_one_customer_never_book_past_the_limit(ledger_world):
    procs, admin_api = ledger_world
    # Four workers race for the limit's last unit, each pausing between reading the day's total and
    # committing its call: without the limit's lock, several would read 18.00 and all pass.
    procs.start_workers("racing-workers", workers=4, env={"WARDEN_FAULT_POINTS": "after_limits_checked=pause:0.2"})
    assert admin_api.post("/agents", credit_clerk("racing-clerk", turns=[{"calls": [credit()]}, {"text": "Done."}],
                                                  limits=DAILY_30)).status_code == 201
    customer = HttpApi(procs.base_url, UserFactory(username="racing-customer"))
    runs = [_message(customer, _session(customer, "racing-clerk"), f"R-{n}") for n in range(50)]
    wait_for(lambda: Run.objects.filter(pk__in=runs, status__in=(RunStatus.COMPLETED, RunStatus.WAITING)).count() == 50,
             timeout=300, message="every run to complete or wait for an operator")
    credits = ToolCall.objects.filter(run_id__in=runs, tool_name="ledger_credit")
    unapproved = credits.filter(status=ToolCallStatus.SUCCEEDED, approval__isnull=True)
    assert unapproved.count() == 3
    assert sum(Decimal(b["amount"]) for b in ledger_bookings()) == Decimal("27.00") <= Decimal("30.00")
    assert credits.filter(status=ToolCallStatus.PENDING, approval__status=ApprovalStatus.PENDING).count() == 47
    assert Run.objects.filter(pk__in=runs, status=RunStatus.COMPLETED).count() == 3


def test_one_model_turn_asking_for_three_credits_gets_one_and_the_others_are_refused_with_the_caps_reason(ledger_world):
    procs, admin_api = ledger_world
    procs.start_workers(workers=2)
    three = {"calls": [credit("T-1"), credit("T-2"), credit("T-3")]}
    assert admin_api.post("/agents", credit_clerk("greedy-clerk", turns=[three, {"text": "Done."}])).status_code == 201
    customer = HttpApi(procs.base_url, UserFactory(username="greedy-customer"))
    run = _message(customer, _session(customer, "greedy-clerk"), "credit three")
    wait_for_run(run, RunStatus.COMPLETED)
    calls = {c["arguments"]["reference"]: c for c in customer.get(f"/runs/{run}").json()["tool_calls"]}
    assert calls["T-1"]["status"] == ToolCallStatus.SUCCEEDED
    for refused in ("T-2", "T-3"):
        assert (calls[refused]["status"], calls[refused]["error_code"]) == (ToolCallStatus.FAILED, "write_cap_turn")
        assert "a model turn may make 1 write" in calls[refused]["error_detail"]  # what the desk and the model read
        assert calls[refused]["message"].startswith("Only one such action")  # what the customer reads
        assert calls[refused]["idempotency_key"] is None  # never sent; asked for again, it is a new request
    assert [b["reference"] for b in ledger_bookings()] == ["T-1"]
