"""The OpenAI Responses provider against LLMock's `/v1/responses` (a server we did not write, a process
of its own: tests/support/llmock.py): streamed text and tool-call fragments become the engine's
events, the chat-style request maps to Responses input items faithfully, and each fault is what
docs/EXTENDING.md ("Model endpoints") says — a cut or garbled stream, a 429 (its Retry-After
kept) and a 500 are transient, an incomplete answer is a `length` finish, an authentication
failure permanent and its echoed key redacted. The events LLMock cannot send (`response.failed`,
`response.incomplete`) come from a canned stream (tests/support/canned_sse.py)."""

import json

from runs_app.models import EndpointKind
from runs_app.providers.base import (
    Finish,
    ModelRequest,
    PermanentModelError,
    TextDelta,
    ToolCallDelta,
    TransientModelError,
    Usage,
)
from runs_app.providers.responses import ResponsesProvider
from tests.support.canned_sse import CannedSSE
from tests.support.llmock import RESPONSES_PATH, assembled_calls, drain, endpoint_for, fail, reply, stream_fault
from tools_app.registry import tool_schemas
from tools_app.services import tool_message_content

REFUND = {"order_id": "9527", "amount": "25.00", "reason": "damaged"}


def provider(mock_llm, **endpoint) -> ResponsesProvider:
    return ResponsesProvider(endpoint=endpoint_for(EndpointKind.RESPONSES, mock_llm.openai_base_url, **endpoint))


def ask(text: str = "Refund order 9527", **fields) -> ModelRequest:
    return ModelRequest(messages=[{"role": "system", "content": "You are the refund desk."},
                                  {"role": "user", "content": text}],
                        tools=tool_schemas(["query_order", "execute_refund"]), **fields)


def test_text_streams_as_deltas_then_usage_then_stop(mock_llm):
    mock_llm.scenario(reply(text="Your order ships tomorrow."))
    events, error = drain(provider(mock_llm), ask())

    assert error is None
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Your order ships tomorrow."
    assert len([e for e in events if isinstance(e, TextDelta)]) > 1  # streamed, not in one piece
    (usage,) = [e for e in events if isinstance(e, Usage)]
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert events[-1] == Finish("stop")


def test_a_tool_calls_arguments_arrive_in_fragments_with_its_call_id_and_name(mock_llm):
    mock_llm.scenario(reply(("execute_refund", REFUND)))
    events, error = drain(provider(mock_llm), ask())

    assert error is None
    fragments = [e for e in events if isinstance(e, ToolCallDelta)]
    assert len(fragments) > 2 and fragments[0].id.startswith("call_") and fragments[0].name == "execute_refund"
    (call,) = assembled_calls(events)
    assert json.loads(call["arguments"]) == REFUND
    assert events[-1] == Finish("tool_calls")


def test_parallel_tool_calls_are_kept_apart(mock_llm):
    mock_llm.scenario(reply(("query_order", {"order_id": "9527"}), ("query_order", {"order_id": "9528"})))
    events, _ = drain(provider(mock_llm), ask())

    calls = assembled_calls(events)
    assert [json.loads(c["arguments"]) for c in calls] == [{"order_id": "9527"}, {"order_id": "9528"}]
    assert len({c["id"] for c in calls}) == 2
    assert events[-1] == Finish("tool_calls")


def test_system_text_tool_calls_results_and_errors_map_to_responses_items(mock_llm):
    failed = tool_message_content(status="failed", result=None, error_code="order_not_found", error_detail="no order 9528")
    history = [
        {"role": "system", "content": "You are the refund desk."},
        {"role": "system", "content": "Summary of the earlier conversation: none."},
        {"role": "user", "content": "Check orders 9527 and 9528"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "query_order", "arguments": '{"order_id": "9527"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "query_order", "arguments": '{"order_id": "9528"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": '{"order_id": "9527", "amount": "25.00"}'},
        {"role": "tool", "tool_call_id": "call_b", "content": failed},
    ]
    mock_llm.scenario(reply(text="9527 is eligible; 9528 does not exist."))
    drain(provider(mock_llm, model="gpt-test"), ModelRequest(messages=history, tools=tool_schemas(["query_order"]),
                                                           max_output_tokens=321))

    (sent,) = [r["body"] for r in mock_llm.requests(RESPONSES_PATH)]
    assert sent["model"] == "gpt-test" and sent["stream"] is True and sent["store"] is False
    assert sent["instructions"] == "You are the refund desk.\n\nSummary of the earlier conversation: none."
    assert sent["max_output_tokens"] == 321
    assert sent["input"] == [
        {"role": "user", "content": "Check orders 9527 and 9528"},
        {"role": "assistant", "content": "Looking."},
        {"type": "function_call", "call_id": "call_a", "name": "query_order", "arguments": '{"order_id": "9527"}'},
        {"type": "function_call", "call_id": "call_b", "name": "query_order", "arguments": '{"order_id": "9528"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": '{"order_id": "9527", "amount": "25.00"}'},
        {"type": "function_call_output", "call_id": "call_b", "output": failed},
    ]
    tool = {t["name"]: t for t in sent["tools"]}["query_order"]  # beside the run-time's own ask_user
    assert tool["type"] == "function" and tool["strict"] is False
    assert tool["parameters"]["properties"]["order_id"] and tool["description"]


# --- the five faults ------------------------------------------------------------------------------

def test_a_stream_cut_inside_a_tool_calls_arguments_is_transient_and_never_finishes(mock_llm):
    # Events: created, in_progress, the call added, then its arguments: cut after the first fragment.
    mock_llm.scenario(reply(("execute_refund", REFUND)), stream_fault("disconnect", after_chunks=4))
    events, error = drain(provider(mock_llm), ask())

    assert isinstance(error, TransientModelError) and "model stream broken" in str(error)
    (call,) = assembled_calls(events)
    assert call["name"] == "execute_refund" and call["arguments"] and call["arguments"] != json.dumps(REFUND)
    assert not any(isinstance(e, Finish) for e in events)


def test_an_incomplete_answer_cut_inside_a_tool_call_finishes_as_length(mock_llm):
    mock_llm.scenario(reply(("execute_refund", REFUND), finish="length"))
    events, error = drain(provider(mock_llm), ask(max_output_tokens=16))

    assert error is None and events[-1] == Finish("length")  # the engine never executes such a call
    assert mock_llm.requests(RESPONSES_PATH)[0]["body"]["max_output_tokens"] == 16


def test_a_rate_limit_is_transient_and_keeps_its_retry_after(mock_llm):
    mock_llm.scenario(fail(429, retry_after=3))
    _, error = drain(provider(mock_llm), ask())

    assert isinstance(error, TransientModelError) and (error.status, error.retry_after) == (429, 3.0)


def test_a_server_error_is_transient(mock_llm):
    mock_llm.scenario(fail(500))
    _, error = drain(provider(mock_llm), ask())

    assert isinstance(error, TransientModelError) and error.status == 500


def test_a_malformed_event_is_transient(mock_llm):
    mock_llm.scenario(reply(("execute_refund", REFUND)), stream_fault("malformed", after_chunks=3))
    events, error = drain(provider(mock_llm), ask())

    assert isinstance(error, TransientModelError) and "model stream broken" in str(error)
    assert not any(isinstance(e, Finish) for e in events)


# --- more of the same promises ----------------------------------------------------------------------

def test_a_stream_that_ends_early_but_cleanly_gives_no_finish(mock_llm):
    mock_llm.scenario(reply(("execute_refund", REFUND)), stream_fault("truncate", after_chunks=5))
    events, error = drain(provider(mock_llm), ask())

    assert error is None and not any(isinstance(e, Finish) for e in events)  # the engine discards it as truncated


def test_a_refused_key_is_permanent_and_its_echo_redacted(mock_llm):
    key = "sk-responses-secret-4242"
    mock_llm.scenario({**fail(401), "message": f"Incorrect API key provided: {key}."})
    _, error = drain(provider(mock_llm, credential=key), ask())

    assert isinstance(error, PermanentModelError) and error.status == 401
    assert key not in str(error) and "[credential]" in str(error)
    assert key not in repr(endpoint_for(EndpointKind.RESPONSES, mock_llm.openai_base_url, credential=key))


def test_failed_and_incomplete_events_mid_stream():
    started = ("response.created", {"type": "response.created", "response": {"status": "in_progress"}})
    added = ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": {
        "type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "execute_refund", "arguments": ""}})
    delta = ("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta",
                                                        "output_index": 0, "delta": '{"order_id": "95'})
    usage = {"input_tokens": 40, "output_tokens": 16}
    failed = ("response.failed", {"type": "response.failed", "response": {
        "status": "failed", "usage": usage, "error": {"code": "server_error", "message": "The server had an error"}}})
    incomplete = ("response.incomplete", {"type": "response.incomplete", "response": {
        "status": "incomplete", "usage": usage, "incomplete_details": {"reason": "max_output_tokens"}}})

    with CannedSSE([started, added, delta, failed]) as server:
        events, error = drain(ResponsesProvider(endpoint=endpoint_for(EndpointKind.RESPONSES, server.base_url)), ask())
    assert isinstance(error, TransientModelError) and "server_error" in str(error)
    assert Usage(40, 16) in events and not any(isinstance(e, Finish) for e in events)

    with CannedSSE([started, added, delta, incomplete]) as server:
        events, error = drain(ResponsesProvider(endpoint=endpoint_for(EndpointKind.RESPONSES, server.base_url)), ask())
    assert error is None and events[-2:] == [Usage(40, 16), Finish("length")]


def test_summaries_and_classification_go_through_the_same_stream(mock_llm):
    mock_llm.scenario(reply(text="Order 9527 was refunded."), reply(text='{"mode": "supplement", "reason": "adds a number"}'))
    summary = provider(mock_llm).summarize(previous="", messages=[{"role": "user", "content": "refund 9527"}], max_tokens=200)
    classified = provider(mock_llm).classify_input(history=[{"role": "user", "content": "refund my order"}], text="it is 9527")

    assert summary.text == "Order 9527 was refunded." and summary.input_tokens > 0 and summary.output_tokens > 0
    assert (classified.mode, classified.reason) == ("supplement", "adds a number")
    summarize_call, classify_call = [r["body"] for r in mock_llm.requests(RESPONSES_PATH)]
    assert summarize_call["max_output_tokens"] == 200 and "memory" in summarize_call["instructions"]
    assert "route a user's new message" in classify_call["instructions"]


def test_without_an_endpoint_the_call_is_refused_permanently():
    _, error = drain(ResponsesProvider(), ask())

    assert isinstance(error, PermanentModelError) and "model endpoint" in str(error)

