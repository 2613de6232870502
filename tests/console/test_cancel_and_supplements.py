"""Interjections and cancel that respect intent (issue 29): a supplement meant for a run that is then
cancelled is held with a choice — send it as a new request or drop it — and never starts a run
by itself; cancelling first says what has already happened and what will not."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals_app.models import ApprovalStatus, AuditEntry
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from runs_app.models import Run, RunEvent, RunPhase, RunStatus, StepKind
from sessions_app.models import InputDisposition, InputMode, Message, MessageRole, PendingInput
from tests.support.factories import ApprovalFactory, RunFactory, StepFactory, ToolCallFactory, UserFactory
from tools_app.models import ToolCallStatus, ToolEffect

pytestmark = pytest.mark.django_db

SUPPLEMENT = "Could you tell me the order number?"


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def busy_session(title: str = "busy"):
    """A customer's session whose first run is queued (nobody drives it: it stays active)."""
    owner = UserFactory()
    session = session_open(owner=owner, title=title)
    run = message_post(session=session, content="Check order 9527 and refund it if it's eligible", acting_user=owner).run
    return owner, session, run


def runs_of(session) -> list[Run]:
    return list(Run.objects.filter(session=session).order_by("created_at"))


def test_a_supplement_for_a_cancelled_run_is_held_with_a_choice_and_starts_nothing():
    owner, session, run = busy_session()
    pending = message_post(session=session, content=SUPPLEMENT, mode=InputMode.SUPPLEMENT, acting_user=owner).pending_input
    client = client_for(owner)

    assert client.post(f"/console/runs/{run.pk}/cancel/").status_code == 302

    run.refresh_from_db()
    pending.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert runs_of(session) == [run]  # no new run, out of context or otherwise
    assert (pending.disposition, pending.held_from_id, pending.consumed_by_id) == (InputDisposition.HELD, run.pk, None)
    assert pending.held_reason == "its run was cancelled"
    cancelled = RunEvent.objects.get(run=run, type="run_status", payload__status="cancelled")
    assert cancelled.payload["held_inputs"] == [pending.pk]
    html = client.get(f"/console/sessions/{session.pk}/").content.decode()
    assert SUPPLEMENT in html and "Send as a new request" in html and "Drop it" in html
    assert f'data-held="{pending.pk}"' in html
    # The run's own fragment (what console.js fetches when a run ends) carries the choice too.
    fragment = client.get(f"/console/runs/{run.pk}/").content.decode()
    assert "Send as a new request" in fragment


def test_an_unclassified_auto_input_is_held_too_but_not_by_a_stranger():
    owner, session, run = busy_session()
    pending = message_post(session=session, content="and the other one", mode=InputMode.AUTO, acting_user=owner).pending_input
    client_for(owner).post(f"/console/runs/{run.pk}/cancel/")
    pending.refresh_from_db()
    assert pending.disposition == InputDisposition.HELD and runs_of(session) == [run]
    stranger = client_for(UserFactory())
    assert stranger.post(f"/console/held-inputs/{pending.pk}/", {"choice": "send"}).status_code == 404
    pending.refresh_from_db()
    assert pending.disposition == InputDisposition.HELD


def test_send_as_a_new_request_starts_exactly_one_run_with_its_text():
    owner, session, run = busy_session()
    pending = message_post(session=session, content=SUPPLEMENT, mode=InputMode.SUPPLEMENT, acting_user=owner).pending_input
    client = client_for(owner)
    client.post(f"/console/runs/{run.pk}/cancel/")

    response = client.post(f"/console/held-inputs/{pending.pk}/", {"choice": "send"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 200, response.content
    body = response.json()
    started = Run.objects.exclude(pk=run.pk).get(session=session)
    assert body == {"choice": "send", "disposition": "started_run", "run_id": str(started.pk)}
    first = Message.objects.filter(run=started, role=MessageRole.USER).get()
    assert first.content == SUPPLEMENT
    pending.refresh_from_db()
    assert (pending.disposition, pending.consumed_by_id, pending.message_id) == (InputDisposition.NEW_RUN, started.pk, first.pk)
    assert AuditEntry.objects.filter(action="input_send", object_id=str(pending.pk), actor=owner).exists()
    # Sent once: a second click is refused and starts nothing more.
    again = client.post(f"/console/held-inputs/{pending.pk}/", {"choice": "send"}, HTTP_ACCEPT="application/json")
    assert again.status_code == 409 and again.json()["code"] == "input_not_held"
    assert len(runs_of(session)) == 2
    html = client.get(f"/console/sessions/{session.pk}/").content.decode()
    assert "Send as a new request" not in html


def test_send_while_another_run_is_active_queues_it_after_that_run():
    owner, session, run = busy_session()
    pending = message_post(session=session, content=SUPPLEMENT, mode=InputMode.SUPPLEMENT, acting_user=owner).pending_input
    client = client_for(owner)
    client.post(f"/console/runs/{run.pk}/cancel/")
    other = message_post(session=session, content="What's the weather in Paris?", acting_user=owner).run

    response = client.post(f"/console/held-inputs/{pending.pk}/", {"choice": "send"})  # without JavaScript

    assert response.status_code == 302 and response["Location"] == f"/console/sessions/{session.pk}/"
    assert len(runs_of(session)) == 2  # nothing starts beside the active run
    queued = PendingInput.objects.get(session=session, consumed_at__isnull=True)
    assert (queued.content, queued.mode) == (SUPPLEMENT, InputMode.QUEUE)
    pending.refresh_from_db()
    assert (pending.disposition, pending.consumed_by_id) == (InputDisposition.NEW_RUN, None)
    assert RunEvent.objects.filter(run=other, type="input_queued", payload__pending_input=queued.pk).exists()


def test_drop_it_starts_nothing_and_keeps_the_input_as_discarded():
    owner, session, run = busy_session()
    pending = message_post(session=session, content=SUPPLEMENT, mode=InputMode.SUPPLEMENT, acting_user=owner).pending_input
    client = client_for(owner)
    client.post(f"/console/runs/{run.pk}/cancel/")

    response = client.post(f"/console/held-inputs/{pending.pk}/", {"choice": "drop"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 200 and response.json() == {"choice": "drop", "disposition": "discarded"}
    assert runs_of(session) == [run]
    pending.refresh_from_db()
    assert (pending.disposition, pending.held_from_id) == (InputDisposition.DISCARDED, run.pk)
    assert not Message.objects.filter(session=session, content=SUPPLEMENT).exists()
    assert AuditEntry.objects.filter(action="input_drop", object_id=str(pending.pk), actor=owner).exists()
    assert "Drop it" not in client.get(f"/console/sessions/{session.pk}/").content.decode()
    bad = client.post(f"/console/held-inputs/{pending.pk}/", {"choice": "later"}, HTTP_ACCEPT="application/json")
    assert bad.status_code == 400


def test_a_queued_new_request_still_starts_after_cancel_and_a_supplement_before_it_is_held():
    owner, session, run = busy_session()
    supplement = message_post(session=session, content=SUPPLEMENT, mode=InputMode.SUPPLEMENT, acting_user=owner).pending_input
    queued = message_post(session=session, content="What's the weather in Paris?", mode=InputMode.QUEUE,
                          acting_user=owner).pending_input

    client_for(owner).post(f"/console/runs/{run.pk}/cancel/")

    supplement.refresh_from_db()
    queued.refresh_from_db()
    assert supplement.disposition == InputDisposition.HELD
    following = Run.objects.exclude(pk=run.pk).get(session=session)
    assert (queued.disposition, queued.consumed_by_id) == (InputDisposition.NEW_RUN, following.pk)
    assert Message.objects.get(run=following, role=MessageRole.USER).content == "What's the weather in Paris?"


def test_an_intent_switch_starts_the_next_run_and_holds_the_supplement_before_it():
    owner, session, run = busy_session()
    supplement = message_post(session=session, content=SUPPLEMENT, mode=InputMode.SUPPLEMENT, acting_user=owner).pending_input
    switch = message_post(session=session, content="forget it, what's the weather in Paris?", mode=InputMode.NEW_INTENT,
                          acting_user=owner).pending_input
    after = message_post(session=session, content="and in London", mode=InputMode.SUPPLEMENT, acting_user=owner).pending_input

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    following = Run.objects.exclude(pk=run.pk).get(session=session)
    supplement.refresh_from_db()
    switch.refresh_from_db()
    after.refresh_from_db()
    assert supplement.disposition == InputDisposition.HELD
    assert switch.consumed_by_id == following.pk
    assert after.consumed_at is None  # posted after the switch: it goes with the new request


def test_the_session_detail_over_the_api_lists_held_input():
    owner, session, run = busy_session()
    pending = message_post(session=session, content=SUPPLEMENT, mode=InputMode.SUPPLEMENT, acting_user=owner).pending_input
    client = client_for(owner)
    client.post(f"/console/runs/{run.pk}/cancel/")
    body = client.get(f"/api/v1/sessions/{session.pk}").json()
    assert body["pending_inputs"] == []
    (held,) = body["held_inputs"]
    assert (held["id"], held["disposition"], held["held_from_run_id"], held["content"]) == (
        pending.pk, "held", str(run.pk), SUPPLEMENT)


# --- the cancel confirmation ----------------------------------------------------------------------


def refund_run_with_writes(owner):
    """A running run that made one refund, is sending a second and waits on approval for a third."""
    session = session_open(owner=owner, title="refunds")
    run = RunFactory(session=session, status=RunStatus.RUNNING, phase=RunPhase.EXECUTING_TOOLS, lease_owner="w1",
                     lease_expires_at=timezone.now() + timedelta(minutes=5), lease_token=7)
    step = StepFactory(run=run, index=1, kind=StepKind.TOOLS, lease_token=7)
    ToolCallFactory(step=step, index=0, tool_name="execute_refund", effect=ToolEffect.WRITE, status=ToolCallStatus.SUCCEEDED,
                    arguments={"order_id": "9527", "amount": "25.00"}, result={"refund_id": "rf_1"},
                    started_at=timezone.now(), finished_at=timezone.now())
    ToolCallFactory(step=step, index=1, tool_name="execute_refund", effect=ToolEffect.WRITE, status=ToolCallStatus.RUNNING,
                    arguments={"order_id": "9528", "amount": "12.50"}, lease_token=7, started_at=timezone.now(),
                    idempotency_key="execute_refund:refund:9528:12.50")
    ApprovalFactory(tool_call__step=step, tool_call__index=2, tool_call__arguments={"order_id": "9529", "amount": "8.00"})
    return session, run


def test_the_cancel_button_asks_first_and_lists_what_was_done_what_is_in_flight_and_what_is_withdrawn():
    owner = UserFactory()
    session, run = refund_run_with_writes(owner)
    client = client_for(owner)
    session_html = client.get(f"/console/sessions/{session.pk}/").content.decode()
    assert f'<form method="get" action="/console/runs/{run.pk}/cancel/" class="cancel-form"' in session_html

    html = client.get(f"/console/runs/{run.pk}/cancel/").content.decode()

    assert "Cancel this run?" in html
    assert "Refund of 25.00 USD for order 9527 was already made. Cancelling does not undo it." in html
    assert ("The refund of 12.50 USD for order 9528 is being sent now: cancelling waits for its outcome and will not "
            "undo it.") in html
    assert "The request to approve the refund of 8.00 USD for order 9529 will be withdrawn: it will not be sent." in html
    assert "The agent stops working on this request and will not answer it." in html
    assert "Yes, cancel the run" in html and "No, keep it running" in html
    assert "Nothing has been changed" not in html
    run.refresh_from_db()
    assert run.cancel_requested_at is None  # asking changes nothing
    fragment = client.get(f"/console/runs/{run.pk}/cancel/?fragment=1").content.decode()
    assert "Cancel this run?" in fragment and "<html" not in fragment and "9528" in fragment


def test_an_approved_write_not_yet_sent_and_the_held_supplement_are_named():
    owner, session, run = busy_session()
    approval = ApprovalFactory(tool_call__step__run=run, tool_call__arguments={"order_id": "9527", "amount": "25.00"},
                               status=ApprovalStatus.APPROVED, decided_at=timezone.now(),
                               decided_by=UserFactory(is_staff=True))
    assert approval.tool_call.status == ToolCallStatus.PENDING
    message_post(session=session, content=SUPPLEMENT, mode=InputMode.SUPPLEMENT, acting_user=owner)
    html = client_for(owner).get(f"/console/runs/{run.pk}/cancel/").content.decode()
    assert "Refund of 25.00 USD for order 9527 was approved but has not been sent: cancelling stops it" in html
    assert f"What you added, “{SUPPLEMENT}”, will be kept for you to send as a new request or drop." in html


def test_a_run_with_nothing_at_stake_asks_calmly_and_yes_cancels():
    owner, session, run = busy_session()
    client = client_for(owner)
    html = client.get(f"/console/runs/{run.pk}/cancel/").content.decode()
    assert "Nothing has been changed for you in this request." in html
    assert "undo" not in html and "withdrawn" not in html and "being sent" not in html
    assert client.post(f"/console/runs/{run.pk}/cancel/").status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert "Cancelling is already under way" not in client.get(f"/console/runs/{run.pk}/cancel/").content.decode()
    assert "This run has already ended" in client.get(f"/console/runs/{run.pk}/cancel/").content.decode()


def test_only_who_may_cancel_sees_the_confirmation():
    owner, session, run = busy_session()
    assert client_for(UserFactory()).get(f"/console/runs/{run.pk}/cancel/").status_code == 404
