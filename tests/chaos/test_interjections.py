"""Interjections (SPEC §8): input typed while a run is busy is never lost, never applied twice,
and keeps its order; one active run at a time."""

import threading

import pytest

from runs_app.models import ACTIVE_STATUSES, Run, RunEvent, RunStatus
from sessions_app.models import InputDisposition, InputMode, Message, MessageRole, PendingInput
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from tests.support.chaos import all_terminal
from tests.support.factories import UserFactory
from tests.support.processes import wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_a_storm_of_interjections_is_accounted_for_exactly_once_in_order(procs, demo_world):
    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    user = UserFactory()
    session = session_open(owner=user, title="storm")
    first = message_post(session=session, content="please run noop 6", acting_user=user, provider_options={"delay": 0.05}).run
    wait_for(lambda: Run.objects.filter(pk=first.id, status=RunStatus.RUNNING).exists(), message="the run to be busy")

    max_active = [0]
    stop = threading.Event()

    def watch():
        from django.db import connection

        try:
            while not stop.is_set():
                active = Run.objects.filter(session=session, status__in=ACTIVE_STATUSES).count()
                max_active[0] = max(max_active[0], active)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    modes = [InputMode.SUPPLEMENT, InputMode.QUEUE, InputMode.SUPPLEMENT, InputMode.AUTO] * 4
    sent = []
    for i, mode in enumerate(modes):
        text = f"also note {i}" if mode != InputMode.QUEUE else f"note {i} for later"
        result = message_post(session=session, content=text, mode=mode, acting_user=user)
        sent.append((text, mode, result.disposition))

    def settled():
        runs = Run.objects.filter(session=session).values_list("pk", flat=True)
        return all_terminal(runs) and not PendingInput.objects.filter(session=session, consumed_at__isnull=True).exists()

    wait_for(settled, timeout=150, interval=0.3, message="every input to be applied and every run to finish")
    stop.set()
    watcher.join()

    assert max_active[0] == 1
    inputs = list(PendingInput.objects.filter(session=session).order_by("id"))
    assert len(inputs) == len([s for s in sent if s[2] == "pending"])
    for item in inputs:
        assert item.consumed_at is not None and item.disposition and item.message_id is not None
    # Each input is in the history exactly once, in arrival order.
    user_texts = list(Message.objects.filter(session=session, role=MessageRole.USER).order_by("seq").values_list("content", flat=True))
    for text, _mode, _disposition in sent:
        assert user_texts.count(text) == 1
    expected_order = [i.content for i in inputs]
    positions = [user_texts.index(t) for t in expected_order]
    supplements = [p for p, i in zip(positions, inputs) if i.disposition == InputDisposition.SUPPLEMENTED]
    assert supplements == sorted(supplements)
    queued = [i for i in inputs if i.disposition == InputDisposition.NEW_RUN]
    assert [i.consumed_by.created_at for i in queued] == sorted(i.consumed_by.created_at for i in queued)
    # Every decision was recorded as an event with its reason.
    classified = RunEvent.objects.filter(run__session=session, type="input_classified")
    assert classified.count() == len([i for i in inputs if i.mode == InputMode.AUTO])
    assert all(e.payload["reason"] for e in classified)


def test_an_intent_switch_cancels_the_run_and_starts_a_new_one(procs, demo_world):
    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    user = UserFactory()
    session = session_open(owner=user, title="switch")
    # Long enough that the switch surely arrives before the run's last model call.
    first = message_post(session=session, content="please run noop 30", acting_user=user,
                         provider_options={"delay": 0.1}, budgets={"max_model_calls": 40}).run
    wait_for(lambda: Run.objects.filter(pk=first.id, status=RunStatus.RUNNING).exists(), message="the run to be busy")
    message_post(session=session, content="forget it, what's the weather in Paris?", mode=InputMode.AUTO, acting_user=user)
    wait_for(lambda: Run.objects.filter(session=session).count() == 2 and all_terminal(Run.objects.filter(session=session).values_list("pk", flat=True)),
             timeout=90, message="the switch to finish")
    first.refresh_from_db()
    assert first.status == RunStatus.CANCELLED and "intent switch" in first.cancel_reason
    second = Run.objects.filter(session=session).exclude(pk=first.pk).get()
    assert second.status == RunStatus.COMPLETED
    assert "Paris" in second.messages.filter(role=MessageRole.ASSISTANT).order_by("-seq").first().content
    reason = RunEvent.objects.get(run=first, type="input_classified").payload["reason"]
    assert "new_intent" in reason


def test_an_intent_switch_while_waiting_for_approval_cancels_at_once(transactional_db, simulator):
    from django.core.management import call_command

    from approvals_app.models import Approval, ApprovalStatus
    from engine.loop import run_drive

    call_command("seed_demo", verbosity=0)
    user = UserFactory()
    session = session_open(owner=user, title="switch while waiting")
    first = message_post(session=session, content="Check order 9527 and refund it if it's eligible", acting_user=user,
                         provider_options={"delay": 0}).run
    run_drive(run_id=str(first.id))
    first.refresh_from_db()
    assert first.status == RunStatus.WAITING
    result = message_post(session=session, content="forget it", mode=InputMode.NEW_INTENT, acting_user=user)
    first.refresh_from_db()
    assert result.disposition == "pending" and first.status == RunStatus.CANCELLED
    assert Approval.objects.get(run=first).status == ApprovalStatus.WITHDRAWN
    follow_up = Run.objects.filter(session=session).exclude(pk=first.pk).get()
    assert follow_up.status == RunStatus.QUEUED
    assert PendingInput.objects.get(session=session).consumed_by == follow_up
