"""Cancellation: requested is not done (SPEC §9), with real workers."""

import pytest

from approvals_app.models import Approval
from engine.actions.cancel import run_cancel_request
from runs_app.models import Run, RunErrorCode, RunEvent, RunStatus, Step, StepStatus
from sessions_app.models import MessageRole
from tests.support.chaos import approve_pending, post, seqs_gap_free
from tests.support.processes import wait_for
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def _status(run_id):
    return Run.objects.values_list("status", flat=True).get(pk=run_id)


def _seq(run_id, **filters):
    return RunEvent.objects.filter(run_id=run_id, **filters).order_by("seq").values_list("seq", flat=True).first()


def test_cancel_during_a_streaming_model_call_aborts_the_stream(procs, demo_world):
    from demo.model import HELP_TEXT

    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    run = post("hello there", provider_options={"delay": 0.25})
    wait_for(lambda: Step.objects.filter(run=run, status=StepStatus.RUNNING).exclude(streamed_text="").exists(),
             message="the answer to be streaming")
    run_cancel_request(run=run, acting_user=run.created_by, reason="changed my mind")
    assert _status(run.id) == RunStatus.RUNNING  # requested is not done
    wait_for(lambda: _status(run.id) == RunStatus.CANCELLED, message="the worker to stop the run")
    step = Step.objects.get(run=run, kind="model")
    assert step.status == StepStatus.DISCARDED
    assert len(step.streamed_text) < len(HELP_TEXT)  # cut short, not streamed to the end
    assert not Run.objects.get(pk=run.id).messages.filter(role=MessageRole.ASSISTANT).exists()
    assert _seq(run.id, type="cancel_requested") < _seq(run.id, type="run_status", payload__status="cancelled")
    assert seqs_gap_free(run.id)


def test_cancel_during_an_in_flight_refund_waits_for_the_write_and_lists_it(procs, demo_world, desk_operator):
    from demo.selectors import sim_refund_count
    from demo.services import sim_fault_set

    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    sim_fault_set(target="refund", mode="delay", delay_seconds=1.5, count=1)
    run = post("Check order 9527 and refund it if it's eligible")
    wait_for(lambda: Approval.objects.filter(run=run).exists(), message="the approval request")
    approve_pending(desk_operator)
    wait_for(lambda: ToolCall.objects.filter(run=run, tool_name="execute_refund", status=ToolCallStatus.RUNNING).exists(),
             message="the refund to be in flight")
    run_cancel_request(run=run, acting_user=run.created_by, reason="stop")
    wait_for(lambda: _status(run.id) == RunStatus.CANCELLED, message="the run to cancel after the write")
    refund = ToolCall.objects.get(run=run, tool_name="execute_refund")
    assert refund.status == ToolCallStatus.SUCCEEDED and sim_refund_count(order_id="9527") == 1
    cancelled = RunEvent.objects.get(run=run, type="run_status", payload__status="cancelled")
    assert [e["tool_call"] for e in cancelled.payload["applied_effects"]] == [str(refund.id)]
    assert _seq(run.id, type="cancel_requested") < _seq(run.id, type="tool_call", payload__status="succeeded", payload__tool="execute_refund") < cancelled.seq


def test_cancel_during_a_refund_that_times_out_reconciles_before_cancelling(procs, demo_world, desk_operator):
    from demo.selectors import sim_refund_count
    from demo.services import sim_fault_set

    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    procs.start_sweeper()
    sim_fault_set(target="refund", mode="timeout_after_booking", delay_seconds=3, count=1)
    run = post("Check order 9527 and refund it if it's eligible")
    wait_for(lambda: Approval.objects.filter(run=run).exists(), message="the approval request")
    approve_pending(desk_operator)
    wait_for(lambda: ToolCall.objects.filter(run=run, tool_name="execute_refund", status=ToolCallStatus.RUNNING).exists(),
             message="the refund to be in flight")
    run_cancel_request(run=run, acting_user=run.created_by, reason="stop")
    wait_for(lambda: _status(run.id) == RunStatus.CANCELLED, timeout=90, message="reconciliation, then the cancel")
    refund = ToolCall.objects.get(run=run, tool_name="execute_refund")
    assert (refund.status, refund.resolution) == (ToolCallStatus.SUCCEEDED, "applied")
    assert sim_refund_count(order_id="9527") == 1
    unknown = _seq(run.id, type="tool_call", payload__status="unknown")
    reconciled = _seq(run.id, type="tool_call", payload__status="succeeded", payload__tool="execute_refund")
    cancelled = _seq(run.id, type="run_status", payload__status="cancelled")
    assert unknown < reconciled < cancelled
    payload = RunEvent.objects.get(run=run, seq=cancelled).payload
    assert payload["applied_effects"][0]["tool_call"] == str(refund.id)


@pytest.mark.parametrize("ending", ["cancel", "deadline"])
def test_a_run_whose_worker_died_mid_refund_ends_only_after_the_refund_is_reconciled(procs, demo_world, desk_operator, ending):
    """The worker is SIGKILLed after the payment service booked the refund, before it recorded
    the result; then the run is cancelled, or passes its deadline. Neither may end the run
    with the write left `running` and its effect unlisted: the next worker recovers the write
    as `unknown`, it is reconciled (booked: applied), and only then does the run end."""
    from django.utils import timezone

    from demo.selectors import sim_refund_count

    procs.start_web(simulator=True)
    procs.start_workers("doomed", workers=1, env={"WARDEN_FAULT_POINTS": "after_downstream_call=die"})
    run = post("Check order 9527 and refund it if it's eligible")
    wait_for(lambda: Approval.objects.filter(run=run).exists(), message="the approval request")
    approve_pending(desk_operator)
    wait_for(lambda: sim_refund_count(order_id="9527") == 1, message="the refund to be booked")
    wait_for(lambda: Run.objects.filter(pk=run.id, status=RunStatus.RUNNING, lease_expires_at__lt=timezone.now()).exists(),
             message="the worker to die holding the lease (its heartbeat stops)")
    procs.stop("doomed")
    assert ToolCall.objects.get(run=run, tool_name="execute_refund").status == ToolCallStatus.RUNNING
    if ending == "cancel":
        run_cancel_request(run=run, acting_user=run.created_by, reason="stop")
        assert _status(run.id) == RunStatus.RUNNING  # its lease has not expired yet: requested, not done
    else:
        Run.objects.filter(pk=run.id).update(deadline=timezone.now())
    procs.start_workers("survivor", workers=1)
    procs.start_sweeper()
    final = RunStatus.CANCELLED if ending == "cancel" else RunStatus.FAILED
    wait_for(lambda: _status(run.id) == final, timeout=120, message=f"the run to end {final}")

    refund = ToolCall.objects.get(run=run, tool_name="execute_refund")
    assert (refund.status, refund.resolution) == (ToolCallStatus.SUCCEEDED, "applied")
    assert sim_refund_count(order_id="9527") == 1
    refund_seq = {status: _seq(run.id, type="tool_call", payload__tool="execute_refund", payload__status=status)
                  for status in ("running", "unknown", "succeeded")}
    assert refund_seq["running"] < refund_seq["unknown"] < refund_seq["succeeded"] < _seq(run.id, type="run_status", payload__status=final)
    if ending == "cancel":
        cancelled = RunEvent.objects.get(run=run, type="run_status", payload__status="cancelled")
        assert [e["tool_call"] for e in cancelled.payload["applied_effects"]] == [str(refund.id)]
    else:
        assert Run.objects.get(pk=run.id).error_code == RunErrorCode.DEADLINE
    assert seqs_gap_free(run.id)
