"""The scripted model (runs_app/providers/scripted.py) as the demo world's model (demo/model.py): the
demo world's rules, stream shape, faults and input classification."""

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
from django.conf import settings
from django.test import override_settings
from pydantic import BaseModel, ValidationError

from runs_app.providers import scripted
from runs_app.providers.base import (
    SUPPLEMENT_NOTE,
    Finish,
    ModelRequest,
    PermanentModelError,
    TextDelta,
    ToolCallDelta,
    TransientModelError,
    Usage,
)
from demo import model as demo_model
from demo.model import DemoModel

ELIGIBLE_ORDER = {
    "order_id": "9527",
    "status": "delivered",
    "amount": "59.00",
    "currency": "EUR",
    "refund_eligible": True,
}
INELIGIBLE_ORDER = {
    **ELIGIBLE_ORDER,
    "refund_eligible": False,
    "ineligible_reason": "the 30-day refund window has closed",
}


@dataclass
class Turn:
    events: list

    @property
    def text(self) -> str:
        return "".join(event.text for event in self.events if isinstance(event, TextDelta))

    @property
    def text_chunks(self) -> list[str]:
        return [event.text for event in self.events if isinstance(event, TextDelta)]

    @property
    def calls(self) -> list[dict]:
        calls: dict[int, dict] = {}
        for event in self.events:
            if isinstance(event, ToolCallDelta):
                call = calls.setdefault(event.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = call["id"] or event.id
                call["name"] = call["name"] or event.name
                call["arguments"] += event.arguments
        return [calls[index] for index in sorted(calls)]

    @property
    def finish(self) -> str | None:
        finishes = [event.reason for event in self.events if isinstance(event, Finish)]
        return finishes[-1] if finishes else None

    def arguments(self, position: int = 0) -> dict:
        return json.loads(self.calls[position]["arguments"])


class Conversation:
    """Builds OpenAI-format message lists by hand, turn by turn."""

    def __init__(self, *user_texts: str, run_id: str = "run-1", **options):
        self.messages = [{"role": "user", "content": text} for text in user_texts]
        self.run_id = run_id
        self.options = {"delay": 0, **options}
        self.call_index = 0

    def request(self) -> ModelRequest:
        return ModelRequest(
            messages=[dict(message) for message in self.messages],
            run_id=self.run_id,
            call_index=self.call_index,
            options=self.options,
        )

    def turn(self) -> Turn:
        events = list(DemoModel().stream(self.request()))
        self.call_index += 1
        return Turn(events)

    def answer(self, turn: Turn, *payloads: dict) -> None:
        """Record the model's turn and the tools' results, as the engine would."""
        tool_calls = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in turn.calls
        ]
        self.messages.append({"role": "assistant", "content": turn.text or None, "tool_calls": tool_calls})
        for call, payload in zip(turn.calls, payloads):
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(payload)})

    def say_assistant(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def say(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})


# --- the demo world ---------------------------------------------------------------------------


def test_eligible_refund_queries_the_order_then_refunds_then_confirms():
    conversation = Conversation("Please refund order 9527, it arrived broken.")

    lookup = conversation.turn()
    assert [call["name"] for call in lookup.calls] == ["query_order"]
    assert lookup.arguments() == {"order_id": "9527"}
    assert lookup.finish == "tool_calls"
    conversation.answer(lookup, ELIGIBLE_ORDER)

    refund = conversation.turn()
    assert [call["name"] for call in refund.calls] == ["execute_refund"]
    assert refund.arguments() == {"order_id": "9527", "amount": "59.00", "reason": "customer request"}
    assert refund.finish == "tool_calls"
    conversation.answer(refund, {"refund_id": "rf_001", "amount": "59.00", "currency": "EUR"})

    confirmation = conversation.turn()
    assert confirmation.calls == []
    assert confirmation.finish == "stop"
    for fact in ("59.00 EUR", "9527", "rf_001"):
        assert fact in confirmation.text


def test_ineligible_order_gets_a_polite_explanation_and_no_refund():
    conversation = Conversation("I want a refund for order 9527")
    lookup = conversation.turn()
    conversation.answer(lookup, INELIGIBLE_ORDER)

    answer = conversation.turn()

    assert answer.calls == []
    assert answer.finish == "stop"
    assert "not eligible" in answer.text
    assert "the 30-day refund window has closed" in answer.text
    assert answer.text.startswith("I'm sorry")


def test_rejected_refund_is_explained_in_plain_words_without_codes():
    conversation = Conversation("refund order 9527")
    conversation.answer(conversation.turn(), ELIGIBLE_ORDER)
    refund = conversation.turn()
    conversation.answer(refund, {"error": {"code": "approval_rejected", "detail": "An operator declined it.",
                                           "message": "An operator declined it. Please call us."}})

    answer = conversation.turn()

    assert answer.calls == []
    assert answer.text == "I'm sorry, the refund for order 9527 was not made: an operator declined it. Please call us."
    assert "approval_rejected" not in answer.text


def test_failed_order_lookup_is_reported_not_retried():
    conversation = Conversation("refund order 9527")
    conversation.answer(conversation.turn(), {"error": {"code": "not_found", "detail": "no such order",
                                                        "message": "There is no order with that number."}})

    answer = conversation.turn()

    assert answer.calls == []
    assert "9527" in answer.text and "there is no order with that number" in answer.text
    assert "not_found" not in answer.text


def test_an_order_already_refunded_is_not_refunded_again():
    conversation = Conversation("Check order 9527 and refund it if it's eligible")
    conversation.answer(conversation.turn(), {**ELIGIBLE_ORDER, "refunded": True})

    answer = conversation.turn()

    assert answer.calls == []
    assert "already been refunded" in answer.text


def test_refund_without_an_order_number_asks_the_user_and_waits():
    ask = Conversation("I'd like a refund please").turn()

    assert [call["name"] for call in ask.calls] == ["ask_user"]
    assert ask.finish == "tool_calls"
    question = ask.arguments()["question"]
    assert "order number" in question and question.endswith("?")


def test_the_users_answer_to_the_question_completes_the_request():
    conversation = Conversation("I'd like a refund please")
    ask = conversation.turn()
    conversation.answer(ask, {"answer": "9527"})
    conversation.say("9527")

    lookup = conversation.turn()

    assert [call["name"] for call in lookup.calls] == ["query_order"]
    assert lookup.arguments() == {"order_id": "9527"}


def test_an_unanswered_question_is_wrapped_up_politely():
    conversation = Conversation("I'd like a refund please")
    ask = conversation.turn()
    conversation.answer(ask, {"error": {"code": "input_expired", "detail": "no answer"}})

    answer = conversation.turn()

    assert answer.calls == [] and answer.finish == "stop"
    assert answer.text == demo_model.NO_ANSWER_TEXT


def test_order_number_supplied_in_a_later_message_completes_the_request():
    conversation = Conversation("I'd like a refund please")
    conversation.say_assistant("Which order?")
    conversation.say("the order number is 9527")

    lookup = conversation.turn()

    assert [call["name"] for call in lookup.calls] == ["query_order"]
    assert lookup.arguments() == {"order_id": "9527"}


def test_an_addition_made_while_the_run_worked_is_answered_with_the_request():
    conversation = Conversation("What's the weather in Paris?")
    weather = conversation.turn()
    conversation.answer(weather, {"city": "Paris", "summary": "sunny", "temperature_c": 21})
    conversation.say(SUPPLEMENT_NOTE + "Also check order 9528")

    lookup = conversation.turn()
    assert [call["name"] for call in lookup.calls] == ["query_order"] and lookup.arguments() == {"order_id": "9528"}
    conversation.answer(lookup, {**ELIGIBLE_ORDER, "order_id": "9528"})

    answer = conversation.turn()
    assert answer.calls == []
    assert "weather in Paris is sunny" in answer.text and "Order 9528 is delivered" in answer.text


def test_scripted_turns_replace_the_demo_rules():
    conversation = Conversation("anything", turns=[{"calls": [{"name": "slow_lookup", "arguments": {"key": "k"}}]},
                                                   {"text": "All done."}])
    first = conversation.turn()
    assert [call["name"] for call in first.calls] == ["slow_lookup"] and first.arguments() == {"key": "k"}
    conversation.answer(first, {"ok": True})
    assert conversation.turn().text == "All done."
    assert conversation.turn().text == scripted.SCRIPTED_DONE_TEXT


def test_later_order_number_replaces_an_earlier_one():
    conversation = Conversation("refund order 1111", "sorry, the order number is 9527")

    assert conversation.turn().arguments() == {"order_id": "9527"}


def test_finished_answer_closes_the_previous_request():
    conversation = Conversation("refund order 9527")
    conversation.answer(conversation.turn(), INELIGIBLE_ORDER)
    conversation.say_assistant(conversation.turn().text)
    conversation.say("hello there")

    answer = conversation.turn()

    assert answer.calls == []
    assert answer.text == demo_model.HELP_TEXT


def test_checking_an_order_summarises_status_and_amount():
    conversation = Conversation("what is the status of order 9527?")
    lookup = conversation.turn()
    assert lookup.arguments() == {"order_id": "9527"}
    conversation.answer(lookup, ELIGIBLE_ORDER)

    summary = conversation.turn()

    assert summary.calls == []
    assert "delivered" in summary.text and "59.00 EUR" in summary.text


@pytest.mark.parametrize(
    ("question", "city"),
    [
        ("What's the weather in New York?", "New York"),
        ("weather in rome please", "Rome"),
        ("how is the weather today", "Paris"),
    ],
)
def test_weather_asks_for_the_named_city_then_reports_it(question, city):
    conversation = Conversation(question)
    lookup = conversation.turn()
    assert [call["name"] for call in lookup.calls] == ["get_weather"]
    assert lookup.arguments() == {"city": city}
    conversation.answer(lookup, {"city": city, "summary": "sunny", "temperature_c": 21})

    answer = conversation.turn()

    assert answer.text == f"The weather in {city} is sunny, 21°C."
    assert answer.finish == "stop"


@pytest.mark.parametrize(("question", "user_id"), [("user level of u1?", "u1"), ("what is my user level", "me")])
def test_user_level_is_looked_up_then_told(question, user_id):
    conversation = Conversation(question)
    lookup = conversation.turn()
    assert [call["name"] for call in lookup.calls] == ["query_user_level"]
    assert lookup.arguments() == {"user_id": user_id}
    conversation.answer(lookup, {"user_id": user_id, "level": "gold"})

    answer = conversation.turn()

    assert "gold" in answer.text
    assert answer.calls == []


@pytest.mark.parametrize("request_text", ["noop 3", "run 3 no-op calls"])
def test_noop_benchmark_makes_one_call_per_turn_then_reports(request_text):
    conversation = Conversation(request_text)
    for expected in range(3):
        turn = conversation.turn()
        assert [(call["name"], json.loads(call["arguments"])) for call in turn.calls] == [("noop", {"i": expected})]
        conversation.answer(turn, {"ok": True})

    answer = conversation.turn()

    assert answer.calls == []
    assert answer.text == "Done: 3 no-op calls."


def test_anything_else_gets_a_short_explanation_of_what_it_can_do():
    answer = Conversation("tell me a joke").turn()

    assert answer.calls == []
    assert answer.text == demo_model.HELP_TEXT
    assert answer.finish == "stop"


# --- stream shape -----------------------------------------------------------------------------


def test_text_arrives_in_several_word_chunks():
    answer = Conversation("tell me a joke").turn()

    assert len(answer.text_chunks) >= 3
    assert all(len(chunk.split()) <= 2 for chunk in answer.text_chunks)


def test_tool_call_streams_id_and_name_first_then_argument_fragments():
    fragments = [e for e in Conversation("refund order 9527").turn().events if isinstance(e, ToolCallDelta)]

    first, rest = fragments[0], fragments[1:]
    assert first.id.startswith("call_") and first.name == "query_order" and first.arguments
    assert len(rest) >= 2
    assert all(fragment.id is None and fragment.name is None and fragment.index == 0 for fragment in rest)


def test_usage_then_finish_end_the_stream():
    events = Conversation("refund order 9527").turn().events

    assert isinstance(events[-2], Usage) and isinstance(events[-1], Finish)
    assert events[-2].input_tokens == 3 and events[-2].output_tokens > 0


def test_same_request_gives_the_same_stream():
    assert Conversation("refund order 9527").turn() == Conversation("refund order 9527").turn()


def test_a_new_model_call_gets_new_tool_call_ids():
    conversation = Conversation("refund order 9527")
    first = conversation.turn()
    again = conversation.turn()  # same messages, next call_index: a re-emission

    assert first.arguments() == again.arguments()
    assert first.calls[0]["id"] != again.calls[0]["id"]
    assert Conversation("refund order 9527", run_id="run-2").turn().calls[0]["id"] != first.calls[0]["id"]


@pytest.fixture
def sleeps(monkeypatch):
    recorded = []
    monkeypatch.setattr(scripted.time, "sleep", recorded.append)
    return recorded


def test_zero_delay_never_sleeps(sleeps):
    Conversation("tell me a joke", delay=0).turn()

    assert sleeps == []


def test_delay_option_pauses_between_chunks(sleeps):
    turn = Conversation("tell me a joke", delay=0.01).turn()

    assert sleeps == [0.01] * (len(turn.text_chunks) - 1)


@override_settings(WARDEN_SCRIPTED_DELAY_SECONDS=0.03)
def test_delay_defaults_to_the_setting(sleeps):
    request = ModelRequest(messages=[{"role": "user", "content": "tell me a joke"}])

    list(DemoModel().stream(request))

    assert sleeps and set(sleeps) == {settings.WARDEN_SCRIPTED_DELAY_SECONDS}


def test_streaming_needs_no_django_settings():
    code = (
        "from runs_app.providers.base import ModelRequest\n"
        "from runs_app.providers.scripted import ScriptedProvider\n"
        "request = ModelRequest(messages=[{'role': 'user', 'content': 'refund order 9527'}])\n"
        "print(len(list(ScriptedProvider().stream(request))))\n"
    )
    environment = {"PATH": "/usr/bin:/bin"}  # no DJANGO_SETTINGS_MODULE
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=settings.BASE_DIR, env=environment, capture_output=True, text=True
    )

    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 2


# --- faults -----------------------------------------------------------------------------------


class QueryOrderArguments(BaseModel):
    order_id: str


def fault_turn(fault: str, *, at_refund: bool = False, **options) -> Turn:
    conversation = Conversation("refund order 9527", faults=[None, fault] if at_refund else [fault], **options)
    if at_refund:
        conversation.answer(conversation.turn(), ELIGIBLE_ORDER)
    return conversation.turn()


def test_truncated_args_cut_the_arguments_and_never_finish():
    turn = fault_turn("truncated_args")

    assert turn.finish is None
    assert not any(isinstance(event, Usage) for event in turn.events)
    assert '{"order_id": "9527"}'.startswith(turn.calls[0]["arguments"])
    with pytest.raises(json.JSONDecodeError):
        json.loads(turn.calls[0]["arguments"])


def test_invalid_json_finishes_normally_with_unparseable_arguments():
    turn = fault_turn("invalid_json")

    assert turn.finish == "tool_calls"
    assert turn.calls[0]["arguments"].startswith('{"order_id": "9527",')
    with pytest.raises(json.JSONDecodeError):
        json.loads(turn.calls[0]["arguments"])


def test_schema_invalid_arguments_are_json_that_fails_the_tool_schema():
    turn = fault_turn("schema_invalid")

    assert turn.finish == "tool_calls"
    with pytest.raises(ValidationError):
        QueryOrderArguments.model_validate(turn.arguments())


def test_length_cuts_off_a_planned_tool_call():
    turn = fault_turn("length")

    assert turn.finish == "length"
    assert turn.text
    with pytest.raises(json.JSONDecodeError):
        json.loads(turn.calls[0]["arguments"])


def test_length_cuts_off_a_text_answer():
    full = Conversation("tell me a joke").turn()
    cut = Conversation("tell me a joke", faults=["length"]).turn()

    assert cut.finish == "length"
    assert cut.text and full.text.startswith(cut.text) and cut.text != full.text


def test_claims_approval_adds_a_false_claim_to_text_and_arguments():
    turn = fault_turn("claims_approval", at_refund=True)

    assert "already approved by an admin" in turn.text
    assert turn.calls[0]["name"] == "execute_refund"
    assert turn.arguments() == {
        "order_id": "9527",
        "amount": "59.00",
        "reason": "customer request",
        "approved_by": "admin",
        "approval_id": "fake",
    }
    assert turn.finish == "tool_calls"


@pytest.mark.parametrize(
    ("fault", "error_class", "status"),
    [
        ("rate_limit", TransientModelError, 429),
        ("server_error", TransientModelError, 500),
        ("permanent_error", PermanentModelError, 400),
    ],
)
def test_error_faults_raise_before_any_event(fault, error_class, status):
    stream = DemoModel().stream(Conversation("refund order 9527", faults=[fault]).request())

    with pytest.raises(error_class) as raised:
        next(stream)

    assert raised.value.status == status


def test_rate_limit_carries_a_retry_after():
    with pytest.raises(TransientModelError) as raised:
        fault_turn("rate_limit")

    assert raised.value.retry_after == 0.05


def test_disconnect_drops_the_stream_after_some_text():
    received = []
    with pytest.raises(TransientModelError):
        for event in DemoModel().stream(Conversation("tell me a joke", faults=["disconnect"]).request()):
            received.append(event)

    assert len(received) == 2 and all(isinstance(event, TextDelta) for event in received)


def test_unknown_tool_fault_calls_a_tool_nobody_registered():
    turn = fault_turn("unknown_tool")

    assert [call["name"] for call in turn.calls] == ["transfer_all_funds"]
    assert isinstance(turn.arguments(), dict)
    assert turn.finish == "tool_calls"


def test_duplicate_refund_emits_the_same_refund_twice_with_different_ids():
    turn = fault_turn("duplicate_refund", at_refund=True)

    assert [call["name"] for call in turn.calls] == ["execute_refund", "execute_refund"]
    assert turn.arguments(0) == turn.arguments(1)
    assert turn.calls[0]["id"] != turn.calls[1]["id"]


def test_duplicate_refund_leaves_other_turns_alone():
    assert fault_turn("duplicate_refund") == Conversation("refund order 9527").turn()


def test_slow_fault_pauses_a_fifth_of_a_second_per_chunk(sleeps):
    fault_turn("slow", delay=0)

    assert sleeps and set(sleeps) == {scripted.SLOW_DELAY_SECONDS}


@pytest.mark.parametrize("harmless", [None, "ok"])
def test_a_fault_applies_only_to_its_own_call(harmless):
    turn = Conversation("refund order 9527", faults=[harmless, "rate_limit"]).turn()

    assert turn == Conversation("refund order 9527").turn()


def test_unknown_fault_name_is_a_permanent_error():
    with pytest.raises(PermanentModelError):
        fault_turn("tuncated_args")


# --- classifying interjections ----------------------------------------------------------------

REFUND_HISTORY = [{"role": "user", "content": "refund order 9527"}]


@pytest.mark.parametrize(
    ("text", "reason_part"),
    [
        ("forget it, what's the weather?", '"forget it"'),
        ("never mind", '"never mind"'),
        ("cancel that please", '"cancel that"'),
        ("new question: who are you", '"new question"'),
        ("refund order 1234 instead", '"instead"'),
        ("what's the weather in Rome?", "weather while the run is about refund"),
    ],
)
def test_switch_phrases_and_other_topics_are_new_intents(text, reason_part):
    classification = DemoModel().classify_input(history=REFUND_HISTORY, text=text)

    assert classification.mode == "new_intent"
    assert reason_part in classification.reason


@pytest.mark.parametrize(
    ("text", "reason_part"),
    [
        ("the order number is 9527", '"9527"'),
        ("it's u1", '"u1"'),
        ("also, it arrived broken", 'starts with "also"'),
        ("and please be quick", 'starts with "and"'),
        ("thanks", "default: treated as added information"),
    ],
)
def test_details_and_additions_are_supplements(text, reason_part):
    classification = DemoModel().classify_input(history=REFUND_HISTORY, text=text)

    assert classification.mode == "supplement"
    assert reason_part in classification.reason


def test_classification_is_deterministic():
    provider = DemoModel()

    first = provider.classify_input(history=REFUND_HISTORY, text="what's the weather?")

    assert provider.classify_input(history=REFUND_HISTORY, text="what's the weather?") == first


def test_a_refund_confirmed_by_an_operator_without_the_gateways_answer_is_reported_done():
    conversation = Conversation("refund order 9527")
    conversation.answer(conversation.turn(), ELIGIBLE_ORDER)
    refund = conversation.turn()
    conversation.answer(refund, None)  # reconciled as applied with no result

    answer = conversation.turn()

    assert answer.text == "Done: the refund of 59.00 EUR for order 9527 has been issued."
