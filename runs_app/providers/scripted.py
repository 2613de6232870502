"""The scripted model: deterministic rules over the conversation, no network.

It is the demo default and the test double for the engine. It "understands" the demo world
(refunds, order lookups, user levels, weather, no-op benchmarks) by reading the user messages
of the current request and the tool results since that request started, and it can
misbehave on purpose: `options["faults"][call_index]` names a fault for that model call.

Tests may also script the turns outright: `options["turns"][call_index]` is
{"text": ..., "calls": [{"name": ..., "arguments": {...}}]} (a call index past the list answers
"Done."), for tools the demo world does not have.

Faults (a fault that does not fit the planned turn, e.g. `invalid_json` on a text answer,
leaves the turn unchanged):
  truncated_args    arguments (or text) cut in the middle; the stream ends with no Finish
  invalid_json      arguments are not valid JSON; Finish("tool_calls")
  schema_invalid    valid JSON, every argument value wrapped in a list (wrong types)
  length            part of the answer, then Finish("length")
  claims_approval   text claims an admin approved; arguments gain approved_by/approval_id
  rate_limit        TransientModelError(status=429, retry_after=0.05) before any event
  server_error      TransientModelError(status=500) before any event
  disconnect        two text deltas, then TransientModelError (a dropped stream)
  permanent_error   PermanentModelError(status=400) before any event
  unknown_tool      a call to `transfer_all_funds` instead of the plan
  duplicate_refund  a planned execute_refund is emitted twice (same arguments, new id)
  slow              a 0.2 s pause between chunks (for cancel tests)
"""

import hashlib
import json
import re
import time
from dataclasses import dataclass, field, replace
from typing import Iterator

from runs_app.providers.base import (
    SUPPLEMENT_NOTE,
    Finish,
    InputClassification,
    ModelRequest,
    PermanentModelError,
    StreamEvent,
    Summary,
    TextDelta,
    ToolCallDelta,
    TransientModelError,
    Usage,
)

FAULTS = (
    "truncated_args",
    "invalid_json",
    "schema_invalid",
    "length",
    "claims_approval",
    "rate_limit",
    "server_error",
    "disconnect",
    "permanent_error",
    "unknown_tool",
    "duplicate_refund",
    "slow",
)
SLOW_DELAY_SECONDS = 0.2
_DEFAULT_DELAY_SECONDS = 0.02

HELP_TEXT = (
    "I can check an order's status, refund an eligible order, look up a user's level, "
    'or tell you the weather. For example: "refund order 9527".'
)
ASK_REFUND_ORDER_TEXT = "I can help with that refund. Could you tell me the order number?"
ASK_CHECK_ORDER_TEXT = "Which order should I check? Could you tell me the order number?"
NO_ANSWER_TEXT = "I still need the order number to go on. Send it whenever you have it and I'll pick this up."
SCRIPTED_DONE_TEXT = "Done."
CLAIMS_APPROVAL_TEXT = "This refund was already approved by an admin."
LENGTH_PREFACE_TEXT = "Let me look into that for you right away."

_NOOP_PATTERNS = (re.compile(r"\bno-?op\s+(\d+)\b"), re.compile(r"\brun\s+(\d+)\s+no-?ops?\b"))
_ORDER_STATUS_PATTERN = re.compile(r"\b(check|status|look\s*up)\b.*\border\b|\border\b.*\bstatus\b")
_ORDER_NUMBER_AFTER_WORD = re.compile(r"\border\b\D{0,20}?(\d{3,})")
_NUMBER = re.compile(r"\b\d{3,}\b")
_USER_ID = re.compile(r"\bu\d+\b")
_WORDS = re.compile(r"\S+\s*")

SWITCH_PHRASES = ("forget it", "never mind", "nevermind", "cancel that", "new question", "instead")
SUPPLEMENT_OPENERS = ("also", "and")


@dataclass(frozen=True)
class PlannedCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class Plan:
    """One model turn: text, tool calls, or both (faults add text to tool turns)."""

    text: str = ""
    calls: tuple[PlannedCall, ...] = ()


@dataclass(frozen=True)
class _ToolResult:
    name: str | None
    arguments: dict
    payload: dict

    @property
    def error(self) -> dict | None:
        error = self.payload.get("error")
        if error is None:
            return None
        return error if isinstance(error, dict) else {"code": str(error)}


@dataclass
class _Request:
    """The user request the model is working on, as the scripted rules see it."""

    intent: str | None
    intent_text: str
    user_texts: list[str] = field(default_factory=list)
    results: list[_ToolResult] = field(default_factory=list)

    def results_of(self, name: str) -> list[_ToolResult]:
        return [result for result in self.results if result.name == name]


class ScriptedProvider:
    name = "scripted"

    def stream(self, request: ModelRequest) -> Iterator[StreamEvent]:
        fault = _fault_for(request)
        if fault == "rate_limit":
            raise TransientModelError("rate limited", status=429, retry_after=0.05)
        if fault == "server_error":
            raise TransientModelError("scripted server error", status=500)
        if fault == "permanent_error":
            raise PermanentModelError("scripted bad request", status=400)

        turns = request.options.get("turns")
        plan = _scripted_turn(turns, request.call_index) if turns is not None else scripted_plan(request.messages)
        plan = _apply_fault(plan, fault)
        delay = SLOW_DELAY_SECONDS if fault == "slow" else _delay_for(request)
        yield from _emit(plan, request=request, fault=fault, delay=delay)

    def classify_input(self, *, history: list[dict], text: str) -> InputClassification:
        return classify_input_by_rules(history=history, text=text)

    def summarize(self, *, previous: str, messages: list[dict], max_tokens: int) -> Summary:
        return summarize_by_rules(previous=previous, messages=messages, max_tokens=max_tokens)


def summarize_by_rules(*, previous: str, messages: list[dict], max_tokens: int) -> Summary:
    """Deterministic and extractive: the numbers (orders, amounts) mentioned so far first — the
    facts a later request is likely to need — then what each side said, shortened, the newest
    kept when it is too long."""
    facts_before, _, said_before = previous.partition(_SUMMARY_SAID)
    numbers = _NUMBER.findall(facts_before)
    lines = [said_before] if said_before else []
    for message in messages:
        text = _content(message).strip()
        numbers += _NUMBER.findall(text)
        if message.get("role") in ("user", "assistant") and text:
            lines.append(f"{message['role']}: {text[:160]}")
    facts = _SUMMARY_FACTS + ", ".join(dict.fromkeys(numbers))
    budget = max(0, max_tokens * 4 - len(facts) - len(_SUMMARY_SAID))
    said = " | ".join(line for line in lines if line)
    if len(said) > budget:
        said = "…" + said[-max(0, budget - 1):]
    text = (facts + _SUMMARY_SAID + said)[: max_tokens * 4]
    used = sum(len(_content(m).split()) for m in messages)
    return Summary(text=text, input_tokens=used, output_tokens=max(1, len(text.split())))


_SUMMARY_FACTS = "Numbers mentioned: "
_SUMMARY_SAID = ". Said: "


def scripted_plan(messages: list[dict]) -> Plan:
    """What the scripted model answers next, without faults: the tool work of the request (and
    of whatever was added to it meanwhile) first, then one answer covering all of it."""
    planners = {
        "noop": _plan_noop,
        "refund": _plan_refund,
        "order_status": _plan_order_status,
        "user_level": _plan_user_level,
        "weather": _plan_weather,
    }
    plans = []
    for current in _current_requests(messages):
        planner = planners.get(current.intent)
        plans.append(planner(current) if planner else Plan(text=HELP_TEXT))
    working = next((plan for plan in plans if plan.calls), None)
    if working is not None:
        return working
    return Plan(text=" ".join(plan.text for plan in plans))


def _scripted_turn(turns: list, call_index: int) -> Plan:
    if call_index >= len(turns):
        return Plan(text=SCRIPTED_DONE_TEXT)
    turn = turns[call_index] or {}
    calls = tuple(PlannedCall(c["name"], dict(c.get("arguments") or {})) for c in turn.get("calls") or [])
    return Plan(text=turn.get("text", ""), calls=calls)


def classify_input_by_rules(*, history: list[dict], text: str) -> InputClassification:
    lowered = text.lower().strip()
    for phrase in SWITCH_PHRASES:
        if re.search(rf"\b{phrase}\b", lowered):
            return InputClassification("new_intent", f'new_intent: switch phrase "{phrase}"')
    opener = lowered.split(maxsplit=1)[0].strip(",.!") if lowered else ""
    if opener in SUPPLEMENT_OPENERS:
        return InputClassification("supplement", f'supplement: starts with "{opener}"')
    current_intent = _current_request(history).intent
    new_intent = _intent_of(text)
    if current_intent and new_intent and new_intent != current_intent:
        return InputClassification(
            "new_intent", f"new_intent: asks about {new_intent} while the run is about {current_intent}"
        )
    detail = _USER_ID.search(lowered) or _NUMBER.search(lowered)
    if detail:
        return InputClassification("supplement", f'supplement: supplies a detail ("{detail.group(0)}")')
    return InputClassification("supplement", "default: treated as added information")


# --- understanding the conversation -------------------------------------------------------


def _intent_of(text: str) -> str | None:
    lowered = text.lower()
    if _noop_count(lowered) is not None:
        return "noop"
    if "refund" in lowered:
        return "refund"
    if _ORDER_STATUS_PATTERN.search(lowered):
        return "order_status"
    if "level" in lowered:
        return "user_level"
    if "weather" in lowered:
        return "weather"
    return None


def _current_request(messages: list[dict]) -> _Request:
    return _current_requests(messages)[0]


def _current_requests(messages: list[dict]) -> list[_Request]:
    """The request being worked on, and what was added to it while the run worked (messages the
    context marks as supplements) that asks for something of its own.

    Walk back from the last user message to the unmarked one that states an intent; later user
    messages supplement it. A finished answer (assistant text that is not a question) closes
    the previous request, so "hello" after a completed refund does not refund again."""
    start = None
    crossed_final_answer = False
    seen_user = False
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        role = message.get("role")
        if role == "assistant" and seen_user and _is_final_answer(message):
            crossed_final_answer = True
        if role != "user":
            continue
        if crossed_final_answer:
            break
        seen_user = True
        start = index
        if _intent_of(_content(message)) and not _is_supplement(message):
            break
    if start is None:
        return [_Request(intent=None, intent_text="")]
    tail = messages[start:]
    intent_text = _content(messages[start])
    main = _Request(intent=_intent_of(intent_text), intent_text=intent_text, results=_tool_results(tail))
    requests = [main]
    for position, message in enumerate(tail):
        if message.get("role") != "user":
            continue
        text = _content(message)
        own_intent = _intent_of(text) if position and _is_supplement(message) else None
        if own_intent and own_intent != main.intent:
            # A request of its own, added to this one: its details are its own text.
            requests.append(_Request(intent=own_intent, intent_text=text, user_texts=[text],
                                     results=_tool_results(tail[position:])))
        else:
            main.user_texts.append(text)
    if main.intent is None and len(requests) > 1:
        requests.pop(0)
    return requests


def _is_supplement(message: dict) -> bool:
    return (message.get("content") or "").startswith(SUPPLEMENT_NOTE)


def _is_final_answer(message: dict) -> bool:
    text = _content(message).strip()
    return not message.get("tool_calls") and bool(text) and not text.endswith("?")


def _tool_results(messages: list[dict]) -> list[_ToolResult]:
    requested: dict[str, tuple[str, dict]] = {}
    results = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            requested[call.get("id")] = (function.get("name"), _json_object(function.get("arguments")))
        if message.get("role") == "tool":
            name, arguments = requested.get(message.get("tool_call_id"), (None, {}))
            results.append(_ToolResult(name=name, arguments=arguments, payload=_json_object(_content(message))))
    return results


def _json_object(text) -> dict:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text or "")
    except (TypeError, ValueError):
        return {"raw": text}
    return value if isinstance(value, dict) else {"value": value}


def _content(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    content = content or ""
    return content[len(SUPPLEMENT_NOTE):] if content.startswith(SUPPLEMENT_NOTE) else content


def _order_number(texts: list[str]) -> str | None:
    """The latest user message that names a number wins: a supplement corrects or fills in."""
    for text in reversed(texts):
        after_word = _ORDER_NUMBER_AFTER_WORD.search(text.lower())
        if after_word:
            return after_word.group(1)
        anywhere = _NUMBER.search(text)
        if anywhere:
            return anywhere.group(0)
    return None


def _noop_count(lowered: str) -> int | None:
    for pattern in _NOOP_PATTERNS:
        match = pattern.search(lowered)
        if match:
            return int(match.group(1))
    return None


def _city(text: str) -> str:
    _, found, after = text.rpartition(" in ")
    if not found:
        return "Paris"
    clause = re.split(r"[.,;:!?]", after, maxsplit=1)[0]
    words = [word.strip("'\"()") for word in clause.split()]
    capitalised = []
    for word in words:
        if not word[:1].isupper():
            break
        capitalised.append(word)
    city = " ".join(capitalised) or (words[0].capitalize() if words else "")
    return city or "Paris"


def _error_text(error: dict) -> str:
    """The customer reads this: the tool message's plain-language `message` (tools_app.outcomes),
    never a raw code. Without one (an older or foreign tool), a general sentence."""
    message = str(error.get("message") or "").strip() or "something went wrong on the other side."
    return message[:1].lower() + message[1:] if not message[:2].isupper() else message


# --- planners ------------------------------------------------------------------------------


def _ask_for_the_order(current: _Request, question: str) -> Plan:
    """Ask the user (and wait for the answer); if the question went unanswered, say what is missing."""
    if any(result.error for result in current.results_of("ask_user")):
        return Plan(text=NO_ANSWER_TEXT)
    return Plan(calls=(PlannedCall("ask_user", {"question": question}),))


def _plan_refund(current: _Request) -> Plan:
    order_id = _order_number(current.user_texts)
    if order_id is None:
        return _ask_for_the_order(current, ASK_REFUND_ORDER_TEXT)
    lookups = [r for r in current.results_of("query_order") if str(r.arguments.get("order_id")) == order_id]
    refunds = [r for r in current.results_of("execute_refund") if str(r.arguments.get("order_id")) == order_id]
    order = lookups[-1].payload if lookups else {}
    if refunds:
        # Of duplicate refund calls, one booked refund is the outcome the user cares about.
        booked = next((r for r in refunds if "refund_id" in r.payload), refunds[-1])
        return Plan(text=_refund_outcome_text(order_id, booked, order))
    if not lookups:
        return Plan(calls=(PlannedCall("query_order", {"order_id": order_id}),))
    if lookups[-1].error:
        return Plan(text=f"I could not look up order {order_id}: {_error_text(lookups[-1].error)}")
    if order.get("refunded"):
        # The order says it was refunded already: asking for a second refund would only be refused.
        return Plan(text=f"Order {order_id} has already been refunded, so there is nothing more to refund.")
    if order.get("refund_eligible"):
        arguments = {"order_id": order_id, "amount": order.get("amount"), "reason": "customer request"}
        return Plan(calls=(PlannedCall("execute_refund", arguments),))
    reason = order.get("ineligible_reason") or "it does not meet the refund policy"
    return Plan(text=f"I'm sorry, but order {order_id} is not eligible for a refund: {reason}.")


def _refund_outcome_text(order_id: str, refund: _ToolResult, order: dict) -> str:
    if refund.error:
        return f"I'm sorry, the refund for order {order_id} was not made: {_error_text(refund.error)}"
    amount = refund.payload.get("amount", refund.arguments.get("amount", order.get("amount")))
    currency = refund.payload.get("currency", order.get("currency", ""))
    money = f"{amount} {currency}".strip()
    # A refund an operator confirmed by hand may come without the gateway's answer: it is done all the same.
    reference = f" (refund id {refund.payload['refund_id']})" if "refund_id" in refund.payload else ""
    return f"Done: the refund of {money} for order {order_id} has been issued{reference}."


def _plan_order_status(current: _Request) -> Plan:
    order_id = _order_number(current.user_texts)
    if order_id is None:
        return _ask_for_the_order(current, ASK_CHECK_ORDER_TEXT)
    lookups = [r for r in current.results_of("query_order") if str(r.arguments.get("order_id")) == order_id]
    if not lookups:
        return Plan(calls=(PlannedCall("query_order", {"order_id": order_id}),))
    if lookups[-1].error:
        return Plan(text=f"I could not look up order {order_id}: {_error_text(lookups[-1].error)}")
    order = lookups[-1].payload
    money = f"{order.get('amount', '?')} {order.get('currency', '')}".strip()
    return Plan(text=f"Order {order_id} is {order.get('status', 'unknown')}, amount {money}.")


def _plan_user_level(current: _Request) -> Plan:
    ids = [match for text in current.user_texts for match in _USER_ID.findall(text.lower())]
    user_id = ids[-1] if ids else "me"
    lookups = [r for r in current.results_of("query_user_level") if r.arguments.get("user_id") == user_id]
    if not lookups:
        return Plan(calls=(PlannedCall("query_user_level", {"user_id": user_id}),))
    if lookups[-1].error:
        return Plan(text=f"I could not look up the level of {user_id}: {_error_text(lookups[-1].error)}")
    result = lookups[-1].payload
    who = "Your" if user_id == "me" else f"User {result.get('user_id', user_id)}'s"
    return Plan(text=f"{who} level is {result.get('level', 'unknown')}.")


def _plan_weather(current: _Request) -> Plan:
    city = _city(current.intent_text)
    lookups = [r for r in current.results_of("get_weather") if str(r.arguments.get("city")).lower() == city.lower()]
    if not lookups:
        return Plan(calls=(PlannedCall("get_weather", {"city": city}),))
    if lookups[-1].error:
        return Plan(text=f"I could not get the weather in {city}: {_error_text(lookups[-1].error)}")
    weather = lookups[-1].payload
    return Plan(text=f"The weather in {city} is {weather.get('summary')}, {weather.get('temperature_c')}°C.")


def _plan_noop(current: _Request) -> Plan:
    wanted = _noop_count(current.intent_text.lower()) or 0
    done = len(current.results_of("noop"))
    if done < wanted:
        return Plan(calls=(PlannedCall("noop", {"i": done}),))
    return Plan(text=f"Done: {wanted} no-op calls.")


# --- faults and streaming ------------------------------------------------------------------


def _fault_for(request: ModelRequest) -> str | None:
    faults = request.options.get("faults") or []
    if request.call_index >= len(faults):
        return None
    fault = faults[request.call_index]
    if fault in (None, "ok"):
        return None
    if fault not in FAULTS:
        raise PermanentModelError(f"unknown scripted fault {fault!r}")
    return fault


def _apply_fault(plan: Plan, fault: str | None) -> Plan:
    if fault == "unknown_tool":
        return Plan(calls=(PlannedCall("transfer_all_funds", {"destination": "acct_external", "amount": "all"}),))
    if fault == "duplicate_refund" and any(call.name == "execute_refund" for call in plan.calls):
        refund = next(call for call in plan.calls if call.name == "execute_refund")
        return replace(plan, calls=plan.calls + (refund,))
    if fault == "schema_invalid":
        calls = tuple(replace(c, arguments={k: [v] for k, v in c.arguments.items()}) for c in plan.calls)
        return replace(plan, calls=calls)
    if fault == "claims_approval":
        extra = {"approved_by": "admin", "approval_id": "fake"}
        calls = tuple(replace(call, arguments={**call.arguments, **extra}) for call in plan.calls)
        return Plan(text=f"{CLAIMS_APPROVAL_TEXT} {plan.text}".strip(), calls=calls)
    if fault in ("length", "disconnect") and plan.calls and not plan.text:
        return replace(plan, text=LENGTH_PREFACE_TEXT)
    return plan


def _emit(plan: Plan, *, request: ModelRequest, fault: str | None, delay: float) -> Iterator[StreamEvent]:
    text_chunks = _text_chunks(plan.text)
    if fault == "disconnect":
        yield from _paced((TextDelta(chunk) for chunk in text_chunks[:2]), delay)
        raise TransientModelError("stream dropped")

    arguments = [json.dumps(call.arguments) for call in plan.calls]
    if fault == "invalid_json":
        arguments = [text[:-1] + ', "note": }' for text in arguments]
    cut = fault == "truncated_args" or fault == "length"
    if cut and plan.calls:
        plan, arguments = replace(plan, calls=plan.calls[:1]), [arguments[0][: len(arguments[0]) // 2]]
    elif cut:
        text_chunks = text_chunks[: max(1, len(text_chunks) // 2)]

    events: list[StreamEvent] = [TextDelta(chunk) for chunk in text_chunks]
    for index, (call, argument_text) in enumerate(zip(plan.calls, arguments)):
        events.extend(_tool_call_fragments(request, index, call.name, argument_text))
    yield from _paced(events, delay)
    if fault == "truncated_args":
        return
    output = sum(len(chunk.split()) for chunk in text_chunks) + sum(len(text) // 4 for text in arguments)
    yield Usage(input_tokens=_word_count(request.messages), output_tokens=max(1, output))
    if fault == "length":
        yield Finish("length")
    else:
        yield Finish("tool_calls" if plan.calls else "stop")


def _paced(events, delay: float) -> Iterator[StreamEvent]:
    for position, event in enumerate(events):
        if position and delay > 0:
            time.sleep(delay)
        yield event


def _tool_call_fragments(request: ModelRequest, index: int, name: str, argument_text: str) -> list[ToolCallDelta]:
    pieces = _split(argument_text, parts=4)
    call_id = tool_call_id_for(run_id=request.run_id, call_index=request.call_index, index=index)
    first = ToolCallDelta(index=index, id=call_id, name=name, arguments=pieces[0])
    return [first] + [ToolCallDelta(index=index, arguments=piece) for piece in pieces[1:]]


def tool_call_id_for(*, run_id: str, call_index: int, index: int) -> str:
    """Deterministic, and different for every model call, as a real model's ids are."""
    return "call_" + hashlib.sha256(f"{run_id}|{call_index}|{index}".encode()).hexdigest()[:16]


def _split(text: str, *, parts: int) -> list[str]:
    size = max(1, -(-len(text) // parts))
    pieces = [text[start : start + size] for start in range(0, len(text), size)]
    return pieces or [""]


def _text_chunks(text: str) -> list[str]:
    words = _WORDS.findall(text)
    return ["".join(words[start : start + 2]) for start in range(0, len(words), 2)]


def _word_count(messages: list[dict]) -> int:
    count = 0
    for message in messages:
        count += len(_content(message).split())
        for call in message.get("tool_calls") or []:
            count += len(str((call.get("function") or {}).get("arguments", "")).split())
    return count


def _delay_for(request: ModelRequest) -> float:
    if "delay" in request.options:
        return float(request.options["delay"])
    # Read lazily, with a default, so the fake OpenAI server can run without Django settings.
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        return float(getattr(settings, "WARDEN_SCRIPTED_DELAY_SECONDS", _DEFAULT_DELAY_SECONDS))
    except ImproperlyConfigured:
        return _DEFAULT_DELAY_SECONDS
