"""Issue 32's providers through real django-q2 workers, for each kind of model endpoint (OpenAI-
compatible Chat Completions, OpenAI Responses, Anthropic Messages) against LLMock (a third-party mock of both APIs, one process
for the module: tests/support/llmock.py), with the demo world's simulated payment service and a
sweeper (it wakes runs whose retry backoff is over).

One endpoint per kind offers one model per case, and one agent per model, so the six runs go at
once and LLMock's scripted behaviours, matched by model, reach only their own run: the demo refund
completes (looked up, asked for, approved by an operator, executed, answered), and each fault leaves
its run where docs/EXTENDING.md ("Model endpoints") says — a tool call cut by a dropped stream, cut
by the answer's token limit (incomplete / max_tokens) or garbled never executes (the refund it asks
for is of order 9541, which the demo's rules refund with no approval at all) and the run, asked
again, completes; a 429 is waited out (its Retry-After) and the run completes; a server that keeps
answering 500 fails the run with `model_retries_exhausted` once its retries are spent."""

import pytest

from approvals_app.models import Approval
from demo.agent import DEMO_AGENT
from demo.selectors import sim_refund_count
from engine.actions.approvals import approval_decide
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from runs_app.models import EndpointKind, Run, RunErrorCode, RunEvent, RunStatus, WaitReason
from tests.support.agents import define, wait_for_run
from tests.support.factories import EndpointModelFactory, ModelEndpointFactory, UserFactory
from tests.support.llmock import fail, reply, stream_fault
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

REFUND_9527 = {"order_id": "9527", "amount": "25.00", "reason": "damaged"}  # an operator approves it
REFUND_9541 = {"order_id": "9541", "amount": "4.50", "reason": "damaged"}  # the rules let it through at once
CASES = ("refund", "cut", "length", "ratelimit", "down", "garbled")

# Where LLMock's `disconnect` lands inside the refund call's arguments: after the call opened and its
# first fragment (Chat Completions: the role chunk, the one opening the call, one arguments delta; Responses: created, in_progress, output_item.added, one delta; Anthropic:
# message_start, content_block_start, one input_json_delta).
KINDS = {
    EndpointKind.CHAT_COMPLETIONS: {"base_url": "openai_base_url", "provider": "openai", "cut_at": 3},
    EndpointKind.RESPONSES: {"base_url": "openai_base_url", "provider": "openai-responses", "cut_at": 4},
    EndpointKind.ANTHROPIC_MESSAGES: {"base_url": "anthropic_base_url", "provider": "anthropic", "cut_at": 3},
}


def _scenario(mock_llm, *, model, case: str, cut_at: int) -> None:
    model = f"{model}-{case}"
    scripted = {
        "refund": [reply(("query_order", {"order_id": "9527"}), model=model),
                   reply(("execute_refund", REFUND_9527), model=model)],
        "cut": [reply(("execute_refund", REFUND_9541), model=model), stream_fault("disconnect", after_chunks=cut_at, model=model)],
        "length": [reply(("execute_refund", REFUND_9541), finish="length", model=model)],
        "ratelimit": [fail(429, retry_after=1, model=model)],
        "down": [fail(500, model=model, times=None)],
        "garbled": [reply(("execute_refund", REFUND_9541), model=model), stream_fault("malformed", after_chunks=cut_at, model=model)],
    }[case]
    mock_llm.scenario(*scripted)


def _ask(agent, text: str) -> Run:
    customer = UserFactory()
    session = session_open(owner=customer, title=text, agent=agent)
    return message_post(session=session, content=text, acting_user=customer).run


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_refund_completes_and_each_fault_leaves_its_run_as_documented(procs, demo_world, mock_llm_process, kind):
    mock_llm = mock_llm_process
    mock_llm.reset()
    spec = KINDS[kind]
    prefix = kind.replace("_", "-")
    endpoint = ModelEndpointFactory(name=f"mock-{prefix}", kind=kind, base_url=getattr(mock_llm, spec["base_url"]))
    operator = UserFactory(username="endpoint-kinds-admin", is_staff=True, is_superuser=True)
    agents = {}
    for case in CASES:
        EndpointModelFactory(endpoint=endpoint, name=f"{prefix}-{case}")
        _scenario(mock_llm, model=prefix, case=case, cut_at=spec["cut_at"])
        agents[case] = define({**DEMO_AGENT, "slug": f"{prefix}-{case}", "name": f"{prefix} {case}",
                               "endpoint": endpoint.name, "model": f"{prefix}-{case}"}, by=operator).agent
    procs.start_sim()
    procs.start_sweeper()
    procs.start_workers(workers=2, env={"WARDEN_RETRY_BASE_SECONDS": "0.2", "WARDEN_MAX_MODEL_RETRIES": "1"})

    runs = {case: _ask(agents[case], "Refund order 9527" if case == "refund" else "Refund order 9541") for case in CASES}
    assert {run.provider for run in runs.values()} == {spec["provider"]}

    # The demo refund: looked up, asked for, approved by an operator, executed, answered.
    wait_for_run(runs["refund"].id, RunStatus.WAITING, WaitReason.APPROVAL)
    approval_decide(approval=Approval.objects.get(run_id=runs["refund"].id), decision="approve", acting_user=operator)
    wait_for_run(runs["refund"].id, RunStatus.COMPLETED)
    calls = {c.tool_name: c for c in ToolCall.objects.filter(run_id=runs["refund"].id)}
    assert calls["query_order"].status == calls["execute_refund"].status == ToolCallStatus.SUCCEEDED
    assert sim_refund_count(order_id="9527") == 1

    # A tool call cut by a dropped stream, by the token limit, or garbled never executes; asked again, the run completes.
    for case, fault in (("cut", "stream:disconnect"), ("length", ""), ("garbled", "stream:malformed")):
        wait_for_run(runs[case].id, RunStatus.COMPLETED)
        assert not ToolCall.objects.filter(run_id=runs[case].id).exists(), case
        first, again = mock_llm.requests(model=f"{prefix}-{case}")
        assert (first["fault"] or "").split("@")[0] == fault and not again["fault"], case
    assert sim_refund_count(order_id="9541") == 0
    assert Run.objects.get(pk=runs["length"].id).max_output_tokens  # asked again with a larger limit

    # A 429 is waited out, as long as its Retry-After asks, and the run completes.
    wait_for_run(runs["ratelimit"].id, RunStatus.COMPLETED)
    (waited,) = RunEvent.objects.filter(run_id=runs["ratelimit"].id, type="run_status", payload__wait_reason="retry_backoff")
    assert waited.payload["status_code"] == 429

    # A server that keeps failing: the run fails with its documented error once its retries are spent.
    wait_for_run(runs["down"].id, RunStatus.FAILED)
    assert Run.objects.get(pk=runs["down"].id).error_code == RunErrorCode.MODEL_RETRIES
    assert len(mock_llm.requests(model=f"{prefix}-down")) == 2  # the call and its one retry
