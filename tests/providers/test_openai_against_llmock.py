"""The OpenAI-compatible provider against a server we did not write: LLMock (a third-party chaos
server for LLM clients, installed with the test extras, a process of its own), driven over its own
HTTP control API, with the runs driven as worker tasks drive them (in this process:
tests/support/drive.py). What a server reports is charged; a length cut asks
again with a larger limit or fails fast; invalid output backs off and stops early; transient errors
do not spend the call budget; 409 is retried as the official SDK would."""

import shutil
import sys
from pathlib import Path

import httpx
import pytest

from engine.actions.messages import message_post
from runs_app.models import Run, RunErrorCode, RunEvent, RunStatus, Step, StepKind, StepStatus
from engine.actions.sessions import session_open
from tests.support.factories import UserFactory
from tests.support.drive import drive_to_end
from tests.support.processes import free_port, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def llmock(procs):
    """LLMock on a port of its own: `scenario(...)` queues behaviours, `requests()` is its journal."""
    port = free_port()
    executable = shutil.which("llmock", path=str(Path(sys.executable).parent))
    procs.start("llmock", [executable, "serve", "--host", "127.0.0.1", "--port", str(port), "--tool-mode", "off",
                           "--response-style", "static"])
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=10)

    def up() -> bool:
        try:
            return client.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=60, message="LLMock to answer")

    class Control:
        base_url = f"http://127.0.0.1:{port}/v1"

        def scenario(self, *behaviors: dict) -> None:
            assert client.post("/_llmock/scenario", json={"behaviors": list(behaviors)}).status_code == 201

        def requests(self) -> list[dict]:
            return [r for r in client.get("/_llmock/requests").json()["requests"] if r["path"].endswith("/chat/completions")]

    yield Control()
    client.close()


def _start(llmock, settings, *, budgets=None, options=None, **overrides) -> Run:
    """A run of the openai provider against LLMock (settings `overrides` as a deployment's environment)."""
    settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.WARDEN_MODEL_PROVIDER = llmock.base_url, "llmock", "openai"
    settings.WARDEN_RETRY_BASE_SECONDS = 0.1
    for name, value in overrides.items():
        setattr(settings, name, value)
    user = UserFactory(username="llm-user")
    session = session_open(owner=user, title="llmock")
    return message_post(session=session, content="Say hello", acting_user=user, budgets=budgets,
                        provider_options=options or {}).run


def _model_steps(run: Run):
    return list(Step.objects.filter(run=run, kind=StepKind.MODEL).order_by("index"))


def test_every_token_the_server_reports_is_charged_rejected_output_included(llmock, settings):
    llmock.scenario({"type": "reply", "text": "cut off mid", "finish_reason": "content_filter"})
    run = drive_to_end(_start(llmock, settings))

    assert run.status == RunStatus.COMPLETED
    steps = _model_steps(run)
    assert [s.status for s in steps] == [StepStatus.DISCARDED, StepStatus.COMPLETED]
    assert all(s.input_tokens > 0 and s.output_tokens > 0 for s in steps)
    assert run.tokens_used == sum(s.input_tokens + s.output_tokens for s in steps)


def test_a_length_cut_asks_again_with_a_larger_limit(llmock, settings):
    llmock.scenario({"type": "reply", "text": "too long for", "finish_reason": "length"})
    run = drive_to_end(_start(llmock, settings, options={"max_tokens": 100}))

    assert run.status == RunStatus.COMPLETED
    assert [r["body"]["max_tokens"] for r in llmock.requests()] == [100, 200]


def test_a_length_cut_at_the_largest_limit_fails_fast_with_its_own_code(llmock, settings):
    llmock.scenario({"type": "reply", "text": "never fits", "finish_reason": "length", "times": None})
    run = drive_to_end(_start(llmock, settings, options={"max_tokens": 100}, WARDEN_MODEL_MAX_OUTPUT_TOKENS_CEILING=200))

    assert (run.status, run.error_code) == (RunStatus.FAILED, RunErrorCode.OUTPUT_TRUNCATED)
    assert [r["body"]["max_tokens"] for r in llmock.requests()] == [100, 200]


def test_the_same_invalid_output_again_stops_the_run_early(llmock, settings):
    bad = {"type": "reply", "tool_calls": [{"name": "transfer_all_funds", "arguments": {"to": "x"}}], "times": None}
    llmock.scenario(bad)
    run = drive_to_end(_start(llmock, settings, budgets={"max_model_calls": 20}))

    assert (run.status, run.error_code) == (RunStatus.FAILED, RunErrorCode.INVALID_OUTPUT)
    assert "twice in a row" in run.error_detail
    assert len(llmock.requests()) == 2  # not the whole budget of 20


def test_invalid_output_backs_off_before_asking_a_third_time(llmock, settings):
    # Two different rejections (one behaviour of a kind per request, in order), then a good answer.
    llmock.scenario({"type": "reply", "text": "cut", "finish_reason": "content_filter"},
                    {"type": "reply", "tool_calls": [{"name": "transfer_all_funds", "arguments": {"to": "x"}}]})
    run = drive_to_end(_start(llmock, settings, WARDEN_MAX_INVALID_OUTPUTS=5, WARDEN_RETRY_BASE_SECONDS=0.2))

    assert run.status == RunStatus.COMPLETED, run.error_detail
    waits = [e.payload for e in RunEvent.objects.filter(run=run, type="run_status", payload__wait_reason="retry_backoff")]
    assert len(waits) == 1 and waits[0]["error"].startswith("rejected output"), (
        [(s.status, s.discard_reason) for s in _model_steps(run)], [r["status"] for r in llmock.requests()])
    assert len(llmock.requests()) == 3


def test_transient_errors_do_not_spend_the_call_budget(llmock, settings):
    llmock.scenario({"type": "fail", "status": 503, "times": None})
    run = drive_to_end(_start(llmock, settings, budgets={"max_model_calls": 2}, WARDEN_MAX_MODEL_RETRIES=3))

    assert (run.status, run.error_code) == (RunStatus.FAILED, RunErrorCode.MODEL_RETRIES)
    assert len(llmock.requests()) == 4  # the first call and three retries, on a budget of two calls


def test_a_conflict_is_retried_and_retry_after_is_honoured(llmock, settings):
    llmock.scenario({"type": "fail", "status": 409, "times": 1}, {"type": "fail", "status": 429, "retry_after": 1, "times": 1})
    run = drive_to_end(_start(llmock, settings))

    assert run.status == RunStatus.COMPLETED
    calls = llmock.requests()
    assert [c["status"] for c in calls] == [409, 429, 200]
    assert calls[2]["started_at"] - calls[1]["ended_at"] >= 1.0  # it waited as long as Retry-After asked
