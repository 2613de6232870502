"""SPEC §12, the refund end to end: the scripted model, real workers, the sweeper and the web
server; the operator approves in the admin over real HTTP; the payment gateway books the refund
and then times out; reconciliation finds it by key; the run completes; one refund exists."""

import pytest

from approvals_app.models import ApprovalStatus, AuditEntry
from runs_app.models import Run, RunEvent, RunStatus
from sessions_app.models import MessageRole
from tests.e2e.conftest import AdminOverHttp, refund_waiting_for_approval, run_finished
from tests.support.processes import wait_for
from demo.selectors import sim_refund_count
from demo.services import sim_fault_set
from tools_app.models import Resolution, ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# (stage, run status, phase, wait reason, {tool: status}) — SPEC §12's table; stage 1's run
# exists before any tool, stage 9 is the end.
STAGES = [
    (1, "queued", "waiting_worker", "", {}),
    (2, "running", "preparing_context", "", {}),
    (3, "running", "executing_tools", "", {"query_order": "running"}),
    (4, "running", "calling_model", "", {"query_order": "succeeded"}),
    (5, "waiting", "", "approval", {"execute_refund": "pending"}),
    (6, "running", "executing_tools", "", {"execute_refund": "running"}),
    (7, "waiting", "", "reconciliation", {"execute_refund": "unknown"}),
    (8, "running", "preparing_context", "", {"execute_refund": "succeeded"}),
    (9, "completed", "", "", {}),
]


def replay(run_id) -> list[tuple]:
    """The run as the event log tells it: after each lifecycle event, the run's status, phase
    and wait reason and every tool call's latest status."""
    run, tools, states = ("", "", ""), {}, []
    for event in RunEvent.objects.filter(run_id=run_id).order_by("seq"):
        if event.type == "run_status":
            run = (event.payload["status"], event.payload.get("phase", ""), event.payload.get("wait_reason", ""))
        elif event.type == "tool_call":
            tools = {**tools, event.payload["tool"]: event.payload["status"]}
        else:
            continue
        states.append((event.seq, *run, tools))
    return states


def stages_in_order(states: list[tuple]) -> list[int]:
    """The seq at which each SPEC §12 stage is first seen, each after the one before."""
    seen, position = [], 0
    for stage, status, phase, wait_reason, tools in STAGES:
        for index in range(position, len(states)):
            seq, *run, current_tools = states[index]
            if run == [status, phase, wait_reason] and all(current_tools.get(t) == s for t, s in tools.items()):
                seen.append(seq)
                position = index + 1
                break
        else:
            raise AssertionError(
                f"stage {stage} ({status}/{phase or wait_reason}, {tools}) not found after seq "
                f"{seen[-1] if seen else 0}; the log replays as:\n" + "\n".join(map(str, states))
            )
    return seen


def test_refund_is_approved_in_the_admin_times_out_is_reconciled_and_booked_once(procs, demo_world, desk_operator):
    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    run, approval = refund_waiting_for_approval()
    refund = ToolCall.objects.get(run=run, tool_name="execute_refund")
    assert refund.status == ToolCallStatus.PENDING and refund.idempotency_key
    assert sim_refund_count(order_id="9527") == 0

    # The gateway will book the refund and answer after 3 s; the tool gives up after 2 s.
    sim_fault_set(target="refund", mode="timeout_after_booking", delay_seconds=3.0, count=1)
    with AdminOverHttp(procs.base_url) as admin:
        admin.login(desk_operator.username)
        queue = admin.client.get("/admin/approvals_app/approval/")
        assert f"/admin/approvals_app/approval/{approval.pk}/approve/" in queue.text
        response = admin.submit(f"/admin/approvals_app/approval/{approval.pk}/approve/", {"note": "order 9527 checked"})
        assert response.url.path == "/admin/approvals_app/approval/"
        assert "Approved: execute_refund" in response.text

    wait_for(lambda: run_finished(run.pk), timeout=90, message="the run to finish after reconciliation")
    stored = Run.objects.get(pk=run.pk)
    assert stored.status == RunStatus.COMPLETED, (stored.error_code, stored.error_detail)

    # The nine stages, in order, from the persisted event log.
    stages_in_order(replay(run.pk))

    # Decided once, by the operator, audited.
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == desk_operator
    assert AuditEntry.objects.filter(object_id=str(approval.pk), action="approve", actor=desk_operator).count() == 1
    # Unknown, never retried, and resolved by the automatic lookup by key — not by a person.
    refund.refresh_from_db()
    assert refund.status == ToolCallStatus.SUCCEEDED and refund.attempts == 1
    assert refund.resolution == Resolution.APPLIED and refund.resolved_by is None
    assert refund.idempotency_key in refund.evidence
    assert RunEvent.objects.filter(run=run, type="tool_call", payload__tool="execute_refund", payload__status="unknown").exists()
    # Exactly one refund downstream, and it is the one the run reports.
    assert sim_refund_count(order_id="9527") == 1
    answer = stored.messages.filter(role=MessageRole.ASSISTANT).order_by("-seq").first()
    assert "refund" in answer.content.lower() and refund.result["refund_id"] in answer.content
    assert not stored.lease_owner
