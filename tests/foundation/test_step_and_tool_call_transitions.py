"""Steps and tool calls change status only through `step_transition` and `tool_call_transition`:
every legal pair of STEP_TRANSITIONS / TOOL_CALL_TRANSITIONS succeeds, every illegal pair is
refused and writes nothing, a stale read loses, and a worker whose lease is gone writes nothing —
against PostgreSQL, whose check constraints back the tables up."""

import itertools
import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from runs_app.models import Run, RunEvent, RunPhase, RunStatus, Step, StepStatus
from engine.state import run_transition, run_write, step_transition
from runs_app.transitions import STEP_TRANSITIONS, IllegalTransition, LeaseLost
from tests.support.factories import RunFactory, StepFactory, ToolCallFactory
from tools_app.models import FINAL_TOOL_CALL_STATUSES, ToolCall, ToolCallStatus, ToolEffect
from engine.state import tool_call_transition
from tools_app.transitions import TOOL_CALL_TRANSITIONS

pytestmark = pytest.mark.django_db


def _leased_run() -> Run:
    return RunFactory(status=RunStatus.RUNNING, phase=RunPhase.EXECUTING_TOOLS, lease_owner="w1",
                      lease_expires_at=timezone.now(), lease_token=7)


def _step_in(status: str) -> Step:
    finished = None if status == StepStatus.RUNNING else timezone.now()
    return StepFactory(run=_leased_run(), index=0, status=status, finished_at=finished, lease_token=7)


def _call_in(status: str) -> ToolCall:
    """A write (so every status, `unknown` included, is storable), keyed as a started write must be."""
    finished = timezone.now() if status in FINAL_TOOL_CALL_STATUSES or status == ToolCallStatus.UNKNOWN else None
    step = _step_in(StepStatus.RUNNING)
    return ToolCallFactory(step=step, run=step.run, tool_name="execute_refund", effect=ToolEffect.WRITE,
                           arguments={"order_id": "9527", "amount": "10.00"}, status=status, finished_at=finished,
                           idempotency_key=f"execute_refund:{step.run_id}:9527")


STEP_LEGAL = [(a, b) for a, targets in STEP_TRANSITIONS.items() for b in sorted(targets)]
STEP_ILLEGAL = [(a, b) for a, b in itertools.product(StepStatus.values, repeat=2) if b not in STEP_TRANSITIONS[a]]
CALL_LEGAL = [(a, b) for a, targets in TOOL_CALL_TRANSITIONS.items() for b in sorted(targets)]
CALL_ILLEGAL = [(a, b) for a, b in itertools.product(ToolCallStatus.values, repeat=2) if b not in TOOL_CALL_TRANSITIONS[a]]


def test_the_tables_name_every_status():
    assert set(STEP_TRANSITIONS) == set(StepStatus.values)
    assert set(TOOL_CALL_TRANSITIONS) == set(ToolCallStatus.values)
    assert len(STEP_LEGAL) + len(STEP_ILLEGAL) == len(StepStatus.values) ** 2
    assert len(CALL_LEGAL) + len(CALL_ILLEGAL) == len(ToolCallStatus.values) ** 2


# --- steps -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("from_status", "to_status"), STEP_LEGAL)
def test_every_legal_step_transition_happens_under_the_lease(from_status, to_status):
    step = _step_in(from_status)
    with transaction.atomic():
        assert step_transition(step=step, to=to_status, lease_token=7, discard_reason="r") is True
    stored = Step.objects.get(pk=step.pk)
    assert stored.status == to_status and stored.finished_at is not None


@pytest.mark.parametrize(("from_status", "to_status"), STEP_ILLEGAL)
def test_every_illegal_step_transition_is_refused_and_writes_nothing(from_status, to_status):
    step = _step_in(from_status)
    before = Step.objects.filter(pk=step.pk).values().get()
    with pytest.raises(IllegalTransition), transaction.atomic():
        step_transition(step=step, to=to_status, lease_token=7)
    assert Step.objects.filter(pk=step.pk).values().get() == before


@pytest.mark.parametrize(("from_status", "to_status"), STEP_LEGAL)
def test_a_step_transition_under_a_lost_lease_raises_and_writes_nothing(from_status, to_status):
    step = _step_in(from_status)
    with pytest.raises(LeaseLost), transaction.atomic():
        step_transition(step=step, to=to_status, lease_token=6)
    assert Step.objects.get(pk=step.pk).status == from_status


def test_a_step_transition_from_a_stale_read_loses():
    step = _step_in(StepStatus.RUNNING)
    stale = Step.objects.get(pk=step.pk)
    with transaction.atomic():
        assert step_transition(step=step, to=StepStatus.COMPLETED, lease_token=7)
        assert step_transition(step=stale, to=StepStatus.DISCARDED, lease_token=7) is False
    assert Step.objects.get(pk=step.pk).status == StepStatus.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_a_step_transition_outside_a_transaction_is_refused():
    step = _step_in(StepStatus.RUNNING)
    with pytest.raises(RuntimeError):
        step_transition(step=step, to=StepStatus.COMPLETED, lease_token=7)
    assert Step.objects.get(pk=step.pk).status == StepStatus.RUNNING


# --- tool calls --------------------------------------------------------------------------------


@pytest.mark.parametrize(("from_status", "to_status"), CALL_LEGAL)
def test_every_legal_tool_call_transition_happens_and_is_logged(from_status, to_status):
    call = _call_in(from_status)
    assert tool_call_transition(tool_call=call, to=to_status, lease_token=7, announce=True) is True
    stored = ToolCall.objects.get(pk=call.pk)
    assert stored.status == to_status
    event = RunEvent.objects.get(run=call.run_id)
    assert event.type == "tool_call" and event.payload["status"] == to_status
    if to_status == ToolCallStatus.RUNNING:
        assert stored.lease_token == 7  # the lease it runs under, to recognise a crash by (SPEC §10)


@pytest.mark.parametrize(("from_status", "to_status"), CALL_ILLEGAL)
def test_every_illegal_tool_call_transition_is_refused_and_writes_nothing(from_status, to_status):
    call = _call_in(from_status)
    before = ToolCall.objects.filter(pk=call.pk).values().get()
    with pytest.raises(IllegalTransition):
        tool_call_transition(tool_call=call, to=to_status, lease_token=7, announce=True)
    assert ToolCall.objects.filter(pk=call.pk).values().get() == before
    assert not RunEvent.objects.filter(run=call.run_id).exists()


@pytest.mark.parametrize(("from_status", "to_status"), CALL_LEGAL)
def test_a_tool_call_transition_under_a_lost_lease_raises_and_writes_nothing(from_status, to_status):
    call = _call_in(from_status)
    with pytest.raises(LeaseLost):
        tool_call_transition(tool_call=call, to=to_status, lease_token=6, announce=True)
    assert ToolCall.objects.get(pk=call.pk).status == from_status
    assert not RunEvent.objects.filter(run=call.run_id).exists()


def test_a_tool_call_transition_from_a_stale_read_loses():
    call = _call_in(ToolCallStatus.PENDING)
    stale = ToolCall.objects.get(pk=call.pk)
    assert tool_call_transition(tool_call=call, to=ToolCallStatus.CANCELLED, announce=True)
    assert tool_call_transition(tool_call=stale, to=ToolCallStatus.RUNNING, lease_token=7, announce=True) is False
    assert ToolCall.objects.get(pk=call.pk).status == ToolCallStatus.CANCELLED
    assert RunEvent.objects.filter(run=call.run_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_silent_tool_call_transition_needs_the_callers_transaction():
    call = _call_in(ToolCallStatus.PENDING)
    with pytest.raises(RuntimeError):
        tool_call_transition(tool_call=call, to=ToolCallStatus.RUNNING, lease_token=7)
    assert ToolCall.objects.get(pk=call.pk).status == ToolCallStatus.PENDING


@pytest.mark.django_db(transaction=True)
def test_a_revocation_committed_meanwhile_rolls_the_lease_holders_commit_back():
    """The worker moves a call under its token, the sweeper revokes the lease before the worker's
    run write: the run write re-checks the token under the run row's lock, so the worker's whole
    transaction — the tool call's change included — rolls back."""
    call = _call_in(ToolCallStatus.PENDING)
    moved, revoked = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def worker():
        try:
            with transaction.atomic():
                assert tool_call_transition(tool_call=call, to=ToolCallStatus.RUNNING, lease_token=7)
                moved.set()
                revoked.wait(timeout=30)
                run_write(run_id=call.run_id, events=[("tool_call", {})], lease_token=7)
        except LeaseLost as error:
            outcome["error"] = error
        finally:
            connection.close()

    def sweeper():
        try:
            moved.wait(timeout=30)
            with transaction.atomic():
                # As the sweeper revokes an expired lease: back to the queue, with a new token.
                assert run_transition(run=Run.objects.get(pk=call.run_id), to=RunStatus.QUEUED, lease_token=7,
                                      new_lease_token=True)
            revoked.set()
        finally:
            connection.close()

    threads = [threading.Thread(target=worker), threading.Thread(target=sweeper)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert isinstance(outcome.get("error"), LeaseLost)
    assert ToolCall.objects.get(pk=call.pk).status == ToolCallStatus.PENDING
    assert Run.objects.get(pk=call.run_id).lease_token == 8
