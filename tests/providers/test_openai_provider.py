"""The OpenAI-compatible provider, against a local server speaking the real SSE wire format."""

import json
import os
import subprocess
import sys

import httpx
import pytest
from django.conf import settings
from django.test import override_settings

from runs_app.providers.base import (
    Finish,
    InputClassification,
    ModelRequest,
    PermanentModelError,
    TextDelta,
    ToolCallDelta,
    TransientModelError,
    Usage,
)
from runs_app.providers.openai import OpenAIProvider
from tests.support.fake_openai_server import FakeOpenAIServer, Outcome
from tests.support.llmock import assembled_calls

MESSAGES = [
    {"role": "system", "content": "You are a refund agent."},
    {"role": "user", "content": "refund order 9527"},
]
QUERY_ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "query_order",
        "description": "Look up an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
}


@pytest.fixture
def server():
    with FakeOpenAIServer() as fake, override_settings(OPENAI_BASE_URL=fake.base_url):
        yield fake


@pytest.fixture
def scripted_server():
    with FakeOpenAIServer(fallback="scripted") as fake, override_settings(OPENAI_BASE_URL=fake.base_url):
        yield fake


def stream(messages=MESSAGES, tools=(), **options) -> list:
    request = ModelRequest(messages=list(messages), tools=list(tools), run_id="run-1", options=options)
    return list(OpenAIProvider().stream(request))


# --- mapping the stream -----------------------------------------------------------------------


def test_text_chunks_become_text_deltas_in_order(server):
    server.enqueue(text=["Hel", "lo", ", world"], finish="stop")

    events = stream()

    assert [event.text for event in events if isinstance(event, TextDelta)] == ["Hel", "lo", ", world"]


def test_tool_call_argument_fragments_are_passed_through(server):
    server.enqueue(
        tool_calls=[{"id": "call_1", "name": "query_order", "arguments_chunks": ['{"order_', 'id": "95', '27"}']}],
        finish="tool_calls",
    )

    events = stream()

    fragments = [event for event in events if isinstance(event, ToolCallDelta)]
    assert fragments[0] == ToolCallDelta(index=0, id="call_1", name="query_order", arguments="")
    assert [fragment.arguments for fragment in fragments[1:]] == ['{"order_', 'id": "95', '27"}']
    assert json.loads(assembled_calls(events)[0]["arguments"]) == {"order_id": "9527"}


def test_parallel_tool_calls_are_kept_apart_by_index(server):
    server.enqueue(
        tool_calls=[
            {"id": "call_a", "name": "query_user_level", "arguments_chunks": ['{"user_id"', ': "u1"}']},
            {"id": "call_b", "name": "execute_refund", "arguments_chunks": ['{"order_id": ', '"9527"}']},
        ],
        interleave=True,
        finish="tool_calls",
    )

    events = stream()

    indexes = [event.index for event in events if isinstance(event, ToolCallDelta)]
    assert indexes == [0, 1, 0, 1, 0, 1]
    assert assembled_calls(events) == [
        {"id": "call_a", "name": "query_user_level", "arguments": '{"user_id": "u1"}'},
        {"id": "call_b", "name": "execute_refund", "arguments": '{"order_id": "9527"}'},
    ]


def test_usage_is_reported(server):
    server.enqueue(text=["ok"], usage={"prompt_tokens": 42, "completion_tokens": 7})

    events = stream()

    assert [event for event in events if isinstance(event, Usage)] == [Usage(input_tokens=42, output_tokens=7)]


@pytest.mark.parametrize("reason", ["stop", "length", "tool_calls", "content_filter"])
def test_finish_reason_is_passed_through_as_the_last_event(server, reason):
    server.enqueue(text=["partial"], finish=reason)

    events = stream()

    assert events[-1] == Finish(reason)
    assert sum(isinstance(event, Finish) for event in events) == 1


def test_a_stream_without_finish_reason_has_no_finish_event(server):
    server.enqueue(text=["half an answer"], finish=None)

    events = stream()

    assert events and not any(isinstance(event, Finish) for event in events)


# --- errors -----------------------------------------------------------------------------------


def test_abrupt_disconnect_mid_stream_is_transient(server):
    server.enqueue(text=["one ", "two ", "three"], disconnect_after=2)
    received = []

    with pytest.raises(TransientModelError):
        for event in OpenAIProvider().stream(ModelRequest(messages=MESSAGES)):
            received.append(event)

    assert received == [TextDelta("one "), TextDelta("two ")]
    assert server.outcomes[0] == Outcome.DROPPED


def test_rate_limit_is_transient_with_retry_after(server):
    server.enqueue(status=429, headers={"Retry-After": "1"})

    with pytest.raises(TransientModelError) as raised:
        stream()

    assert raised.value.status == 429
    assert raised.value.retry_after == 1.0


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_are_transient(server, status):
    server.enqueue(status=status)

    with pytest.raises(TransientModelError) as raised:
        stream()

    assert raised.value.status == status


def test_a_conflict_is_transient_as_the_sdk_has_it(server):
    server.enqueue(status=409, error_message="conflict")

    with pytest.raises(TransientModelError) as raised:
        stream()

    assert raised.value.status == 409


@pytest.mark.parametrize(("status", "header", "transient"), [(400, "true", True), (503, "false", False), (500, "maybe", True)])
def test_the_servers_x_should_retry_header_decides_when_present(server, status, header, transient):
    server.enqueue(status=status, headers={"x-should-retry": header})

    with pytest.raises(TransientModelError if transient else PermanentModelError) as raised:
        stream()

    assert isinstance(raised.value, TransientModelError) is transient


def test_the_answers_token_limit_is_sent_as_max_tokens(server):
    server.enqueue(text=["ok"])

    list(OpenAIProvider().stream(ModelRequest(messages=MESSAGES, max_output_tokens=321)))

    assert server.requests[0]["max_tokens"] == 321


def test_fragments_without_an_index_keep_their_call_ids(server):
    server.enqueue(tool_calls=[
        {"id": "call_a", "name": "query_order", "index": None, "arguments_chunks": ['{"order_id"', ': "1"}']},
        {"id": "call_b", "name": "query_order", "index": None, "arguments_chunks": ['{"order_id"', ': "2"}']},
    ], finish="tool_calls")

    fragments = [e for e in stream(tools=[QUERY_ORDER_TOOL]) if isinstance(e, ToolCallDelta)]

    assert {e.index for e in fragments} == {None}
    assert [e.id for e in fragments if e.id] == ["call_a", "call_b"]


def test_summarize_folds_messages_into_the_summary_and_reports_its_tokens(server):
    server.enqueue(text=["orders 1 and 2 were refunded"], finish="stop", usage={"prompt_tokens": 40, "completion_tokens": 6})

    made = OpenAIProvider().summarize(previous="order 1 refunded", messages=[{"role": "user", "content": "refund 2"}],
                                      max_tokens=64)

    assert made.text == "orders 1 and 2 were refunded" and (made.input_tokens, made.output_tokens) == (40, 6)
    sent = server.requests[0]
    assert sent["max_tokens"] == 64 and "order 1 refunded" in sent["messages"][1]["content"]


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_client_errors_are_permanent(server, status):
    server.enqueue(status=status, error_message="bad model")

    with pytest.raises(PermanentModelError) as raised:
        stream()

    assert raised.value.status == status
    assert not isinstance(raised.value, TransientModelError)


def test_unreachable_server_is_transient():
    stopped = FakeOpenAIServer().start()
    stopped.stop()

    with override_settings(OPENAI_BASE_URL=stopped.base_url), pytest.raises(TransientModelError):
        stream()


def test_closing_the_generator_closes_the_connection(server):
    server.enqueue(text=["word "] * 2000, chunk_delay=0.005)
    events = OpenAIProvider().stream(ModelRequest(messages=MESSAGES))
    assert next(events) == TextDelta("word ")
    assert next(events) == TextDelta("word ")

    events.close()

    # Had the connection stayed open, the server would finish writing (or block) instead.
    assert server.wait_for_outcome(0, timeout=60) == Outcome.CLIENT_DISCONNECTED


# --- what is sent -----------------------------------------------------------------------------


def test_request_carries_messages_tools_model_and_usage_option(server):
    server.enqueue(text=["ok"])

    stream(tools=[QUERY_ORDER_TOOL])

    sent = server.requests[0]
    assert sent["messages"] == MESSAGES
    assert sent["tools"] == [QUERY_ORDER_TOOL]
    assert sent["model"] == settings.OPENAI_MODEL
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


def test_tools_are_omitted_when_there_are_none(server):
    server.enqueue(text=["ok"])

    stream(tools=[])

    assert "tools" not in server.requests[0]


def test_model_option_overrides_the_setting(server):
    server.enqueue(text=["ok"])

    stream(model="local-llama")

    assert server.requests[0]["model"] == "local-llama"


# --- classifying interjections ----------------------------------------------------------------


def test_classify_input_uses_the_models_json_answer(server):
    server.enqueue(text=['{"mode": "new_intent", "reason": "asks about something else"}'])

    classification = OpenAIProvider().classify_input(history=MESSAGES, text="how tall is Everest?")

    assert classification == InputClassification("new_intent", "asks about something else")
    sent = server.requests[0]
    assert sent.get("stream") is not True
    assert json.loads(sent["messages"][-1]["content"])["new_input"] == "how tall is Everest?"


def test_classify_input_accepts_json_wrapped_in_prose(server):
    server.enqueue(text=['Sure: ```json\n{"mode": "supplement", "reason": "gives the number"}\n```'])

    classification = OpenAIProvider().classify_input(history=MESSAGES, text="it is 9527")

    assert classification == InputClassification("supplement", "gives the number")


@pytest.mark.parametrize(
    "answer",
    ["I think the user wants something new.", '{"mode": "maybe", "reason": "unsure"}', '{"mode": "supplement"}'],
)
def test_classify_input_falls_back_to_rules_on_a_bad_answer(server, answer):
    server.enqueue(text=[answer])

    classification = OpenAIProvider().classify_input(history=MESSAGES, text="forget it, what's the weather?")

    assert classification.mode == "new_intent"
    assert classification.reason.startswith('fallback: new_intent: switch phrase "forget it"')


def test_classify_input_falls_back_to_rules_when_the_server_fails(server):
    server.enqueue(status=500)

    classification = OpenAIProvider().classify_input(history=MESSAGES, text="the order number is 9527")

    assert classification.mode == "supplement"
    assert classification.reason.startswith("fallback: ")


# --- the scripted fallback: whole flows over HTTP ---------------------------------------------


def test_scripted_fallback_drives_a_refund_through_the_openai_provider(scripted_server):
    messages = [{"role": "user", "content": "please refund order 9527"}]
    order = {"order_id": "9527", "amount": "59.00", "currency": "EUR", "refund_eligible": True}
    refund = {"refund_id": "rf_9", "amount": "59.00", "currency": "EUR"}

    for expected_tool, result in (("query_order", order), ("execute_refund", refund)):
        events = stream(messages, tools=[QUERY_ORDER_TOOL])
        [call] = assembled_calls(events)
        assert call["name"] == expected_tool and events[-1] == Finish("tool_calls")
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
        ]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})

    events = stream(messages)

    text = "".join(event.text for event in events if isinstance(event, TextDelta))
    assert "rf_9" in text and "59.00 EUR" in text
    assert events[-1] == Finish("stop")
    assert any(isinstance(event, Usage) for event in events)


def test_scripted_fallback_answers_classification_by_the_rules(scripted_server):
    classification = OpenAIProvider().classify_input(history=MESSAGES, text="forget it, what's the weather?")

    assert classification == InputClassification("new_intent", 'new_intent: switch phrase "forget it"')


def test_scripted_fallback_turns_faults_into_http_errors():
    faults = {"faults": ["rate_limit", "disconnect", "permanent_error"]}
    with FakeOpenAIServer(fallback="scripted", scripted_options=faults) as fake:
        with override_settings(OPENAI_BASE_URL=fake.base_url):
            with pytest.raises(TransientModelError) as rate_limited:
                stream()
            with pytest.raises(TransientModelError):
                stream()
            with pytest.raises(PermanentModelError):
                stream()

    assert rate_limited.value.status == 429 and rate_limited.value.retry_after == 0.05
    assert [fake.outcomes[n] for n in range(3)] == [Outcome.ERROR_STATUS, Outcome.DROPPED, Outcome.ERROR_STATUS]


def test_fake_server_runs_as_a_process_with_scripted_answers():
    environment = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_openai_server", "--port", "0"],
        cwd=settings.BASE_DIR,
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        base_url = process.stdout.readline().strip().rsplit(" ", 1)[-1]
        assert base_url.endswith("/v1")
        httpx.post(f"{base_url.removesuffix('/v1')}/_fake/enqueue", json={"text": ["queued ", "answer"]})

        with override_settings(OPENAI_BASE_URL=base_url):
            queued = stream()
            scripted = stream([{"role": "user", "content": "refund order 9527"}])

        assert "".join(e.text for e in queued if isinstance(e, TextDelta)) == "queued answer"
        assert assembled_calls(scripted)[0]["name"] == "query_order"
        recorded = httpx.get(f"{base_url.removesuffix('/v1')}/_fake/requests").json()["requests"]
        assert len(recorded) == 2
    finally:
        process.terminate()
        process.wait(timeout=10)
