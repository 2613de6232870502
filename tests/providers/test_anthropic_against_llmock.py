"""The Anthropic Messages provider against LLMock's `/anthropic/v1/messages` (a server we did not
write, a process of its own: tests/support/llmock.py; the endpoint's base URL is the API root,
`…/anthropic`, as `https://api.anthropic.com` is): streamed text and `tool_use` input fragments become
the engine's events, the chat-style request maps to Messages faithfully (system on top, tool results
in one user turn, failures marked `is_error`, roles alternating), and each fault is what
docs/EXTENDING.md ("Model endpoints") says — a cut or garbled stream, a 429 (its Retry-After kept)
and a 500 are transient, `max_tokens` inside a tool_use block a `length` finish, an authentication
failure permanent and its echoed key redacted. The `error` event LLMock cannot send mid-stream
(overloaded_error) comes from a canned stream (tests/support/canned_sse.py)."""

import json

from runs_app.models import EndpointKind
from runs_app.providers.anthropic import ANTHROPIC_VERSION, AnthropicProvider
from runs_app.providers.base import (
    Finish,
    ModelRequest,
    PermanentModelError,
    TextDelta,
    ToolCallDelta,
    TransientModelError,
    Usage,
)
from tests.support.canned_sse import CannedSSE
from tests.support.llmock import ANTHROPIC_PATH, assembled_calls, drain, endpoint_for, fail, reply, stream_fault
from tools_app.registry import tool_schemas
from tools_app.services import tool_message_content

REFUND = {"order_id": "9527", "amount": "25.00", "reason": "damaged"}


def provider(mock_llm, **endpoint) -> AnthropicProvider:
    return AnthropicProvider(endpoint=endpoint_for(EndpointKind.ANTHROPIC_MESSAGES, mock_llm.anthropic_base_url, **endpoint))


def ask(text: str = "Refund order 9527", **fields) -> ModelRequest:
    return ModelRequest(messages=[{"role": "system", "content": "You are the refund desk."},
                                  {"role": "user", "content": text}],
                        tools=tool_schemas(["query_order", "execute_refund"]), **fields)


def test_text_streams_as_deltas_with_usage_then_stop(mock_llm):
    mock_llm.scenario(reply(text="Your order ships tomorrow."))
    events, error = drain(provider(mock_llm), ask())

    assert error is None
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Your order ships tomorrow."
    assert len([e for e in events if isinstance(e, TextDelta)]) > 1  # streamed, not in one piece
    usage = [e for e in events if isinstance(e, Usage)]
    assert sum(u.input_tokens for u in usage) > 0 and sum(u.output_tokens for u in usage) > 1
    assert events[-1] == Finish("stop")


def test_a_tool_use_blocks_input_arrives_in_fragments_with_its_id_and_name(mock_llm):
    mock_llm.scenario(reply(("execute_refund", REFUND)))
    events, error = drain(provider(mock_llm), ask())

    assert error is None
    fragments = [e for e in events if isinstance(e, ToolCallDelta)]
    assert len(fragments) > 2 and fragments[0].id.startswith("toolu_") and fragments[0].name == "execute_refund"
    (call,) = assembled_calls(events)
    assert json.loads(call["arguments"]) == REFUND
    assert events[-1] == Finish("tool_calls")


def test_parallel_tool_use_blocks_are_kept_apart_after_text(mock_llm):
    mock_llm.scenario(reply(("query_order", {"order_id": "9527"}), ("query_order", {"order_id": "9528"}), text="Looking."))
    events, _ = drain(provider(mock_llm), ask())

    calls = assembled_calls(events)
    assert [json.loads(c["arguments"]) for c in calls] == [{"order_id": "9527"}, {"order_id": "9528"}]
    assert len({c["id"] for c in calls}) == 2
    assert [e.index for e in events if isinstance(e, ToolCallDelta) and e.id] == [0, 1]  # numbered as calls, not blocks
    assert events[-1] == Finish("tool_calls")


def test_system_tool_calls_results_and_errors_map_to_messages(mock_llm):
    failed = tool_message_content(status="failed", result=None, error_code="order_not_found", error_detail="no order 9528")
    history = [
        {"role": "system", "content": "You are the refund desk."},
        {"role": "system", "content": "Summary of the earlier conversation: none."},
        {"role": "user", "content": "Check orders 9527 and 9528"},
        {"role": "user", "content": "quickly please"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "toolu_a", "type": "function", "function": {"name": "query_order", "arguments": '{"order_id": "9527"}'}},
            {"id": "toolu_b", "type": "function", "function": {"name": "query_order", "arguments": '{"order_id": "9528"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_a", "content": '{"order_id": "9527", "amount": "25.00"}'},
        {"role": "tool", "tool_call_id": "toolu_b", "content": failed},
        {"role": "user", "content": "and 9529?"},
    ]
    key = "sk-ant-test-credential-77"
    mock_llm.scenario(reply(text="9527 is eligible; 9528 does not exist."))
    drain(provider(mock_llm, model="claude-test", credential=key),
          ModelRequest(messages=history, tools=tool_schemas(["query_order"]), max_output_tokens=321))

    (record,) = mock_llm.requests(ANTHROPIC_PATH)
    sent = record["body"]
    assert sent["model"] == "claude-test" and sent["stream"] is True and sent["max_tokens"] == 321
    assert sent["system"] == "You are the refund desk.\n\nSummary of the earlier conversation: none."
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Check orders 9527 and 9528"},
                                     {"type": "text", "text": "quickly please"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_a", "name": "query_order", "input": {"order_id": "9527"}},
            {"type": "tool_use", "id": "toolu_b", "name": "query_order", "input": {"order_id": "9528"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": '{"order_id": "9527", "amount": "25.00"}'},
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": failed, "is_error": True},
            {"type": "text", "text": "and 9529?"}]},
    ]
    tool = {t["name"]: t for t in sent["tools"]}["query_order"]  # beside the run-time's own ask_user
    assert set(tool) == {"name", "description", "input_schema"} and tool["input_schema"]["properties"]["order_id"]


def test_the_credential_goes_in_x_api_key_with_the_api_version():
    with CannedSSE([("message_stop", {"type": "message_stop"})]) as server:
        endpoint = endpoint_for(EndpointKind.ANTHROPIC_MESSAGES, server.base_url, credential="sk-ant-header-check")
        drain(AnthropicProvider(endpoint=endpoint), ask())
        (headers,) = server.headers
    assert headers["x-api-key"] == "sk-ant-header-check" and headers["anthropic-version"] == ANTHROPIC_VERSION
    assert "authorization" not in {name.lower() for name in headers}


def test_without_max_output_tokens_a_default_max_tokens_is_sent(mock_llm):
    mock_llm.scenario(reply(text="ok"))
    drain(provider(mock_llm), ask())

    assert mock_llm.requests(ANTHROPIC_PATH)[0]["body"]["max_tokens"] == 4096


# --- the five faults ------------------------------------------------------------------------------

def test_a_stream_cut_inside_a_tool_use_blocks_input_is_transient_and_never_finishes(mock_llm):
    # Events: message_start, the tool_use block's start, then its input: cut after the first fragment.
    mock_llm.scenario(reply(("execute_refund", REFUND)), stream_fault("disconnect", after_chunks=3))
    events, error = drain(provider(mock_llm), ask())

    assert isinstance(error, TransientModelError) and "model stream broken" in str(error)
    (call,) = assembled_calls(events)
    assert call["name"] == "execute_refund" and call["arguments"] and call["arguments"] != json.dumps(REFUND)
    assert not any(isinstance(e, Finish) for e in events)


def test_max_tokens_inside_a_tool_use_block_finishes_as_length(mock_llm):
    mock_llm.scenario(reply(("execute_refund", REFUND), finish="length"))
    events, error = drain(provider(mock_llm), ask(max_output_tokens=16))

    assert error is None and events[-1] == Finish("length")  # the engine never executes such a call


def test_a_rate_limit_is_transient_and_keeps_its_retry_after(mock_llm):
    mock_llm.scenario(fail(429, retry_after=3))
    _, error = drain(provider(mock_llm), ask())

    assert isinstance(error, TransientModelError) and (error.status, error.retry_after) == (429, 3.0)


def test_a_server_error_is_transient(mock_llm):
    mock_llm.scenario(fail(500))
    _, error = drain(provider(mock_llm), ask())

    assert isinstance(error, TransientModelError) and error.status == 500


def test_a_malformed_event_is_transient(mock_llm):
    mock_llm.scenario(reply(("execute_refund", REFUND)), stream_fault("malformed", after_chunks=2))
    events, error = drain(provider(mock_llm), ask())

    assert isinstance(error, TransientModelError) and "model stream broken" in str(error)
    assert not any(isinstance(e, Finish) for e in events)


# --- more of the same promises ----------------------------------------------------------------------

def test_an_overloaded_answer_is_transient(mock_llm):
    mock_llm.scenario(fail(529))
    _, error = drain(provider(mock_llm), ask())

    assert isinstance(error, TransientModelError) and error.status == 529


def test_an_error_event_mid_stream_is_transient_unless_the_request_is_wrong():
    start = ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 30, "output_tokens": 1}}})
    block = ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "tool_use", "id": "toolu_1", "name": "execute_refund", "input": {}}})
    delta = ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "input_json_delta", "partial_json": '{"order_id": "95'}})
    ping = ("ping", {"type": "ping"})

    def stream_with(error: dict):
        with CannedSSE([start, block, ping, delta, ("error", {"type": "error", "error": error})]) as server:
            return drain(AnthropicProvider(endpoint=endpoint_for(EndpointKind.ANTHROPIC_MESSAGES, server.base_url)), ask())

    events, error = stream_with({"type": "overloaded_error", "message": "Overloaded"})
    assert isinstance(error, TransientModelError) and "overloaded_error" in str(error)
    assert Usage(30, 1) in events and not any(isinstance(e, Finish) for e in events)
    _, error = stream_with({"type": "invalid_request_error", "message": "bad"})
    assert isinstance(error, PermanentModelError)


def test_a_stream_that_ends_early_but_cleanly_gives_no_finish(mock_llm):
    mock_llm.scenario(reply(("execute_refund", REFUND)), stream_fault("truncate", after_chunks=4))
    events, error = drain(provider(mock_llm), ask())

    assert error is None and not any(isinstance(e, Finish) for e in events)  # the engine discards it as truncated


def test_a_refused_key_is_permanent_and_its_echo_redacted(mock_llm):
    key = "sk-ant-secret-4242"
    mock_llm.scenario({**fail(401), "message": f"invalid x-api-key: {key}"})
    _, error = drain(provider(mock_llm, credential=key), ask())

    assert isinstance(error, PermanentModelError) and error.status == 401
    assert key not in str(error) and "[credential]" in str(error)


def test_summaries_and_classification_go_through_the_same_stream(mock_llm):
    mock_llm.scenario(reply(text="Order 9527 was refunded."), reply(text='{"mode": "new_intent", "reason": "asks about weather"}'))
    summary = provider(mock_llm).summarize(previous="", messages=[{"role": "user", "content": "refund 9527"}], max_tokens=200)
    classified = provider(mock_llm).classify_input(history=[{"role": "user", "content": "refund my order"}], text="weather?")

    assert summary.text == "Order 9527 was refunded." and summary.input_tokens > 0 and summary.output_tokens > 0
    assert (classified.mode, classified.reason) == ("new_intent", "asks about weather")
    summarize_call, classify_call = [r["body"] for r in mock_llm.requests(ANTHROPIC_PATH)]
    assert summarize_call["max_tokens"] == 200 and "memory" in summarize_call["system"]
    assert "route a user's new message" in classify_call["system"] and classify_call["max_tokens"] > 0
