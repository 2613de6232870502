"""The demo agent's approval rules, each branch end to end through real workers and the real HTTP
surfaces (API and the admin desk): a small refund runs with no approval, a larger one waits for the
customer, a walk-through one for an operator, a big one for two distinct operators — and 50
concurrent decisions by 3 operators on a two-operator refund record exactly 2 approvals and book
it once, after the second."""

import threading

import pytest
from django.core.management import call_command

from approvals_app.models import Approval, ApprovalDecision, ApprovalPolicy, ApprovalStatus, AuditEntry
from runs_app.models import Run, RunEvent, RunStatus, WaitReason
from tests.support.agents import wait_for_run
from tests.support.api import HttpApi
from tests.support.api import grant
from tests.e2e.conftest import AdminOverHttp
from tests.support.factories import UserFactory
from demo.agent import DEMO_AGENT_SLUG
from demo.models import SimRefund
from demo.selectors import sim_refund_count

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

DECISIONS = 50


def _refund(api: HttpApi, order: str) -> str:
    session = api.post("/sessions", {"title": f"refund {order}", "agent": DEMO_AGENT_SLUG})
    assert session.status_code == 201, session.text
    posted = api.post(f"/sessions/{session.json()['id']}/messages", {"content": f"Check order {order} and refund it if it's eligible"})
    assert posted.status_code == 201, posted.text
    return posted.json()["run"]["id"]


def _operator(name: str):
    return grant(UserFactory(username=name, is_staff=True), ("approvals_app", "decide_approval"), ("approvals_app", "view_approval"),
                 ("runs_app", "view_run"))


def test_each_approval_branch_of_the_demo_agent_end_to_end(procs):
    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    call_command("demo_setup", verbosity=0)  # the demo accounts, world and agent, as `make run` has them
    # A customer of the deployment without a shop account: alice (the shop's u1) would be told u2's
    # orders do not exist (tests/demo/test_whose_orders.py), and these branches need u2's large ones.
    customer = UserFactory(username="branch-customer")
    operators = [_operator(f"op{n}") for n in (1, 2, 3)]
    customer_api = HttpApi(procs.base_url, customer)
    op_apis = [HttpApi(procs.base_url, op) for op in operators]
    runs = {order: _refund(customer_api, order) for order in ("9541", "9542", "9527", "9543", "9529")}

    # amount <= 5: no approval at all; the write says which rule let it through.
    wait_for_run(runs["9541"], RunStatus.COMPLETED)
    assert not Approval.objects.filter(run_id=runs["9541"]).exists() and sim_refund_count(order_id="9541") == 1
    started = RunEvent.objects.get(run_id=runs["9541"], type="tool_call", payload__tool="execute_refund", payload__status="running")
    assert started.payload["approval_rule"].startswith("execute_refund[0]: amount <= 5")

    # amount <= 10: the customer confirms it themselves; an operator may not.
    wait_for_run(runs["9542"], RunStatus.WAITING, WaitReason.APPROVAL)
    confirmation = Approval.objects.get(run_id=runs["9542"])
    assert confirmation.policy == ApprovalPolicy.USER and confirmation.rule.startswith("execute_refund[1]")
    assert op_apis[0].post(f"/approvals/{confirmation.pk}/decision", {"decision": "approve"}).status_code == 403
    assert customer_api.post(f"/approvals/{confirmation.pk}/decision", {"decision": "approve"}).status_code == 200
    wait_for_run(runs["9542"], RunStatus.COMPLETED)
    assert sim_refund_count(order_id="9542") == 1

    # amount <= 100: one operator, on the desk.
    wait_for_run(runs["9527"], RunStatus.WAITING, WaitReason.APPROVAL)
    single = Approval.objects.get(run_id=runs["9527"])
    assert (single.policy, single.required_approvals) == (ApprovalPolicy.OPERATOR, 1)
    with AdminOverHttp(procs.base_url) as desk:
        desk.login("op1")
        response = desk.submit(f"/admin/approvals_app/approval/{single.pk}/approve/", {"note": "fine"})
        assert "Approved: execute_refund" in response.text
    wait_for_run(runs["9527"], RunStatus.COMPLETED)
    assert sim_refund_count(order_id="9527") == 1

    # amount > 100: two distinct operators; the first approval books nothing, the desk says who is still needed.
    wait_for_run(runs["9543"], RunStatus.WAITING, WaitReason.APPROVAL)
    quorum = Approval.objects.get(run_id=runs["9543"])
    assert (quorum.required_approvals, quorum.rule.split(":")[0]) == (2, "execute_refund[3]")
    assert customer_api.post(f"/approvals/{quorum.pk}/decision", {"decision": "approve"}).status_code == 403
    first = op_apis[0].post(f"/approvals/{quorum.pk}/decision", {"decision": "approve", "note": "one"})
    assert first.status_code == 200 and first.json()["status"] == "pending" and first.json()["approved_by"] == ["op1"]
    assert op_apis[0].post(f"/approvals/{quorum.pk}/decision", {"decision": "approve"}).status_code == 409
    assert Run.objects.get(pk=runs["9543"]).wait_reason == WaitReason.APPROVAL and sim_refund_count(order_id="9543") == 0
    with AdminOverHttp(procs.base_url) as desk:
        desk.login("op2")
        page = desk.client.get(f"/admin/approvals_app/approval/{quorum.pk}/change/").text
        assert "1 of 2 approvals (by op1)" in page and "needs 1 more operator" in page
        desk.submit(f"/admin/approvals_app/approval/{quorum.pk}/approve/", {"note": "two"})
    wait_for_run(runs["9543"], RunStatus.COMPLETED)
    quorum.refresh_from_db()
    assert quorum.status == ApprovalStatus.APPROVED and quorum.decided_by == operators[1]
    assert list(quorum.decisions.values_list("decided_by__username", flat=True)) == ["op1", "op2"]
    assert AuditEntry.objects.filter(object_id=str(quorum.pk), action="approve").count() == 2
    assert sim_refund_count(order_id="9543") == 1

    # 50 decisions at once by three operators on another two-operator refund (9529, 120.00).
    wait_for_run(runs["9529"], RunStatus.WAITING, WaitReason.APPROVAL)
    storm = Approval.objects.get(run_id=runs["9529"])
    assert storm.required_approvals == 2
    barrier = threading.Barrier(DECISIONS)
    answers: list[int] = []

    def decide(n: int) -> None:
        api = op_apis[n % 3]
        barrier.wait()
        answers.append(api.post(f"/approvals/{storm.pk}/decision", {"decision": "approve", "note": f"click {n}"}).status_code)

    threads = [threading.Thread(target=decide, args=(n,)) for n in range(DECISIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(answers) == DECISIONS and answers.count(200) == 2 and set(answers) <= {200, 409, 503}, sorted(answers)
    wait_for_run(runs["9529"], RunStatus.COMPLETED)
    decisions = list(ApprovalDecision.objects.filter(approval=storm).order_by("decided_at"))
    assert len(decisions) == 2 and len({d.decided_by_id for d in decisions}) == 2
    assert Approval.objects.get(pk=storm.pk).status == ApprovalStatus.APPROVED
    refunds = list(SimRefund.objects.filter(order__order_id="9529"))
    assert len(refunds) == 1 and refunds[0].created_at >= decisions[1].decided_at  # nothing booked before the second
    assert RunEvent.objects.filter(run_id=runs["9529"], type="approval_progress").count() == 1
    assert RunEvent.objects.filter(run_id=runs["9529"], type="approval_decided").count() == 1
