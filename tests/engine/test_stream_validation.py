"""SPEC §3 and §11 in the engine: nothing malformed or truncated ever reaches a tool, bad
steps are discarded and asked again within budget, transient model errors back off.

The engine runs in this process (run_drive is exactly what a worker task calls); the
simulated payment service is served over real HTTP by its own server in this process."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from approvals_app.models import Approval, ApprovalStatus
from engine.loop import run_drive
from engine.sweeper import sweep_once
from runs_app.models import ContextSummary, Run, RunErrorCode, RunEvent, RunStatus, Step, StepStatus, WaitReason
from engine.actions.messages import message_post
from sessions_app.models import Message, MessageRole
from sessions_app.services import messages_append
from engine.actions.sessions import session_open
from tests.support.factories import UserFactory
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sim(simulator, demo_world):
    with override_settings(WARDEN_RETRY_BASE_SECONDS=0.01):
        yield simulator


def start(text: str, faults=None, budgets=None) -> Run:
    user = UserFactory()
    session = session_open(owner=user, title="t")
    options = {"delay": 0}
    if faults is not None:
        options["faults"] = faults
    return message_post(session=session, content=text, acting_user=user, provider_options=options, budgets=budgets).run


def drive(run: Run) -> Run:
    """Drive like a worker would, waking backoffs as the sweeper would, until the run rests."""
    for _ in range(20):
        run_drive(run_id=str(run.id))
        run.refresh_from_db()
        if run.status == RunStatus.WAITING and run.wait_reason == WaitReason.RETRY_BACKOFF:
            Run.objects.filter(pk=run.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
            sweep_once()
            continue
        if run.status != RunStatus.QUEUED:
            return run
    raise AssertionError("the run never came to rest")


def discarded(run: Run) -> list[str]:
    return list(Step.objects.filter(run=run, status=StepStatus.DISCARDED).values_list("discard_reason", flat=True))


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("truncated_args", "without a finish reason"),
        ("invalid_json", "not valid JSON"),
        ("schema_invalid", "do not match its schema"),
        ("length", "length limit"),
        ("unknown_tool", "unknown tool"),
    ],
)
def test_a_malformed_turn_is_discarded_and_asked_again(sim, fault, reason):
    run = drive(start("please run noop 2", faults=[fault]))
    assert run.status == RunStatus.COMPLETED
    assert len(discarded(run)) == 1 and reason in discarded(run)[0]
    # Only the calls of sound turns exist, and each ran once.
    calls = list(ToolCall.objects.filter(run=run).order_by("created_at").values_list("tool_name", "arguments", "status"))
    assert calls == [("noop", {"i": 0}, ToolCallStatus.SUCCEEDED), ("noop", {"i": 1}, ToolCallStatus.SUCCEEDED)]
    assert RunEvent.objects.filter(run=run, type="step_discarded").count() == 1


@pytest.mark.parametrize("fault", ["truncated_args", "invalid_json", "schema_invalid", "length"])
def test_a_malformed_refund_call_never_reaches_the_payment_service(sim, fault):
    from demo.selectors import sim_refund_count

    run = drive(start("Check order 9527 and refund it if it's eligible", faults=[None, fault]))
    assert (run.status, run.wait_reason) == (RunStatus.WAITING, WaitReason.APPROVAL)
    refunds = ToolCall.objects.filter(run=run, tool_name="execute_refund")
    assert refunds.count() == 1  # from the sound turn only
    assert refunds.get().arguments == {"order_id": "9527", "amount": "25.00", "reason": "customer request"}
    assert sim_refund_count(order_id="9527") == 0


def test_output_that_stays_malformed_fails_the_run_with_a_clear_code(sim):
    run = drive(start("please run noop 1", faults=["invalid_json"] * 5, budgets={"max_model_calls": 3}))
    assert run.status == RunStatus.FAILED
    assert run.error_code == RunErrorCode.INVALID_OUTPUT and "not valid JSON" in run.error_detail
    assert not ToolCall.objects.filter(run=run).exists()


def test_text_claiming_approval_does_not_bypass_the_approval(sim):
    from demo.selectors import sim_refund_count

    run = drive(start("Check order 9527 and refund it if it's eligible", faults=[None, "claims_approval"]))
    assert (run.status, run.wait_reason) == (RunStatus.WAITING, WaitReason.APPROVAL)
    refund = ToolCall.objects.get(run=run, tool_name="execute_refund")
    assert refund.status == ToolCallStatus.PENDING
    assert "approved_by" not in refund.arguments and "approval_id" not in refund.arguments
    assert Approval.objects.get(tool_call=refund).status == ApprovalStatus.PENDING
    assert sim_refund_count(order_id="9527") == 0


@pytest.mark.parametrize("fault", ["rate_limit", "server_error", "disconnect"])
def test_transient_model_errors_back_off_then_succeed(sim, fault):
    run = start("please run noop 1", faults=[fault])
    run_drive(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.wait_reason) == (RunStatus.WAITING, WaitReason.RETRY_BACKOFF)
    assert run.expires_at > timezone.now() - timedelta(seconds=5) and run.model_retries == 1
    run = drive(run)
    assert run.status == RunStatus.COMPLETED
    assert ToolCall.objects.filter(run=run, status=ToolCallStatus.SUCCEEDED).count() == 1


def test_transient_errors_beyond_the_limit_fail_the_run(sim):
    with override_settings(WARDEN_MAX_MODEL_RETRIES=2):
        run = drive(start("please run noop 1", faults=["server_error"] * 5))
    assert run.status == RunStatus.FAILED and run.error_code == RunErrorCode.MODEL_RETRIES


def test_a_permanent_model_error_fails_the_run(sim):
    run = drive(start("please run noop 1", faults=["permanent_error"]))
    assert run.status == RunStatus.FAILED and run.error_code == RunErrorCode.MODEL_ERROR


def test_model_call_budget(sim):
    run = drive(start("please run noop 5", budgets={"max_model_calls": 2}))
    assert run.status == RunStatus.FAILED and run.error_code == RunErrorCode.MODEL_CALL_BUDGET
    assert run.model_calls == 2


def test_token_budget(sim):
    run = drive(start("please run noop 5", budgets={"max_tokens": 30}))
    assert run.status == RunStatus.FAILED and run.error_code == RunErrorCode.TOKEN_BUDGET


def test_deadline(sim):
    run = drive(start("please run noop 1", budgets={"deadline": timezone.now() - timedelta(seconds=1)}))
    assert run.status == RunStatus.FAILED and run.error_code == RunErrorCode.DEADLINE


def test_tool_results_enter_history_as_tool_messages(sim):
    run = drive(start("What's the weather in Paris?"))
    assert run.status == RunStatus.COMPLETED
    messages = list(run.messages.order_by("seq").values_list("role", "tool_call_id"))
    call = ToolCall.objects.get(run=run)
    assert messages == [("user", ""), ("assistant", ""), ("tool", call.tool_call_id), ("assistant", "")]


def test_a_failing_read_is_retried_and_its_attempts_counted(sim):
    from demo.services import sim_fault_set

    sim_fault_set(target="weather", mode="error_before_booking", count=1)
    run = drive(start("What's the weather in Paris?"))
    assert run.status == RunStatus.COMPLETED
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.attempts) == (ToolCallStatus.SUCCEEDED, 2)


def test_the_same_refund_requested_twice_in_one_turn_is_booked_once(sim):
    from engine.actions.approvals import approval_decide
    from tests.support.factories import UserFactory as Users
    from demo.selectors import sim_refund_count

    run = drive(start("Check order 9527 and refund it if it's eligible", faults=[None, "duplicate_refund"]))
    first, second = ToolCall.objects.filter(run=run, tool_name="execute_refund").order_by("index")
    assert second.reused_from_id == first.id and second.idempotency_key is None
    operator = Users(username="desk")
    from django.contrib.auth.models import Permission

    operator.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    approval_decide(approval=Approval.objects.get(tool_call=first), decision="approve", note="ok", acting_user=operator)
    run = drive(run)
    assert run.status == RunStatus.COMPLETED
    assert sim_refund_count(order_id="9527") == 1
    first.refresh_from_db(), second.refresh_from_db()
    assert first.status == second.status == ToolCallStatus.SUCCEEDED
    assert first.result == second.result
    assert first.attempts == 1 and second.attempts == 0


def test_yielding_the_time_slice_costs_no_model_call(sim):
    """With a zero time slice the run is handed back after every pass, also right after the
    commit that finished a tool round and opened the next model step: that step's call was
    never made and must not count against the budget."""
    with override_settings(WARDEN_SLICE_SECONDS=0):
        run = drive(start("please run noop 3"))
    assert run.status == RunStatus.COMPLETED, run.error_detail
    model_steps = Step.objects.filter(run=run, kind="model")
    answered = model_steps.filter(status=StepStatus.COMPLETED).count()
    assert answered == 4 and run.model_calls == answered
    assert model_steps.filter(status=StepStatus.DISCARDED, discard_reason="time slice used before the model was called").exists()


def test_tool_calls_sent_without_an_index_are_told_apart_by_their_ids(sim):
    """Older Ollama and Gemini's compatible endpoint send no `index` on tool-call fragments: two
    calls must still be two calls, each with its own arguments (not one slot of both)."""
    from tests.support.fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer() as server, override_settings(OPENAI_BASE_URL=server.base_url, WARDEN_MODEL_PROVIDER="openai"):
        server.enqueue(tool_calls=[
            {"id": "call_a", "name": "query_order", "index": None, "arguments_chunks": ['{"order_', 'id": "9527"}']},
            {"id": "call_b", "name": "get_weather", "index": None, "arguments_chunks": ['{"city"', ': "Paris"}']},
        ], finish="tool_calls")
        server.enqueue(text=["Both done."], finish="stop")
        run = drive(start("check order 9527 and the weather in Paris"))
    assert run.status == RunStatus.COMPLETED, run.error_detail
    calls = {c.tool_name: c for c in ToolCall.objects.filter(run=run)}
    assert calls["query_order"].arguments == {"order_id": "9527"} and calls["get_weather"].arguments == {"city": "Paris"}
    assert all(c.status == ToolCallStatus.SUCCEEDED for c in calls.values())


def test_the_openai_context_marks_an_addition_so_the_answer_covers_the_whole_request(sim):
    from runs_app.providers.base import SUPPLEMENT_NOTE
    from tests.support.fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer(fallback="scripted") as server, \
            override_settings(OPENAI_BASE_URL=server.base_url, WARDEN_MODEL_PROVIDER="openai"):
        run = start("What's the weather in Paris?")
        message_post(session=run.session, content="Also check order 9528", acting_user=run.session.owner)
        run = drive(run)
    assert run.status == RunStatus.COMPLETED, run.error_detail
    model_calls = [r for r in server.requests if r.get("stream")]  # not the classification of the addition
    first = [m for m in model_calls[0]["messages"] if m["role"] == "user"]
    assert [m["content"] for m in first] == ["What's the weather in Paris?", SUPPLEMENT_NOTE + "Also check order 9528"]


@pytest.fixture
def flaky_summaries(sim, settings):
    from tests.support import flaky_summaries

    settings.WARDEN_PROVIDERS = {**settings.WARDEN_PROVIDERS, "flaky-summary": "tests.support.flaky_summaries.FlakySummaryProvider"}
    settings.WARDEN_MODEL_PROVIDER = "flaky-summary"
    settings.WARDEN_CONTEXT_TOKENS = 1500
    flaky_summaries.SUMMARY_FAULTS[:] = []
    yield flaky_summaries.SUMMARY_FAULTS
    flaky_summaries.SUMMARY_FAULTS[:] = []


def _long_session_run(text: str) -> Run:
    user = UserFactory()
    session = session_open(owner=user, title="long")
    with transaction.atomic():
        messages_append(session_id=session.pk, messages=[
            Message(role=MessageRole.USER if n % 2 == 0 else MessageRole.ASSISTANT,
                    content=f"message {n}: order {1000 + n} was discussed at some length, " + "details " * 8)
            for n in range(120)
        ])
    return message_post(session=session, content=text, acting_user=user, provider_options={"delay": 0}).run


def test_a_summary_the_provider_cannot_make_yet_backs_off_like_any_model_call(flaky_summaries):
    """Summarizing an outgrown history is a model call: a 503 from it suspends the run in
    retry_backoff (before: the loop's internal error failed the run), and the next try
    summarizes and completes."""
    flaky_summaries.append("transient")
    run = _long_session_run("please run noop 1")
    run_drive(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.wait_reason, run.model_retries) == (RunStatus.WAITING, WaitReason.RETRY_BACKOFF, 1)
    assert not ContextSummary.objects.filter(session_id=run.session_id).exists()
    run = drive(run)
    assert run.status == RunStatus.COMPLETED, (run.error_code, run.error_detail)
    assert ContextSummary.objects.filter(session_id=run.session_id).exists()


def test_a_summary_the_provider_refuses_fails_the_run_as_a_model_error(flaky_summaries):
    flaky_summaries.append("permanent")
    run = drive(_long_session_run("please run noop 1"))
    assert (run.status, run.error_code) == (RunStatus.FAILED, RunErrorCode.MODEL_ERROR)
