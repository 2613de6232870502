"""Leases with fencing tokens, exercised with real concurrent database connections."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from engine.lease import Heartbeat
from engine.state import run_claim
from engine.sweeper import sweep_once
from runs_app.models import Run, RunEvent, RunStatus
from engine.state import run_write
from runs_app.transitions import LeaseLost
from tests.support.factories import RunFactory, StepFactory, ToolCallFactory
from tools_app.models import ToolCall, ToolCallStatus
from engine.state import tool_call_transition

pytestmark = pytest.mark.django_db(transaction=True)


def test_racing_claims_exactly_one_wins():
    run = RunFactory()
    barrier = threading.Barrier(6)
    leases = []

    def claim(name):
        try:
            barrier.wait()
            leases.append(run_claim(run_id=run.id, owner=name))
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [lease for lease in leases if lease is not None]
    assert len(winners) == 1
    stored = Run.objects.get(pk=run.pk)
    assert stored.status == RunStatus.RUNNING and stored.lease_owner == winners[0].owner
    assert stored.lease_token == winners[0].token == 1


def _expire_and_sweep(run_id):
    Run.objects.filter(pk=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    return sweep_once()


def test_a_revoked_lease_holder_can_write_nothing():
    run = RunFactory()
    lease = run_claim(run_id=run.id, owner="stalled")
    step = StepFactory(run=run, index=0)
    call = ToolCallFactory(step=step, run=run)
    assert _expire_and_sweep(run.id)["leases_revoked"] == 1
    new_lease = run_claim(run_id=run.id, owner="successor")
    assert new_lease.token > lease.token
    events_before = RunEvent.objects.filter(run=run).count()

    with pytest.raises(LeaseLost), transaction.atomic():
        run_write(run_id=run.id, changes={"model_calls": 99}, events=[("input_queued", {})], lease_token=lease.token)
    with pytest.raises(LeaseLost):
        tool_call_transition(tool_call=call, to=ToolCallStatus.RUNNING, lease_token=lease.token, announce=True)

    assert ToolCall.objects.get(pk=call.pk).status == ToolCallStatus.PENDING
    stored = Run.objects.get(pk=run.pk)
    assert stored.model_calls == 0 and stored.lease_owner == "successor"
    assert RunEvent.objects.filter(run=run).count() == events_before


def test_revocation_is_recorded_with_old_and_new_tokens():
    run = RunFactory()
    lease = run_claim(run_id=run.id, owner="w1")
    _expire_and_sweep(run.id)
    revoked = RunEvent.objects.filter(run=run, type="run_status", payload__reason="lease expired").get()
    assert revoked.payload["previous_lease_token"] == lease.token
    assert revoked.payload["previous_owner"] == "w1"
    stored = Run.objects.get(pk=run.pk)
    assert stored.status == RunStatus.QUEUED and stored.lease_token == lease.token + 1


def test_heartbeat_extends_the_lease_and_notices_its_loss():
    run = RunFactory()
    lease = run_claim(run_id=run.id, owner="w1")
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() + timedelta(milliseconds=10))
    beat = Heartbeat(lease)
    assert beat.beat() is True
    assert Run.objects.get(pk=run.pk).lease_expires_at > timezone.now() + timedelta(seconds=1)
    _expire_and_sweep(run.id)
    assert beat.beat() is False and beat.lease_lost.is_set()


def test_heartbeat_reports_a_cancel_request():
    run = RunFactory()
    lease = run_claim(run_id=run.id, owner="w1")
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now())
    beat = Heartbeat(lease)
    assert beat.beat() is True and beat.cancel_requested.is_set()


def test_claim_ignores_runs_that_are_not_queued():
    run = RunFactory(status="waiting", phase="", wait_reason="approval")
    assert run_claim(run_id=run.id, owner="w1") is None
    assert Run.objects.get(pk=run.pk).lease_token == 0
