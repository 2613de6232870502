"""Input held from a cancelled run, over the API (the console's choice, for other systems): the
session detail lists it; the owner sends it as a new request or drops it, once, audited."""

import uuid

import pytest

from approvals_app.models import AuditEntry
from runs_app.models import Run, RunStatus
from sessions_app.models import InputDisposition, Message, MessageRole, PendingInput
from tests.support.factories import SessionFactory

pytestmark = pytest.mark.django_db

SUPPLEMENT = "and order 9528 too, please"


def _held(api, session_id=None):
    """A session whose run was cancelled while a supplement waited for it: (session id, run id, input id)."""
    if session_id is None:
        session_id = api.post("/sessions", {"title": "refunds"}).json()["id"]
    run_id = api.post(f"/sessions/{session_id}/messages", {"content": "refund order 9527"}).json()["run"]["id"]
    pending = api.post(f"/sessions/{session_id}/messages", {"content": SUPPLEMENT, "mode": "supplement"})
    assert pending.status_code == 202, pending.content
    assert api.post(f"/runs/{run_id}/cancel", {}).status_code == 202
    (held,) = api.get(f"/sessions/{session_id}").json()["held_inputs"]
    assert (held["content"], held["disposition"], held["held_from_run_id"]) == (SUPPLEMENT, "held", run_id)
    return session_id, run_id, held["id"]


def test_sending_held_input_starts_one_run_with_its_text_once(alice, alice_api, django_capture_on_commit_callbacks):
    session_id, cancelled, input_id = _held(alice_api)
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_api.post(f"/sessions/{session_id}/held-inputs/{input_id}/send", {})
    assert response.status_code == 201, response.content
    body = response.json()
    started = Run.objects.exclude(pk=cancelled).get(session_id=session_id)
    assert (body["disposition"], body["run"]["id"], body["run"]["status"]) == ("started_run", str(started.pk), "queued")
    assert body["message"]["content"] == SUPPLEMENT
    assert Message.objects.get(run=started, role=MessageRole.USER).content == SUPPLEMENT
    held = PendingInput.objects.get(pk=input_id)
    assert (held.disposition, held.consumed_by_id) == (InputDisposition.NEW_RUN, started.pk)
    assert AuditEntry.objects.filter(action="input_send", object_id=str(input_id), actor=alice).count() == 1
    assert alice_api.get(f"/sessions/{session_id}").json()["held_inputs"] == []
    # Sent once: again (or dropping it now) is refused and starts nothing more.
    for choice in ("send", "drop"):
        again = alice_api.post(f"/sessions/{session_id}/held-inputs/{input_id}/{choice}", {})
        assert (again.status_code, again.json()["code"]) == (409, "input_not_held")
    assert Run.objects.filter(session_id=session_id).count() == 2


def test_held_input_sent_while_another_run_is_active_waits_for_it(alice_api):
    session_id, _, input_id = _held(alice_api)
    active = alice_api.post(f"/sessions/{session_id}/messages", {"content": "what is the weather?"}).json()["run"]["id"]
    response = alice_api.post(f"/sessions/{session_id}/held-inputs/{input_id}/send", {})
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["disposition"], body["run"]["id"], body["pending_input"]["mode"]) == ("pending", active, "queue")
    assert Run.objects.filter(session_id=session_id, status=RunStatus.QUEUED).count() == 1


def test_dropping_held_input_starts_nothing_and_keeps_it_as_discarded(alice, alice_api):
    session_id, cancelled, input_id = _held(alice_api)
    response = alice_api.post(f"/sessions/{session_id}/held-inputs/{input_id}/drop", {})
    assert response.status_code == 200, response.content
    assert (response.json()["id"], response.json()["disposition"], response.json()["content"]) == (input_id, "discarded", SUPPLEMENT)
    assert list(Run.objects.filter(session_id=session_id).values_list("pk", flat=True)) == [uuid.UUID(cancelled)]
    assert AuditEntry.objects.filter(action="input_drop", object_id=str(input_id), actor=alice).count() == 1
    again = alice_api.post(f"/sessions/{session_id}/held-inputs/{input_id}/send", {})
    assert (again.status_code, again.json()["code"]) == (409, "input_not_held")


def test_an_input_is_addressed_through_its_own_session(alice, alice_api):
    session_id, _, input_id = _held(alice_api)
    other = alice_api.post("/sessions", {"title": "another"}).json()["id"]
    for path, status in [
        (f"/sessions/{other}/held-inputs/{input_id}/send", 404),  # alice's input, not this session's
        (f"/sessions/{session_id}/held-inputs/{input_id + 1000}/send", 404),
        (f"/sessions/{session_id}/held-inputs/0/drop", 422),
        (f"/sessions/{session_id}/held-inputs/{2**63}/drop", 422),
        (f"/sessions/{session_id}/held-inputs/abc/drop", 422),
        (f"/sessions/{SessionFactory().pk}/held-inputs/{input_id}/send", 404),  # someone else's session
    ]:
        response = alice_api.post(path, {})
        assert response.status_code == status, (path, response.content)
        assert response.json()["code"]
    assert PendingInput.objects.get(pk=input_id).disposition == InputDisposition.HELD
