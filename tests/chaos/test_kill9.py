"""kill -9 chaos (SPEC §10): many concurrent refund runs, workers SIGKILLed at random moments
and at each dangerous named point, then restarted. Nothing is booked twice, nothing is lost."""

import random
import signal
import time

import pytest

from runs_app.models import Run, RunEvent, RunStatus
from tests.chaos.helpers import (
    all_terminal,
    approve_pending,
    post,
    refund_outcomes_are_honest,
    resting_correctly,
    seqs_gap_free,
)
from tests.support.processes import wait_for
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

ORDERS = [str(n) for n in range(1001, 1009)]


def test_sigkill_at_random_and_at_named_points_books_every_refund_at_most_once(procs, demo_world, desk_operator):
    rng = random.Random(20261129)
    procs.start_web()
    procs.start_sweeper()
    clusters = {
        # Each dies at one dangerous window of every write it executes.
        "die-after-key": {"WARDEN_FAULT_POINTS": "after_key_commit=die"},
        "die-after-call": {"WARDEN_FAULT_POINTS": "after_downstream_call=die"},
        "die-mid-stream": {"WARDEN_FAULT_POINTS": "mid_model_stream=die"},
        "plain": {},
    }
    for label, env in clusters.items():
        procs.start_workers(label, workers=1, env=env)

    runs = [post(f"Check order {order} and refund it if it's eligible", provider_options={"delay": 0.03}) for order in ORDERS]
    run_ids = [run.id for run in runs]

    deadline = time.monotonic() + 150
    kills = 0
    while not all_terminal(run_ids) and time.monotonic() < deadline:
        approve_pending(desk_operator)
        time.sleep(rng.uniform(0.3, 1.5))
        label = rng.choice(list(clusters))
        procs.signal(label, signal.SIGKILL)  # the whole cluster: guard, pusher, workers
        procs.stop(label)
        kills += 1
        procs.start_workers(label, workers=1, env=clusters[label])
        if kills >= 12:
            break
    # Calm down: only healthy workers from here on, until everything has come to rest.
    for label in list(clusters):
        procs.stop(label)
    procs.start_workers("healthy", workers=2)

    def settled():
        approve_pending(desk_operator)
        return all(resting_correctly(run) for run in Run.objects.filter(pk__in=run_ids)) and not Run.objects.filter(
            pk__in=run_ids, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
        ).exists()

    wait_for(settled, timeout=180, interval=0.5, message="every run to come to rest")

    assert Run.objects.filter(pk__in=run_ids).count() == len(ORDERS)  # none lost
    assert refund_outcomes_are_honest(run_ids) == []
    for run in Run.objects.filter(pk__in=run_ids):
        assert resting_correctly(run), (run.id, run.status, run.wait_reason)
        assert seqs_gap_free(run.id)
    # The named windows were really hit: writes interrupted after the key commit became
    # unknown and were reconciled, never replayed.
    recovered = RunEvent.objects.filter(run_id__in=run_ids, type="tool_call", payload__recovered=True, payload__tool="execute_refund")
    assert recovered.exists(), list(ToolCall.objects.filter(run_id__in=run_ids, tool_name="execute_refund").values_list("status", "attempts", "lease_token", "error_code"))
    assert not ToolCall.objects.filter(run_id__in=run_ids, tool_name="execute_refund", attempts__gt=1).exists()
    assert ToolCall.objects.filter(run_id__in=run_ids, tool_name="execute_refund", status=ToolCallStatus.SUCCEEDED).exists()
