"""Issue 32's fallback through real django-q2 worker processes and local model servers speaking the
Chat Completions wire format (engine/model_route.py): the agent's endpoint refusing connections, or
answering 500, sends the call to its fallback, and each model step records which endpoint and model
answered and what it cost; both down, the run backs off durably (`waiting / retry_backoff`) and fails
`model_retries_exhausted` once its retries are spent, its error naming both; a 429 with Retry-After
is waited out on the agent's own endpoint before anything goes to the fallback."""

from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from runs_app.models import Run, RunErrorCode, RunEvent, RunStatus, Step, StepKind, StepStatus, WaitReason
from tests.support.agents import define, wait_for_run
from tests.support.factories import EndpointModelFactory, ModelEndpointFactory, UserFactory
from tests.support.fake_openai_server import FakeOpenAIServer
from tests.support.processes import free_port

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

RETRIES = 2


@pytest.fixture
def servers():
    with FakeOpenAIServer(fallback="scripted") as main, FakeOpenAIServer(fallback="scripted") as spare:
        yield main, spare


@pytest.fixture
def workers(procs):
    procs.start_workers("fallback-workers", workers=2, env={
        "WARDEN_MAX_MODEL_RETRIES": str(RETRIES), "WARDEN_RETRY_BASE_SECONDS": "0.05",
        # The default endpoint answers nothing: a call that went there would fail.
        "OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1"})
    procs.start_sweeper(interval=0.2)  # it wakes runs whose backoff is over
    return procs


def _agent(main_url: str, spare_url: str):
    main = ModelEndpointFactory(name="main", base_url=main_url, credential="sk-main-0123456789")
    spare = ModelEndpointFactory(name="spare", base_url=spare_url, credential="sk-spare-0123456789")
    EndpointModelFactory(endpoint=main, name="big", input_price_per_million=Decimal("5"), output_price_per_million=Decimal("20"))
    EndpointModelFactory(endpoint=spare, name="spare-model", input_price_per_million=Decimal("1"),
                         output_price_per_million=Decimal("4"))
    definer = UserFactory(username="agent-admin", is_staff=True, is_superuser=True)
    return define({"name": "Payouts", "instructions": "You are payouts.", "tools": ["noop"], "endpoint": "main",
                   "model": "big", "fallback_endpoint": "spare", "fallback_model": "spare-model"}, by=definer).agent


def _ask(agent, text: str) -> Run:
    customer = UserFactory()
    return message_post(session=session_open(owner=customer, title=text, agent=agent), content=text,
                        acting_user=customer).run


def _model_steps(run_id) -> list[Step]:
    return list(Step.objects.filter(run_id=run_id, kind=StepKind.MODEL).order_by("index"))


def _priced(step: Step, input_price: int, output_price: int) -> Decimal:
    return ((Decimal(step.input_tokens) * input_price + Decimal(step.output_tokens) * output_price)
            / Decimal(1_000_000)).quantize(Decimal("0.000001"))


def test_the_agents_endpoint_refusing_connections_sends_every_call_to_the_fallback(workers, servers):
    _, spare = servers
    agent = _agent(f"http://127.0.0.1:{free_port()}/v1", spare.base_url)
    run = _ask(agent, "run 2 no-ops")
    wait_for_run(run.id, RunStatus.COMPLETED)
    steps = _model_steps(run.id)
    assert len(steps) == len(spare.requests) == 3 and Run.objects.get(pk=run.id).model_retries == 0
    assert {r["model"] for r in spare.requests} == {"spare-model"}
    for step in steps:
        assert (step.status, step.endpoint, step.model) == (StepStatus.COMPLETED, "spare", "spare-model")
        assert step.input_tokens and step.cost == _priced(step, 1, 4)


def test_a_500_sends_that_call_to_the_fallback_and_the_next_asks_the_agents_endpoint_again(workers, servers):
    main, spare = servers
    main.enqueue(status=500, error_message="internal error")
    run = _ask(_agent(main.base_url, spare.base_url), "run 1 no-op")
    wait_for_run(run.id, RunStatus.COMPLETED)
    first, second = _model_steps(run.id)
    assert (first.endpoint, first.model, first.status) == ("spare", "spare-model", StepStatus.COMPLETED)
    assert first.cost == _priced(first, 1, 4)
    assert (second.endpoint, second.model, second.status) == ("main", "big", StepStatus.COMPLETED)
    assert second.cost == _priced(second, 5, 20)
    assert len(main.requests) == 2 and len(spare.requests) == 1


def test_both_endpoints_down_fail_the_run_after_its_retries_naming_both(workers, servers):
    main, spare = servers
    for _ in range(RETRIES + 1):
        main.enqueue(status=503, error_message="main is overloaded")
        spare.enqueue(status=500, error_message="spare is broken")
    run = _ask(_agent(main.base_url, spare.base_url), "run 1 no-op")
    wait_for_run(run.id, RunStatus.FAILED)
    failed = Run.objects.get(pk=run.id)
    assert failed.error_code == RunErrorCode.MODEL_RETRIES
    assert failed.error_detail.startswith(f"{RETRIES} transient model errors; last: endpoint main:")
    assert "main is overloaded" in failed.error_detail and "fallback spare failed" in failed.error_detail
    assert "spare is broken" in failed.error_detail
    steps = _model_steps(run.id)
    assert len(steps) == RETRIES + 1 and len(main.requests) == len(spare.requests) == RETRIES + 1
    assert all(s.status == StepStatus.FAILED and s.endpoint == "spare" for s in steps)  # the last one asked
    # Each retry waited in the durable backoff.
    backoffs = [e for e in RunEvent.objects.filter(run_id=run.id, type="run_status").order_by("seq")
                if e.payload.get("wait_reason") == WaitReason.RETRY_BACKOFF]
    assert len(backoffs) == RETRIES


def test_a_429_with_retry_after_is_waited_out_on_the_agents_endpoint_first(workers, servers):
    main, spare = servers
    main.enqueue(status=429, headers={"Retry-After": "1"}, error_message="rate limited")
    run = _ask(_agent(main.base_url, spare.base_url), "run 1 no-op")
    wait_for_run(run.id, RunStatus.COMPLETED)
    assert not spare.requests  # nothing went to the fallback: the endpoint answered after the wait
    limited, *answered = _model_steps(run.id)
    assert (limited.status, limited.endpoint) == (StepStatus.FAILED, "main") and "rate limited" in limited.discard_reason
    assert all((s.status, s.endpoint) == (StepStatus.COMPLETED, "main") for s in answered)
    (backoff,) = [e for e in RunEvent.objects.filter(run_id=run.id, type="run_status")
                  if e.payload.get("wait_reason") == WaitReason.RETRY_BACKOFF]
    assert backoff.payload["status_code"] == 429
    assert datetime.fromisoformat(backoff.payload["wake_at"]) - backoff.created_at >= timedelta(seconds=0.9)
