"""Model context is a transient slice of the immutable history (SPEC §4).

Each model call gets the system prompt, a summary of older history if one is stored, and as
many of the newest messages as fit the token window — never splitting an assistant's tool
calls from the tool results that answer them. The step records which messages it saw.
"""

import json
from dataclasses import dataclass

from django.conf import settings

from runs_app.models import ContextSummary
from sessions_app.models import Message, MessageRole

SYSTEM_PROMPT = (
    "You are Warden's customer-service agent. You can look up orders, user levels and the "
    "weather, and request refunds. Refunds are executed only after a human approves them; "
    "never claim a refund is approved or done unless a tool result says so."
)


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def message_to_openai(message: Message) -> dict:
    if message.role == MessageRole.TOOL:
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    entry: dict = {"role": message.role, "content": message.content}
    if message.tool_calls:
        entry["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in message.tool_calls
        ]
    return entry


@dataclass
class BuiltContext:
    messages: list[dict]
    manifest: dict


def _blocks(messages: list[Message]) -> list[list[Message]]:
    """Group an assistant message with the tool messages answering it: they fit together or not at all."""
    blocks: list[list[Message]] = []
    for message in messages:
        if message.role == MessageRole.TOOL and blocks and blocks[-1][0].tool_calls:
            blocks[-1].append(message)
        else:
            blocks.append([message])
    return blocks


def context_build(*, session_id, window_tokens: int | None = None) -> BuiltContext:
    window = window_tokens or settings.WARDEN_CONTEXT_TOKENS
    history = list(
        Message.objects.filter(session_id=session_id)
        .only("seq", "role", "content", "tool_calls", "tool_call_id")
        .order_by("seq")
    )
    budget = window - estimate_tokens(SYSTEM_PROMPT)
    chosen: list[list[Message]] = []
    for block in reversed(_blocks(history)):
        cost = sum(estimate_tokens(m.content) + estimate_tokens(json.dumps(m.tool_calls)) for m in block)
        if cost > budget and chosen:
            break
        chosen.append(block)
        budget -= cost
    chosen.reverse()
    kept = [m for block in chosen for m in block]
    first_kept_seq = kept[0].seq if kept else None
    summary = None
    if first_kept_seq is not None and first_kept_seq > 1:
        summary = (
            ContextSummary.objects.filter(session_id=session_id, covers_through_seq__lt=first_kept_seq)
            .order_by("-covers_through_seq")
            .first()
        )
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    if summary is not None:
        messages.append({"role": "system", "content": f"Summary of earlier conversation: {summary.content}"})
    messages += [message_to_openai(m) for m in kept]
    manifest = {
        "message_seqs": [m.seq for m in kept],
        "omitted_before_seq": first_kept_seq if first_kept_seq and first_kept_seq > 1 else None,
        "summary_through_seq": summary.covers_through_seq if summary else None,
        "window_tokens": window,
    }
    return BuiltContext(messages=messages, manifest=manifest)


def context_summarize(*, session_id, through_seq: int) -> ContextSummary:
    """Store an extractive summary of history up to `through_seq` beside the history."""
    lines = []
    for message in Message.objects.filter(session_id=session_id, seq__lte=through_seq).order_by("seq"):
        if message.role in (MessageRole.USER, MessageRole.ASSISTANT) and message.content:
            lines.append(f"{message.role}: {message.content[:160]}")
    summary, _ = ContextSummary.objects.get_or_create(
        session_id=session_id, covers_through_seq=through_seq, defaults={"content": " | ".join(lines)[-4000:]}
    )
    return summary
