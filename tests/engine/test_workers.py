"""The engine with real django-q2 worker processes, a real web server for the simulated
payment service, and the sweeper — no sync mode, no mocks."""

import signal

import pytest
from django.utils import timezone
from django_q.models import OrmQ, Task

from approvals_app.models import Approval, ApprovalStatus
from operations.models import ProcessHeartbeat
from runs_app.models import Run, RunEvent, RunStatus, Step, WaitReason
from sessions_app.models import MessageRole
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from engine.queue import ADVANCE_RUN_TASK
from tests.support.factories import UserFactory
from tests.support.processes import wait_for
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def _post(text: str, **kwargs):
    user = UserFactory()
    session = session_open(owner=user, title="test")
    return message_post(session=session, content=text, acting_user=user, **kwargs).run


def _status(run_id):
    return Run.objects.values_list("status", flat=True).get(pk=run_id)


def _claims(run_id):
    return list(RunEvent.objects.filter(run_id=run_id, type="run_status", payload__status="running", payload__phase="preparing_context"))


def _seqs_gap_free(run_id):
    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    return seqs == list(range(1, len(seqs) + 1))


def test_weather_question_completes_through_real_workers(procs, demo_world):
    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    run = _post("What's the weather in Paris?")
    wait_for(lambda: _status(run.id) in ("completed", "failed"), message="the run to finish")
    stored = Run.objects.get(pk=run.id)
    assert stored.status == RunStatus.COMPLETED, stored.error_detail
    call = ToolCall.objects.get(run=run)
    assert call.tool_name == "get_weather" and call.status == ToolCallStatus.SUCCEEDED
    answer = stored.messages.filter(role=MessageRole.ASSISTANT).order_by("-seq").first()
    assert "Paris" in answer.content
    assert _seqs_gap_free(run.id)
    # The model step saw the history it was given, recorded beside it.
    model_steps = Step.objects.filter(run=run, kind="model", status="completed").order_by("index")
    assert model_steps.count() == 2
    (first_seen,), (last_seen,) = (s.context_manifest["message_seq_ranges"] for s in (model_steps.first(), model_steps.last()))
    assert first_seen[0] == last_seen[0] and last_seen[1] > first_seen[1]  # the same history and what the run added
    # The slice's task was acknowledged (its queue row deleted) and, having succeeded, left no row in
    # django-q2's task history: the run's own rows are its record (engine/queue.py).
    wait_for(lambda: not OrmQ.objects.exists(), message="the task's acknowledgement")
    assert not Task.objects.filter(func=ADVANCE_RUN_TASK).exists()


def test_refund_request_stops_at_operator_approval(procs, demo_world):
    from demo.selectors import sim_refund_count

    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    run = _post("Check order 9527 and refund it if it's eligible")
    wait_for(lambda: _status(run.id) in ("waiting", "completed", "failed"), message="the run to suspend")
    stored = Run.objects.get(pk=run.id)
    assert (stored.status, stored.wait_reason) == (RunStatus.WAITING, WaitReason.APPROVAL)
    calls = {c.tool_name: c for c in ToolCall.objects.filter(run=run)}
    assert calls["query_order"].status == ToolCallStatus.SUCCEEDED
    refund = calls["execute_refund"]
    assert refund.status == ToolCallStatus.PENDING and refund.idempotency_key
    approval = Approval.objects.get(tool_call=refund)
    assert approval.status == ApprovalStatus.PENDING and stored.request_id == str(approval.id)
    assert sim_refund_count(order_id="9527") == 0
    assert not stored.lease_owner


def test_two_workers_racing_for_one_run_exactly_one_drives_it(procs, demo_world):
    from django_q.tasks import async_task

    procs.start_web(simulator=True)
    procs.start_workers("cluster-a", workers=1)
    procs.start_workers("cluster-b", workers=1)
    run = _post("What's the weather in Rome?")
    for _ in range(5):  # duplicate deliveries: the queue may hand a task out more than once
        async_task("runs_app.tasks.advance_run", str(run.id))
    wait_for(lambda: _status(run.id) in ("completed", "failed"), message="the run to finish")
    assert _status(run.id) == RunStatus.COMPLETED
    claims = _claims(run.id)
    assert len(claims) == 1
    owners = {s.lease_token for s in Step.objects.filter(run=run)}
    assert owners == {claims[0].payload["lease_token"]}
    assert ToolCall.objects.filter(run=run).count() == 1
    assert _seqs_gap_free(run.id)


def test_a_killed_workers_run_is_taken_over_after_lease_expiry(procs, demo_world):
    procs.start_web(simulator=True)
    # This cluster's workers SIGKILL themselves in the middle of a model stream.
    procs.start_workers("doomed", workers=1, env={"WARDEN_FAULT_POINTS": "mid_model_stream=die"})
    run = _post("What's the weather in Oslo?", provider_options={"delay": 0.06})
    wait_for(
        lambda: Run.objects.filter(pk=run.id, status=RunStatus.RUNNING, lease_expires_at__lt=timezone.now()).exists(),
        message="the doomed worker to die holding the lease",
    )
    procs.stop("doomed")
    procs.start_workers("survivor", workers=1)
    procs.start_sweeper()
    wait_for(lambda: _status(run.id) in ("completed", "failed"), message="the takeover to finish the run")
    stored = Run.objects.get(pk=run.id)
    assert stored.status == RunStatus.COMPLETED, stored.error_detail
    revoked = RunEvent.objects.get(run=run, type="run_status", payload__reason="lease expired")
    assert revoked.payload["previous_lease_token"] == 1
    assert RunEvent.objects.filter(run=run, type="step_discarded").exists()
    assert len(_claims(run.id)) == 2
    assert _seqs_gap_free(run.id)


def test_a_stalled_worker_resumed_after_takeover_writes_nothing(procs, demo_world):
    procs.start_web(simulator=True)
    procs.start_workers("stalled", workers=1)
    run = _post("What's the weather in Lisbon?", provider_options={"delay": 0.3})
    wait_for(
        lambda: Step.objects.filter(run=run, kind="model", status="running").exclude(streamed_text="").exists(),
        message="the first worker to be mid-stream",
    )
    procs.signal("stalled", signal.SIGSTOP)
    stalled_token = Run.objects.get(pk=run.id).lease_token
    procs.start_workers("successor", workers=1, env={"WARDEN_SCRIPTED_DELAY_SECONDS": "0"})
    procs.start_sweeper()
    wait_for(lambda: _status(run.id) in ("completed", "failed"), timeout=90, message="the successor to finish the run")
    snapshot = (
        list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type")),
        list(Step.objects.filter(run=run).order_by("index").values_list("index", "status", "lease_token")),
        Run.objects.get(pk=run.id).messages.count(),
    )
    procs.signal("stalled", signal.SIGCONT)
    # A worker process drives its runs in threads of its own (engine/executor.py): a slice's outcome
    # is in the process's counters, which its heartbeat records.
    wait_for(lambda: ProcessHeartbeat.objects.filter(counters__has_key="tasks:lease-lost").exists(),
             timeout=90, message="the resumed worker to notice it lost the lease")
    after = (
        list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type")),
        list(Step.objects.filter(run=run).order_by("index").values_list("index", "status", "lease_token")),
        Run.objects.get(pk=run.id).messages.count(),
    )
    assert after == snapshot
    assert Run.objects.get(pk=run.id).status == RunStatus.COMPLETED
    assert Run.objects.get(pk=run.id).lease_token > stalled_token
    assert _seqs_gap_free(run.id)


def test_weather_and_refund_flows_through_the_openai_provider(procs, demo_world):
    """The same flows with the `openai` provider, against a local server speaking the real
    Chat Completions streaming wire format (SSE chunks, tool-call fragments, usage)."""
    import sys

    from django.test import override_settings

    from tests.support.processes import free_port

    port = free_port()
    procs.start("fake-openai", [sys.executable, "-m", "tests.support.fake_openai_server", "--port", str(port)])
    procs.start_web(simulator=True)
    procs.start_workers(workers=2, env={"OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "test"})
    with override_settings(WARDEN_MODEL_PROVIDER="openai"):
        weather = _post("What's the weather in Paris?")
        refund = _post("Check order 9527 and refund it if it's eligible")
    assert weather.provider == refund.provider == "openai"
    wait_for(lambda: _status(weather.id) in ("completed", "failed"), message="the weather run to finish")
    wait_for(lambda: _status(refund.id) in ("waiting", "completed", "failed"), message="the refund run to suspend")
    stored = Run.objects.get(pk=weather.id)
    assert stored.status == RunStatus.COMPLETED, stored.error_detail
    assert "Paris" in stored.messages.filter(role=MessageRole.ASSISTANT).order_by("-seq").first().content
    assert stored.tokens_used > 0  # usage arrived through the stream
    stored = Run.objects.get(pk=refund.id)
    assert (stored.status, stored.wait_reason) == (RunStatus.WAITING, WaitReason.APPROVAL)
    assert ToolCall.objects.get(run=refund, tool_name="execute_refund").status == ToolCallStatus.PENDING
