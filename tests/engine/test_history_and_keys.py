"""SPEC §4 and §16 through the HTTP API, with runs driven as worker tasks drive them (in this process:
tests/support/drive.py): a long session keeps working within its token window, with summaries
stored beside the immutable history and every model call's manifest saying what it saw; a retried
API POST does nothing twice; retention erases archived sessions through one audited path (the
`erase_sessions` command) and never touches an active run."""

import io
import json
import uuid

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from approvals_app.models import AuditEntry
from runs_app.models import ContextSummary, Run, RunStatus, Step, StepKind, WaitReason
from sessions_app.models import Message, MessageRole, PendingInput, Session
from sessions_app.services import messages_append
from engine.actions.sessions import session_open
from tests.support.api import Api
from tests.support.drive import drive_until
from tests.support.factories import ApiKeyFactory, UserFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("simulator", "demo_world")]
WINDOW = 1500


def _api(user) -> Api:
    return Api(ApiKeyFactory(owner=user).secret)


def test_a_300_message_session_keeps_working_within_its_window(settings):
    settings.WARDEN_CONTEXT_TOKENS = WINDOW
    user = UserFactory(username="chatty")
    session = session_open(owner=user, title="long")
    with transaction.atomic():
        messages_append(session_id=session.pk, messages=[
            Message(role=MessageRole.USER if n % 2 == 0 else MessageRole.ASSISTANT,
                    content=f"message {n}: order {1000 + n} was discussed at some length, " + "details " * 8)
            for n in range(300)
        ])
    api = _api(user)
    for text in ("please run noop 2", "please run noop 1"):
        run_id = api.post(f"/sessions/{session.pk}/messages", {"content": text}).json()["run"]["id"]
        drive_until(run_id, RunStatus.COMPLETED)
        assert Run.objects.get(pk=run_id).status == RunStatus.COMPLETED
        steps = api.get(f"/runs/{run_id}").json()["steps"]
        for step in (s for s in steps if s["kind"] == StepKind.MODEL):
            manifest = step["context_manifest"]
            assert manifest["estimated_tokens"] <= WINDOW, manifest
            # One contiguous stretch of the history: from just after the summary to the newest message then.
            (first, last), = manifest["message_seq_ranges"]
            assert manifest["summary_through_seq"] and first == manifest["summary_through_seq"] + 1
            assert last == Message.objects.filter(session=session, seq__lte=last).order_by("-seq").values_list(
                "seq", flat=True).first()

    summaries = list(ContextSummary.objects.filter(session=session).order_by("covers_through_seq"))
    assert summaries, "the older history was summarized"
    assert "1000" in summaries[0].content  # the summary holds what the window dropped (the first order)
    assert Message.objects.filter(session=session).count() > 300  # nothing was rewritten or removed
    used = {s.context_manifest.get("summary_id") for s in Step.objects.filter(run__session=session, kind=StepKind.MODEL)}
    assert used <= {s.pk for s in summaries}


def test_a_retried_post_with_the_same_idempotency_key_does_nothing_twice():
    user = UserFactory(username="retrying-client")
    api = _api(user)
    key = str(uuid.uuid4())
    session = api.post("/sessions", {"title": "once"}, HTTP_IDEMPOTENCY_KEY=key).json()
    again = api.post("/sessions", {"title": "once"}, HTTP_IDEMPOTENCY_KEY=key)
    assert again.json()["id"] == session["id"] and again["Idempotent-Replayed"] == "true"
    assert Session.objects.filter(owner=user).count() == 1

    message_key = str(uuid.uuid4())
    body = {"content": "What's the weather in Paris?"}
    first = api.post(f"/sessions/{session['id']}/messages", body, HTTP_IDEMPOTENCY_KEY=message_key)
    second = api.post(f"/sessions/{session['id']}/messages", body, HTTP_IDEMPOTENCY_KEY=message_key)
    assert (first.status_code, second.status_code) == (201, 201)
    assert second.json() == first.json() and second["Idempotent-Replayed"] == "true"
    run_id = first.json()["run"]["id"]
    drive_until(run_id, RunStatus.COMPLETED)
    assert Run.objects.filter(session_id=session["id"]).count() == 1
    assert Message.objects.filter(session_id=session["id"], role=MessageRole.USER).count() == 1
    assert not PendingInput.objects.filter(session_id=session["id"]).exists()

    other = api.post(f"/sessions/{session['id']}/messages", {"content": "something else"},
                     HTTP_IDEMPOTENCY_KEY=message_key)
    assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"
    refused = api.post(f"/sessions/{session['id']}/messages", {"content": ""}, HTTP_IDEMPOTENCY_KEY="k-422")
    replayed = api.post(f"/sessions/{session['id']}/messages", {"content": ""}, HTTP_IDEMPOTENCY_KEY="k-422")
    assert refused.status_code == replayed.status_code == 422 and replayed["Idempotent-Replayed"] == "true"
    bad = api.post("/sessions", {"title": "x"}, HTTP_IDEMPOTENCY_KEY="x" * 256)
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_idempotency_key"
    # Keys belong to their caller: another client's same key is a request of its own.
    stranger = _api(UserFactory(username="stranger")).post("/sessions", {"title": "once"}, HTTP_IDEMPOTENCY_KEY=key)
    assert stranger.status_code == 201 and stranger.json()["id"] != session["id"]


def test_retention_archives_then_erases_idle_sessions_through_one_audited_path(tmp_path):
    customer = UserFactory(username="forgettable")
    api = _api(customer)
    done = api.post("/sessions", {"title": "done"}).json()
    run_id = api.post(f"/sessions/{done['id']}/messages", {"content": "What's the weather in Paris?"}).json()["run"]["id"]
    drive_until(run_id, RunStatus.COMPLETED)
    busy = api.post("/sessions", {"title": "busy"}).json()
    busy_run = api.post(f"/sessions/{busy['id']}/messages", {"content": "Refund order 9527"}).json()["run"]["id"]
    drive_until(busy_run, RunStatus.WAITING, WaitReason.APPROVAL)
    operator = UserFactory(username="dpo", is_staff=True)
    archive = tmp_path / "erased.jsonl"

    printed = io.StringIO()
    call_command("erase_sessions", "--user", "forgettable", "--archive", str(archive), "--by", "dpo",
                 "--reason", "erasure request #42", stdout=printed)

    assert not Session.objects.filter(pk=done["id"]).exists()
    assert not Run.objects.filter(pk=run_id).exists() and not Message.objects.filter(session_id=done["id"]).exists()
    assert Session.objects.filter(pk=busy["id"]).exists() and Run.objects.get(pk=busy_run).status == RunStatus.WAITING
    assert f"left {busy['id']}" in printed.getvalue()
    (record,) = [json.loads(line) for line in archive.read_text().splitlines()]
    assert record["session"]["id"] == done["id"] and record["runs"][0]["id"] == run_id
    assert any("weather in Paris" in m["content"] for m in record["messages"])
    entry = AuditEntry.objects.get(action="erase", object_id=done["id"])
    assert entry.actor == operator and entry.note == "erasure request #42" and entry.before["runs"] == 1
    # Outside that path history stays append-only.
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM sessions_app_message WHERE session_id = %s", [busy["id"]])
