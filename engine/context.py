"""Model context is a transient slice of the immutable history (SPEC §4).

Each model call gets the system prompt, a summary of the older history when the history has
outgrown the token window, and as many of the newest messages as fit — never splitting an
assistant's tool calls from the tool results that answer them. Summaries are stored beside the
history (ContextSummary), never instead of it, and made by the run's provider; each step records
exactly which messages and which summary it saw (`context_manifest`).

The cost is proportional to the window, not to the history: the newest messages are read page by
page from the end, and a new summary folds only what the last one did not cover.
"""

import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection

from runs_app.models import ContextSummary
from runs_app.providers.base import SUPPLEMENT_NOTE, Provider
from sessions_app.models import InputDisposition, Message, MessageRole

SYSTEM_PROMPT = (
    "You are Warden's customer-service agent. You can look up orders, user levels and the "
    "weather, and request refunds. Refunds are executed only after a human approves them; "
    "never claim a refund is approved or done unless a tool result says so. When you need "
    "something only the user can tell you, ask with the ask_user tool."
)
SUMMARY_PREFIX = "Summary of the earlier conversation: "
# Reading the newest messages back from the end, this many at a time.
PAGE = 200
# A new summary leaves this share of the window to recent messages, so the next calls fit
# without summarizing again at once.
RECENT_SHARE_AFTER_SUMMARY = 0.5


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def message_to_openai(message: "Message | HistoryMessage") -> dict:
    if message.role == MessageRole.TOOL:
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    content = message.content
    if getattr(message, "is_supplement", False):
        content = SUPPLEMENT_NOTE + content
    entry: dict = {"role": message.role, "content": content}
    if message.tool_calls:
        entry["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in message.tool_calls
        ]
    return entry


def message_cost(message: "Message | HistoryMessage") -> int:
    return estimate_tokens(message.content) + (estimate_tokens(json.dumps(message.tool_calls)) if message.tool_calls else 0)


def _cost(block: list) -> int:
    return sum(message_cost(m) for m in block)


def seq_ranges(seqs, *, after: list[list[int]] = ()) -> list[list[int]]:
    """Message seqs as inclusive [first, last] ranges, continuing the ranges `after` (left as they
    were): what a model step saw, in a record whose size does not grow with the window (the kept
    messages are one contiguous stretch of the history)."""
    ranges = [list(r) for r in after]
    for seq in seqs:
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1][1] = seq
        else:
            ranges.append([seq, seq])
    return ranges


def manifest_covers(manifest: dict, seq: int) -> bool:
    """Whether the model step with this context manifest saw the message `seq`."""
    return any(first <= seq <= last for first, last in manifest.get("message_seq_ranges") or ())


@dataclass
class CachedContext:
    """The history a model call was shown, kept while this worker's own commits are the only
    writes to the session: the next call's context is it plus what those commits appended, as
    long as everything still fits the window (context_build's result in that case, without
    reading the history again)."""

    session_id: Any
    message_seq: int  # the session's last message seq the cache has seen
    messages: list[dict]  # for the provider: the system entries, then the history kept
    seq_ranges: list[list[int]]  # the kept history's seqs (seq_ranges)
    budget_left: int  # tokens of the window still free
    manifest: dict = field(default_factory=dict)


@dataclass
class BuiltContext:
    messages: list[dict]
    manifest: dict
    # Tokens the provider reported for making a summary now (charged to the run).
    summary_tokens: int = 0
    # When the whole history since the summary fitted: what a worker may extend with the
    # messages its own next commits append (engine/state/fast.py), instead of reading again.
    cacheable: CachedContext | None = None


@dataclass(slots=True)
class HistoryMessage:
    """A message of the history as model context needs it (what Message has of it, and whether it
    came in as a supplement while a run worked)."""

    seq: int
    role: str
    content: str
    tool_calls: list
    tool_call_id: str
    is_supplement: bool


@dataclass
class _Newest:
    """Blocks of history read from the end: kept while they fit."""

    blocks: list[list[HistoryMessage]] = field(default_factory=list)  # newest first
    reached_floor: bool = False


_HISTORY = (
    'SELECT m."seq", m."role", m."content", m."tool_calls", m."tool_call_id", EXISTS (SELECT 1 FROM '
    '"sessions_app_pendinginput" p WHERE p."message_id" = m."id" AND p."disposition" = %s) '
    'FROM "sessions_app_message" m WHERE m."session_id" = %s AND m."seq" > %s AND m."seq" <= %s '
    'ORDER BY m."seq" {order} LIMIT %s'
)
_NO_LIMIT = 2**31 - 1


def _history(*, session_id, after_seq: int, through_seq: int = _NO_LIMIT, newest_first: bool = False,
             limit: int = _NO_LIMIT) -> list[HistoryMessage]:
    """Messages with after_seq < seq <= through_seq, in one fixed statement (no ORM compiling:
    the first model call of every slice reads its context)."""
    with connection.cursor() as cursor:
        cursor.execute(_HISTORY.format(order="DESC" if newest_first else "ASC"),
                       [InputDisposition.SUPPLEMENTED, session_id, after_seq, through_seq, limit])
        rows = cursor.fetchall()
    # JSON columns arrive as text on Django's connections.
    return [HistoryMessage(seq, role, content, json.loads(tool_calls), tool_call_id, is_supplement)
            for seq, role, content, tool_calls, tool_call_id, is_supplement in rows]


def _latest_summary(session_id) -> ContextSummary | None:
    with connection.cursor() as cursor:
        cursor.execute('SELECT "id", "covers_through_seq", "content" FROM "runs_app_contextsummary" '
                       'WHERE "session_id" = %s ORDER BY "covers_through_seq" DESC LIMIT 1', [session_id])
        row = cursor.fetchone()
    if row is None:
        return None
    return ContextSummary(id=row[0], session_id=session_id, covers_through_seq=row[1], content=row[2])


def _newest_blocks(*, session_id, after_seq: int, budget: int) -> _Newest:
    """The newest blocks with seq > after_seq that fit in `budget` tokens, read page by page."""
    found = _Newest()
    pending_tools: list[HistoryMessage] = []
    before = _NO_LIMIT + 1
    while True:
        rows = _history(session_id=session_id, after_seq=after_seq, through_seq=before - 1, newest_first=True, limit=PAGE)
        for message in rows:
            if message.role == MessageRole.TOOL:
                pending_tools.append(message)
                continue
            block = [message, *reversed(pending_tools)] if message.tool_calls else [message]
            orphans = [] if message.tool_calls else [[tool] for tool in pending_tools]
            pending_tools = []
            for candidate in [*orphans, block]:
                cost = _cost(candidate)
                if cost > budget and found.blocks:
                    return found
                found.blocks.append(candidate)
                budget -= cost
        if len(rows) < PAGE:
            found.blocks.extend([tool] for tool in pending_tools)
            found.reached_floor = True
            return found
        before = rows[-1].seq


def context_build(*, session_id, provider: Provider | None = None, window_tokens: int | None = None,
                  instructions: str | None = None) -> BuiltContext:
    """The messages for the next model call, after the system prompt: the run's agent version's
    `instructions`, or Warden's own SYSTEM_PROMPT for a run without one. `window_tokens` is what the
    prompt may take — the run's models' window less the answer's limit (engine/model_route.py) —
    else WARDEN_CONTEXT_TOKENS; compaction starts when the history outgrows it. With `provider`, an
    older part that no longer fits is summarized (once) and stored; without one (classifying
    input), it is left out."""
    system_prompt = instructions or SYSTEM_PROMPT
    window = window_tokens or settings.WARDEN_CONTEXT_TOKENS
    budget = window - estimate_tokens(system_prompt)
    summary = _latest_summary(session_id)
    covered = summary.covers_through_seq if summary else 0
    summary_cost = estimate_tokens(SUMMARY_PREFIX + summary.content) if summary else 0
    newest = _newest_blocks(session_id=session_id, after_seq=covered, budget=budget - summary_cost)
    summary_tokens = 0
    made_now = False
    if not newest.reached_floor and provider is not None:
        # The history outgrew the window past what the summary covers: fold the older part in.
        recent = _newest_blocks(session_id=session_id, after_seq=covered, budget=int(budget * RECENT_SHARE_AFTER_SUMMARY))
        first_recent = recent.blocks[-1][0].seq if recent.blocks else covered + 1
        summary, summary_tokens = _summarize(session_id=session_id, previous=summary, through_seq=first_recent - 1,
                                             provider=provider, window=window)
        made_now = True
        covered = summary.covers_through_seq
        summary_cost = estimate_tokens(SUMMARY_PREFIX + summary.content)
        newest = _newest_blocks(session_id=session_id, after_seq=covered, budget=budget - summary_cost)
    kept = [message for block in reversed(newest.blocks) for message in block]
    messages = [{"role": "system", "content": system_prompt}]
    if summary is not None and covered:
        messages.append({"role": "system", "content": SUMMARY_PREFIX + summary.content})
    messages += [message_to_openai(m) for m in kept]
    first_kept = kept[0].seq if kept else covered + 1
    manifest = {
        "message_seq_ranges": seq_ranges(m.seq for m in kept),
        "omitted_before_seq": first_kept if first_kept > covered + 1 else None,
        "summary_id": summary.pk if summary is not None and covered else None,
        "summary_through_seq": covered or None,
        "summary_made_now": made_now,
        "window_tokens": window,
        "estimated_tokens": estimate_tokens(system_prompt) + (summary_cost if covered else 0) + sum(_cost([m]) for m in kept),
    }
    cacheable = None
    if newest.reached_floor and kept:
        used = estimate_tokens(system_prompt) + (summary_cost if covered else 0) + sum(_cost([m]) for m in kept)
        cacheable = CachedContext(session_id=session_id, message_seq=kept[-1].seq, messages=messages,
                                  seq_ranges=manifest["message_seq_ranges"], budget_left=window - used,
                                  manifest={**manifest, "summary_made_now": False})
    return BuiltContext(messages=messages, manifest=manifest, summary_tokens=summary_tokens, cacheable=cacheable)


def context_from_cache(cached) -> BuiltContext:
    """The context context_build would return for a history that still fits whole: the cached
    one with the messages appended since."""
    used = cached.manifest["window_tokens"] - cached.budget_left
    manifest = {**cached.manifest, "message_seq_ranges": cached.seq_ranges, "estimated_tokens": used}
    return BuiltContext(messages=list(cached.messages), manifest=manifest, cacheable=cached)


def _summarize(*, session_id, previous: ContextSummary | None, through_seq: int, provider: Provider,
               window: int) -> tuple[ContextSummary, int]:
    """A summary of the history up to `through_seq`: the previous summary with the messages it
    did not cover folded in, by the provider. Stored beside the history; a concurrent worker's
    identical summary is reused."""
    existing = ContextSummary.objects.filter(session_id=session_id, covers_through_seq=through_seq).first()
    if existing is not None:
        return existing, 0
    start = previous.covers_through_seq if previous else 0
    folded = [message_to_openai(m) for m in _history(session_id=session_id, after_seq=start, through_seq=through_seq)]
    made = provider.summarize(previous=previous.content if previous else "", messages=folded,
                              max_tokens=max(64, window // 4))
    summary, _ = ContextSummary.objects.get_or_create(
        session_id=session_id, covers_through_seq=through_seq, defaults={"content": made.text[:20_000]}
    )
    return summary, made.input_tokens + made.output_tokens
