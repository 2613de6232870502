"""Every legal run transition succeeds and every illegal one is refused without writing."""

import itertools

import pytest
from django.db import transaction
from django.utils import timezone

from runs_app.models import Run, RunEvent, RunPhase, RunStatus, WaitReason
from engine.state import run_create, run_transition
from runs_app.transitions import RUN_TRANSITIONS, IllegalTransition, LeaseLost
from tests.support.factories import RunFactory, SessionFactory

pytestmark = pytest.mark.django_db


def _arguments_for(to: str) -> dict:
    if to == RunStatus.RUNNING:
        return {"phase": RunPhase.CALLING_MODEL, "lease_owner": "w1", "lease_expires_at": timezone.now()}
    if to == RunStatus.WAITING:
        return {"wait_reason": WaitReason.APPROVAL}
    if to == RunStatus.FAILED:
        return {"error_code": "internal_error", "error_detail": "test"}
    return {}


def _run_in(status: str) -> Run:
    fields = {"status": status}
    if status == RunStatus.RUNNING:
        fields |= {"phase": RunPhase.PREPARING_CONTEXT, "lease_owner": "w0", "lease_expires_at": timezone.now()}
    elif status == RunStatus.WAITING:
        fields |= {"phase": "", "wait_reason": WaitReason.RETRY_BACKOFF}
    elif status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
        fields |= {"phase": "", "finished_at": timezone.now(), "error_code": "x" if status == RunStatus.FAILED else ""}
    return RunFactory(**fields)


LEGAL = [(a, b) for a, targets in RUN_TRANSITIONS.items() for b in sorted(targets)]
ILLEGAL = [(a, b) for a, b in itertools.product(RunStatus.values, repeat=2) if b not in RUN_TRANSITIONS[a]]


@pytest.mark.parametrize(("from_status", "to_status"), LEGAL)
def test_every_legal_transition_succeeds_and_is_logged(from_status, to_status):
    run = _run_in(from_status)
    assert run_transition(run=run, to=to_status, **_arguments_for(to_status)) is True
    stored = Run.objects.get(pk=run.pk)
    assert stored.status == to_status
    event = RunEvent.objects.get(run=run, seq=stored.event_seq)
    assert event.type == "run_status" and event.payload["status"] == to_status


@pytest.mark.parametrize(("from_status", "to_status"), ILLEGAL)
def test_every_illegal_transition_is_refused_and_writes_nothing(from_status, to_status):
    run = _run_in(from_status)
    before = Run.objects.filter(pk=run.pk).values().get()
    with pytest.raises(IllegalTransition):
        run_transition(run=run, to=to_status, **_arguments_for(to_status))
    assert Run.objects.filter(pk=run.pk).values().get() == before
    assert not RunEvent.objects.filter(run=run).exists()


def test_terminal_statuses_have_no_way_out():
    for status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
        assert RUN_TRANSITIONS[status] == frozenset()


def test_transition_from_a_stale_read_loses_and_writes_nothing():
    run = _run_in(RunStatus.QUEUED)
    stale = Run.objects.get(pk=run.pk)
    assert run_transition(run=run, to=RunStatus.CANCELLED)
    assert run_transition(run=stale, to=RunStatus.RUNNING, **_arguments_for(RunStatus.RUNNING)) is False
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED
    assert RunEvent.objects.filter(run=run).count() == 1


def test_a_stale_lease_token_raises_lease_lost_and_writes_nothing():
    run = _run_in(RunStatus.RUNNING)
    with pytest.raises(LeaseLost), transaction.atomic():  # a lost lease rolls back the caller's whole commit
        run_transition(run=run, to=RunStatus.COMPLETED, lease_token=run.lease_token + 1)
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING


def test_run_create_queues_and_logs_the_first_event():
    session = SessionFactory()
    run = run_create(session=session, created_by=session.owner)
    assert run.status == RunStatus.QUEUED and run.phase == RunPhase.WAITING_WORKER
    assert list(run.events.values_list("seq", "type")) == [(1, "run_status")]
