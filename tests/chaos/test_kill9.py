"""kill -9 chaos (SPEC §10): many concurrent refund runs; workers SIGKILLed at each dangerous
named point on purpose, then at random moments, and restarted. Nothing is booked twice,
nothing is lost, every run comes to rest for a correct reason."""

import random
import signal
import time

import pytest

from runs_app.models import Run, RunEvent, RunStatus, WaitReason
from tests.support.chaos import approve_pending, post, refund_outcomes_are_honest, resting_correctly, seqs_gap_free
from tests.support.processes import wait_for
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

ORDERS = [str(n) for n in range(1001, 1011)]


def _refund(run) -> ToolCall:
    return ToolCall.objects.get(run=run, tool_name="execute_refund", reused_from__isnull=True)


def _approve(operator, runs) -> None:
    from approvals_app.models import Approval, ApprovalStatus
    from engine.actions.approvals import approval_decide

    for approval in Approval.objects.filter(run__in=runs, status=ApprovalStatus.PENDING):
        approval_decide(approval=approval, decision="approve", note="chaos", acting_user=operator)


def test_sigkill_at_named_points_and_at_random_books_every_refund_at_most_once(procs, demo_world, desk_operator):
    from demo.selectors import sim_refund_count

    procs.start_web(simulator=True)
    procs.start_sweeper()
    runs = [post(f"Check order {order} and refund it if it's eligible", provider_options={"delay": 0.03}) for order in ORDERS]
    procs.start_workers("plain", workers=2)
    wait_for(lambda: Run.objects.filter(pk__in=[r.id for r in runs], status=RunStatus.WAITING, wait_reason=WaitReason.APPROVAL).count() == len(runs),
             timeout=120, message="every run to wait for its approval")
    procs.stop("plain")

    # Windows 1 and 2 need the same cluster to go on after each death: one run per worker process
    # there (WARDEN_RUNS_PER_WORKER=1). A process driving many runs waits for tasks inside
    # django-q2's queue read, holding the queue's lock; killed there, it leaves its cluster's queue
    # locked for good (docs/OPERATIONS.md, "Workers") — the other clusters below carry on.
    one_at_a_time = {"WARDEN_RUNS_PER_WORKER": "1"}

    # 1. Die right after the idempotency key is committed, before the payment service is called.
    key_window = runs[0:2]
    procs.start_workers("die-after-key", workers=1, env={"WARDEN_FAULT_POINTS": "after_key_commit=die", **one_at_a_time})
    _approve(desk_operator, key_window)
    wait_for(lambda: all(_refund(r).status != ToolCallStatus.PENDING for r in key_window), message="the key-window writes to start")
    procs.stop("die-after-key")

    # 2. Die after the payment service booked the refund, before the result is committed.
    call_window = runs[2:4]
    procs.start_workers("die-after-call", workers=1, env={"WARDEN_FAULT_POINTS": "after_downstream_call=die", **one_at_a_time})
    _approve(desk_operator, call_window)
    wait_for(lambda: all(sim_refund_count(order_id=_refund(r).arguments["order_id"]) == 1 for r in call_window),
             message="the call-window refunds to be booked")
    procs.stop("die-after-call")

    # 3. Random SIGKILLs of whole clusters (one of them also dying mid-stream) while the rest run.
    rng = random.Random(20261129)
    clusters = {"a": {}, "b": {"WARDEN_FAULT_POINTS": "mid_model_stream=die"}, "c": {}}
    for label, env in clusters.items():
        procs.start_workers(label, workers=1, env=env)
    for _ in range(8):
        approve_pending(desk_operator)
        time.sleep(rng.uniform(0.3, 1.5))
        label = rng.choice(list(clusters))
        procs.signal(label, signal.SIGKILL)
        procs.stop(label)
        procs.start_workers(label, workers=1, env=clusters[label])
    for label in clusters:
        procs.stop(label)

    procs.start_workers("healthy", workers=2)
    run_ids = [r.id for r in runs]

    def settled():
        approve_pending(desk_operator)
        return not Run.objects.filter(pk__in=run_ids).exclude(status__in=["completed", "failed", "cancelled"]).exists()

    wait_for(settled, timeout=180, interval=0.5, message="every run to finish")

    assert Run.objects.filter(pk__in=run_ids).count() == len(ORDERS)  # none lost
    assert refund_outcomes_are_honest(run_ids) == []
    for run in Run.objects.filter(pk__in=run_ids):
        assert resting_correctly(run) and run.status == RunStatus.COMPLETED, (run.id, run.status, run.error_detail)
        assert seqs_gap_free(run.id)
        assert _refund(run).attempts == 1  # no write was ever sent twice
    # Key window: the write never left, so after the grace period it is settled as not applied.
    for run in key_window:
        call = _refund(run)
        assert RunEvent.objects.filter(run=run, type="tool_call", payload__recovered=True).exists()
        assert (call.status, call.resolution) == (ToolCallStatus.FAILED, "not_applied")
        assert sim_refund_count(order_id=call.arguments["order_id"]) == 0
    # Call window: booked but unrecorded; reconciliation finds it by key — exactly one refund.
    for run in call_window:
        call = _refund(run)
        assert RunEvent.objects.filter(run=run, type="tool_call", payload__recovered=True).exists()
        assert (call.status, call.resolution) == (ToolCallStatus.SUCCEEDED, "applied")
        assert sim_refund_count(order_id=call.arguments["order_id"]) == 1
