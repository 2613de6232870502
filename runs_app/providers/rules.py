"""Reading a conversation by rules, with no model: what the current request is, what was added to
it, what the tools answered — and, from that, the run-time's keyword classifier of interjections
(an agent's `interjection_classifier: keywords`, and the OpenAI provider's fallback) and the
extractive summary the scripted model writes. Deterministic, no network."""

import json
import re
from dataclasses import dataclass, field

from runs_app.providers.base import SUPPLEMENT_NOTE, InputClassification, Summary

# Request the keyword rules know by their words.
NOOP_PATTERNS = (re.compile(r"\bno-?op\s+(\d+)\b"), re.compile(r"\brun\s+(\d+)\s+no-?ops?\b"))
ORDER_STATUS_PATTERN = re.compile(r"\b(check|status|look\s*up)\b.*\border\b|\border\b.*\bstatus\b")
NUMBER = re.compile(r"\b\d{3,}\b")
USER_ID = re.compile(r"\bu\d+\b")

SWITCH_PHRASES = ("forget it", "never mind", "nevermind", "cancel that", "new question", "instead")
SUPPLEMENT_OPENERS = ("also", "and")


@dataclass(frozen=True)
class ToolResult:
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
class Request:
    """The user request the model is working on, as the scripted rules see it."""

    intent: str | None
    intent_text: str
    user_texts: list[str] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)

    def results_of(self, name: str) -> list[ToolResult]:
        return [result for result in self.results if result.name == name]


def classify_input_by_rules(*, history: list[dict], text: str) -> InputClassification:
    lowered = text.lower().strip()
    for phrase in SWITCH_PHRASES:
        if re.search(rf"\b{phrase}\b", lowered):
            return InputClassification("new_intent", f'new_intent: switch phrase "{phrase}"')
    opener = lowered.split(maxsplit=1)[0].strip(",.!") if lowered else ""
    if opener in SUPPLEMENT_OPENERS:
        return InputClassification("supplement", f'supplement: starts with "{opener}"')
    current_intent = current_request(history).intent
    new_intent = intent_of(text)
    if current_intent and new_intent and new_intent != current_intent:
        return InputClassification(
            "new_intent", f"new_intent: asks about {new_intent} while the run is about {current_intent}"
        )
    detail = USER_ID.search(lowered) or NUMBER.search(lowered)
    if detail:
        return InputClassification("supplement", f'supplement: supplies a detail ("{detail.group(0)}")')
    return InputClassification("supplement", "default: treated as added information")


def summarize_by_rules(*, previous: str, messages: list[dict], max_tokens: int) -> Summary:
    """Deterministic and extractive: the numbers (orders, amounts) mentioned so far first — the
    facts a later request is likely to need — then what each side said, shortened, the newest
    kept when it is too long."""
    facts_before, _, said_before = previous.partition(_SUMMARY_SAID)
    numbers = NUMBER.findall(facts_before)
    lines = [said_before] if said_before else []
    for message in messages:
        text = message_text(message).strip()
        numbers += NUMBER.findall(text)
        if message.get("role") in ("user", "assistant") and text:
            lines.append(f"{message['role']}: {text[:160]}")
    facts = _SUMMARY_FACTS + ", ".join(dict.fromkeys(numbers))
    budget = max(0, max_tokens * 4 - len(facts) - len(_SUMMARY_SAID))
    said = " | ".join(line for line in lines if line)
    if len(said) > budget:
        said = "…" + said[-max(0, budget - 1):]
    text = (facts + _SUMMARY_SAID + said)[: max_tokens * 4]
    used = sum(len(message_text(m).split()) for m in messages)
    return Summary(text=text, input_tokens=used, output_tokens=max(1, len(text.split())))


_SUMMARY_FACTS = "Numbers mentioned: "
_SUMMARY_SAID = ". Said: "


def intent_of(text: str) -> str | None:
    lowered = text.lower()
    if noop_count(lowered) is not None:
        return "noop"
    if "refund" in lowered:
        return "refund"
    if ORDER_STATUS_PATTERN.search(lowered):
        return "order_status"
    if "level" in lowered:
        return "user_level"
    if "weather" in lowered:
        return "weather"
    return None


def current_request(messages: list[dict]) -> Request:
    return current_requests(messages)[0]


def current_requests(messages: list[dict]) -> list[Request]:
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
        if role == "assistant" and seen_user and is_final_answer(message):
            crossed_final_answer = True
        if role != "user":
            continue
        if crossed_final_answer:
            break
        seen_user = True
        start = index
        if intent_of(message_text(message)) and not is_supplement(message):
            break
    if start is None:
        return [Request(intent=None, intent_text="")]
    tail = messages[start:]
    intent_text = message_text(messages[start])
    main = Request(intent=intent_of(intent_text), intent_text=intent_text, results=tool_results(tail))
    requests = [main]
    for position, message in enumerate(tail):
        if message.get("role") != "user":
            continue
        text = message_text(message)
        own_intent = intent_of(text) if position and is_supplement(message) else None
        if own_intent and own_intent != main.intent:
            # A request of its own, added to this one: its details are its own text.
            requests.append(Request(intent=own_intent, intent_text=text, user_texts=[text],
                                     results=tool_results(tail[position:])))
        else:
            main.user_texts.append(text)
    if main.intent is None and len(requests) > 1:
        requests.pop(0)
    return requests


def is_supplement(message: dict) -> bool:
    return (message.get("content") or "").startswith(SUPPLEMENT_NOTE)


def is_final_answer(message: dict) -> bool:
    text = message_text(message).strip()
    return not message.get("tool_calls") and bool(text) and not text.endswith("?")


def tool_results(messages: list[dict]) -> list[ToolResult]:
    requested: dict[str, tuple[str, dict]] = {}
    results = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            requested[call.get("id")] = (function.get("name"), json_object(function.get("arguments")))
        if message.get("role") == "tool":
            name, arguments = requested.get(message.get("tool_call_id"), (None, {}))
            results.append(ToolResult(name=name, arguments=arguments, payload=json_object(message_text(message))))
    return results


def json_object(text) -> dict:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text or "")
    except (TypeError, ValueError):
        return {"raw": text}
    return value if isinstance(value, dict) else {"value": value}


def message_text(message: dict) -> str:
    """A message's text, without the mark the context puts on supplements."""
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    content = content or ""
    return content[len(SUPPLEMENT_NOTE):] if content.startswith(SUPPLEMENT_NOTE) else content


def noop_count(lowered: str) -> int | None:
    for pattern in NOOP_PATTERNS:
        match = pattern.search(lowered)
        if match:
            return int(match.group(1))
    return None
