"""What SPEC §16 promises, through the HTTP API and runs driven as worker tasks drive them (in this
process: tests/support/drive.py — the behaviour of one run needs no worker process): a run that
asks the user waits for the answer and resumes; a question nobody answers expires cleanly; an
addition made while the run works is answered with the request; a tool's declared timeout is
enforced; time waiting for a person does not use up the run's deadline; a failed run is retried
from its checkpoint without repeating an applied write."""

import importlib
import sys
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from approvals_app.models import Approval, ApprovalStatus
from engine.sweeper import sweep_once
from runs_app.models import Run, RunEvent, RunStatus, WaitReason
from demo import model as demo_model
from sessions_app.models import Message, MessageRole
from engine.actions.sessions import session_open
from tests.support.factories import ApiKeyFactory, UserFactory
from tests.support.api import Api
from tests.support.drive import drive_until
from demo.selectors import sim_refund_count
from tools_app import registry
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("simulator", "demo_world")]




@pytest.fixture
def slow_tools():
    """The tools that overrun their declared timeout, registered as WARDEN_TOOL_MODULES would (and
    taken out again afterwards, so no other test sees them)."""
    saved = dict(registry._REGISTRY)
    if "tests.support.slow_tools" in sys.modules:
        importlib.reload(sys.modules["tests.support.slow_tools"])
    else:
        importlib.import_module("tests.support.slow_tools")
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    registry._SCHEMAS = None


@pytest.fixture
def operator(transactional_db):
    user = UserFactory(username="spec-operator", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval", "view_run"]))
    return user


def _run_status(run_id) -> tuple[str, str]:
    run = Run.objects.get(pk=run_id)
    return run.status, run.wait_reason


def _statuses(run_id) -> list[tuple[str, str]]:
    return [(e.payload["status"], e.payload.get("wait_reason", ""))
            for e in RunEvent.objects.filter(run_id=run_id, type="run_status").order_by("seq")]


def test_a_run_asks_for_what_only_the_user_knows_and_the_reply_resumes_the_same_run(operator):
    customer = UserFactory(username="asker")
    api, desk = Api(ApiKeyFactory(owner=customer).secret), Api(ApiKeyFactory(owner=operator).secret)
    session = api.post("/sessions", {"title": "refund"}).json()

    started = api.post(f"/sessions/{session['id']}/messages", {"content": "I want a refund"})
    assert started.status_code == 201
    run_id = started.json()["run"]["id"]
    drive_until(run_id, RunStatus.WAITING, WaitReason.WAITING_INPUT)
    detail = api.get(f"/runs/{run_id}").json()
    assert detail["wait"]["clock"] == "question_expiry" and detail["wait"]["deadline_paused"] is True
    asked = RunEvent.objects.get(run_id=run_id, type="input_requested").payload
    assert "order number" in asked["question"]

    answered = api.post(f"/sessions/{session['id']}/messages", {"content": "9527"})
    assert answered.status_code == 202
    assert answered.json()["disposition"] == "answered" and answered.json()["run"]["id"] == run_id

    drive_until(run_id, RunStatus.WAITING, WaitReason.APPROVAL)
    approval = Approval.objects.get(run_id=run_id)
    assert desk.post(f"/approvals/{approval.pk}/decision", {"decision": "approve", "note": "ok"}).status_code == 200
    drive_until(run_id, RunStatus.COMPLETED)

    assert Run.objects.filter(session_id=session["id"]).count() == 1  # the reply resumed the run, started none
    assert (RunStatus.WAITING, WaitReason.WAITING_INPUT) in _statuses(run_id)
    assert sim_refund_count(order_id="9527") == 1
    question = ToolCall.objects.get(run_id=run_id, tool_name="ask_user")
    assert question.status == ToolCallStatus.SUCCEEDED and question.result == {"answer": "9527"}
    assert Message.objects.filter(session_id=session["id"], role=MessageRole.USER, content="9527", run_id=run_id).exists()


def test_a_question_nobody_answers_expires_and_the_run_ends_cleanly(settings):
    settings.WARDEN_INPUT_TTL_SECONDS = 1
    api = Api(ApiKeyFactory(owner=UserFactory(username="silent")).secret)
    session = api.post("/sessions", {"title": "refund"}).json()
    run_id = api.post(f"/sessions/{session['id']}/messages", {"content": "I want a refund"}).json()["run"]["id"]

    drive_until(run_id, RunStatus.COMPLETED)

    question = ToolCall.objects.get(run_id=run_id, tool_name="ask_user")
    assert question.status == ToolCallStatus.FAILED and question.error_code == "input_expired"
    assert Message.objects.filter(run_id=run_id, role=MessageRole.ASSISTANT, content=demo_model.NO_ANSWER_TEXT).exists()
    assert (RunStatus.WAITING, WaitReason.WAITING_INPUT) in _statuses(run_id)


def test_an_addition_made_while_the_run_works_is_answered_with_the_request():
    api = Api(ApiKeyFactory(owner=UserFactory(username="adder")).secret)
    session = api.post("/sessions", {"title": "two things"}).json()
    first = api.post(f"/sessions/{session['id']}/messages", {"content": "What's the weather in Paris?"}).json()
    run_id = first["run"]["id"]
    added = api.post(f"/sessions/{session['id']}/messages", {"content": "Also check order 9528", "mode": "auto"})
    assert added.status_code == 202 and added.json()["run"]["id"] == run_id

    drive_until(run_id, RunStatus.COMPLETED)

    answer = Message.objects.filter(run_id=run_id, role=MessageRole.ASSISTANT).exclude(content="").order_by("-seq").first()
    assert "weather in Paris" in answer.content and "Order 9528" in answer.content, answer.content
    assert {c.tool_name for c in ToolCall.objects.filter(run_id=run_id)} == {"get_weather", "query_order"}


def test_a_tools_declared_timeout_is_enforced(slow_tools, settings):
    settings.WARDEN_RECONCILE_GRACE_SECONDS = 2
    user = UserFactory(username="patient")
    session = session_open(owner=user, title="slow tools")
    from engine.actions.messages import message_post

    turns = [{"calls": [{"name": "slow_lookup", "arguments": {"key": "a"}}]},
             {"calls": [{"name": "slow_write", "arguments": {"key": "b"}}]},
             {"text": "Done."}]
    run = message_post(session=session, content="slow things", acting_user=user,
                       provider_options={"delay": 0, "turns": turns}).run

    # The hung write neither holds the worker nor is retried: it is `unknown`, then reconciled.
    drive_until(run.pk, RunStatus.COMPLETED, timeout=120)
    lookup = ToolCall.objects.get(run=run, tool_name="slow_lookup")
    assert lookup.status == ToolCallStatus.SUCCEEDED and lookup.attempts == 2 and lookup.result == {"key": "a", "attempt": 2}
    write = ToolCall.objects.get(run=run, tool_name="slow_write")
    assert write.attempts == 1 and write.status == ToolCallStatus.FAILED and write.resolution == "not_applied"
    went_unknown = [e.payload for e in RunEvent.objects.filter(run=run, type="tool_call", payload__tool="slow_write")
                    if e.payload["status"] == "unknown"]
    assert went_unknown and went_unknown[0]["error_code"] == "tool_timeout"
    # The worker kept its lease meanwhile: the run was never handed to another one.
    assert not RunEvent.objects.filter(run=run, type="run_status", payload__reason="lease expired").exists()


def test_waiting_for_a_person_does_not_use_up_the_runs_deadline(operator):
    api, desk = Api(ApiKeyFactory(owner=UserFactory(username="deadline")).secret), Api(ApiKeyFactory(owner=operator).secret)
    session = api.post("/sessions", {"title": "refund"}).json()
    run_id = api.post(f"/sessions/{session['id']}/messages", {"content": "Refund order 9527"}).json()["run"]["id"]
    drive_until(run_id, RunStatus.WAITING, WaitReason.APPROVAL)
    detail = api.get(f"/runs/{run_id}").json()
    approval = Approval.objects.get(run_id=run_id)
    assert detail["wait"]["clock"] == "approval_expiry" and detail["wait"]["deadline_paused"] is True
    assert detail["wait"]["ends_at"][:19] == approval.expires_at.isoformat()[:19]

    # The run's own clock runs out while the operator thinks: the sweeper must not fail it.
    waited_since = Run.objects.get(pk=run_id).wait_started_at
    Run.objects.filter(pk=run_id).update(deadline=timezone.now() - timedelta(seconds=1), wait_started_at=waited_since - timedelta(hours=2))
    assert sweep_once()["deadlines_failed"] == 0
    assert _run_status(run_id) == (RunStatus.WAITING, WaitReason.APPROVAL)

    assert desk.post(f"/approvals/{approval.pk}/decision", {"decision": "approve", "note": "ok"}).status_code == 200
    drive_until(run_id, RunStatus.COMPLETED)
    assert Run.objects.get(pk=run_id).deadline > timezone.now() + timedelta(minutes=90)  # the wait was given back
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.APPROVED


def test_a_failed_run_is_retried_from_its_checkpoint_without_repeating_the_refund(operator):
    customer = UserFactory(username="retrier")
    session = session_open(owner=customer, title="refund")
    from engine.actions.messages import message_post

    refund = {"order_id": "9527", "amount": "25.00", "reason": "customer request"}
    turns = [{"calls": [{"name": "query_order", "arguments": {"order_id": "9527"}}]},
             {"calls": [{"name": "execute_refund", "arguments": refund}]},
             {"text": "Done: refunded."}]
    run = message_post(session=session, content="Refund order 9527", acting_user=customer, budgets={"max_model_calls": 2},
                       provider_options={"delay": 0, "turns": turns}).run
    drive_until(run.pk, RunStatus.WAITING, WaitReason.APPROVAL)
    desk = Api(ApiKeyFactory(owner=operator).secret)
    approval = Approval.objects.get(run=run)
    assert desk.post(f"/approvals/{approval.pk}/decision", {"decision": "approve", "note": "ok"}).status_code == 200
    drive_until(run.pk, RunStatus.FAILED)  # the refund was booked, then the call budget ran out
    failed = Run.objects.get(pk=run.pk)
    assert failed.error_code == "budget_model_calls", (failed.error_code, failed.error_detail,
                                                       list(ToolCall.objects.filter(run=run).values_list("tool_name", "status", "error_code", "error_detail")))
    assert sim_refund_count(order_id="9527") == 1, list(ToolCall.objects.filter(run=run).values_list("tool_name", "status", "result", "arguments"))

    retried = Api(ApiKeyFactory(owner=customer).secret).post(f"/runs/{run.pk}/retry",
                                                             {"reason": "try again", "budgets": {"max_model_calls": 5}})
    assert retried.status_code == 201, retried.content
    retry_id = retried.json()["id"]
    drive_until(retry_id, RunStatus.COMPLETED)

    assert sim_refund_count(order_id="9527") == 1  # the retry reused the applied refund
    again = ToolCall.objects.get(run_id=retry_id, tool_name="execute_refund")
    original = ToolCall.objects.get(run=run, tool_name="execute_refund")
    assert again.reused_from_id == original.pk and again.status == ToolCallStatus.SUCCEEDED
    assert not Approval.objects.filter(run_id=retry_id).exists()  # nothing new to approve
    assert Run.objects.get(pk=retry_id).retry_of_id == run.pk
    from approvals_app.models import AuditEntry

    audit = AuditEntry.objects.get(action="retry", object_id=str(run.pk))
    assert audit.actor == customer and audit.after == {"retry": retry_id}
    assert Api(ApiKeyFactory(owner=customer).secret).get(f"/runs/{run.pk}").json()["retries"] == [retry_id]
