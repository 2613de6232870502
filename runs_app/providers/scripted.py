"""The scripted model: a deterministic stand-in for a model, no network — the test double of the
engine, and (in demo mode, as demo/model.py, which knows the demo world) the demo's model.

Tests script the turns outright: `options["turns"][call_index]` is
{"text": ..., "calls": [{"name": ..., "arguments": {...}}]} (a call index past the list, or no
script at all, answers "Done."); an argument "$message" is the user's last message. And it can misbehave on purpose: `options["faults"][call_index]`
names a fault for that model call.

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
from dataclasses import dataclass, replace
from typing import Iterator

from runs_app.providers.base import (
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
from runs_app.providers.interrupt import current_interrupt
from runs_app.providers.rules import classify_input_by_rules, message_text, summarize_by_rules

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

SCRIPTED_DONE_TEXT = "Done."
CLAIMS_APPROVAL_TEXT = "This refund was already approved by an admin."
LENGTH_PREFACE_TEXT = "Let me look into that for you right away."

_WORDS = re.compile(r"\S+\s*")


@dataclass(frozen=True)
class PlannedCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class Plan:
    """One model turn: text, tool calls, or both (faults add text to tool turns)."""

    text: str = ""
    calls: tuple[PlannedCall, ...] = ()


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
        plan = (_scripted_turn(turns, request.call_index, last_user_text(request.messages)) if turns is not None
                else self.plan(request.messages))
        plan = _apply_fault(plan, fault)
        delay = SLOW_DELAY_SECONDS if fault == "slow" else _delay_for(request)
        yield from _emit(plan, request=request, fault=fault, delay=delay)

    def plan(self, messages: list[dict]) -> "Plan":
        """The next turn when no script says it (demo/model.py plans the demo world's)."""
        return Plan(text=SCRIPTED_DONE_TEXT)

    def classify_input(self, *, history: list[dict], text: str) -> InputClassification:
        return classify_input_by_rules(history=history, text=text)

    def summarize(self, *, previous: str, messages: list[dict], max_tokens: int) -> Summary:
        return summarize_by_rules(previous=previous, messages=messages, max_tokens=max_tokens)


def _scripted_turn(turns: list, call_index: int, said: str = "") -> Plan:
    """The scripted turn; an argument whose value is "$message" takes the text of the user's last
    message (so one agent's script can act on what each conversation asks)."""
    if call_index >= len(turns):
        return Plan(text=SCRIPTED_DONE_TEXT)
    turn = turns[call_index] or {}
    calls = tuple(
        PlannedCall(c["name"], {k: said if v == MESSAGE_PLACEHOLDER else v for k, v in (c.get("arguments") or {}).items()})
        for c in turn.get("calls") or []
    )
    return Plan(text=turn.get("text", ""), calls=calls)


MESSAGE_PLACEHOLDER = "$message"


def last_user_text(messages: list[dict]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message).strip()
    return ""


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
    """The events, a `delay` apart — a pause an abort ends at once, as a shut socket ends a real
    model's stream (runs_app/providers/interrupt.py)."""
    interrupt = current_interrupt()
    for position, event in enumerate(events):
        if position and delay > 0:
            if interrupt is None:
                time.sleep(delay)
            elif interrupt.wait(delay):
                raise TransientModelError("scripted stream aborted")
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
        count += len(message_text(message).split())
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
