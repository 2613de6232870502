"""A streaming provider for Anthropic's Messages API, over the HTTP pieces every provider shares
(runs_app/providers/http.py): the same client, slots, interrupt and error sorting.

The endpoint's base URL is the API's root without the version, as Anthropic's SDKs take it —
`https://api.anthropic.com` — and `/v1/messages` is added. The credential goes in `x-api-key`,
with `anthropic-version: 2023-06-01`.

The engine's OpenAI-style chat messages map to Messages: system messages become the top-level
`system`; an assistant's tool calls, `tool_use` blocks (with their parsed input); tool outcomes,
`tool_result` blocks of a user message — consecutive ones in one message, first in it, a failure
(`{"error": {…}}`, tools_app.services.tool_message_content) marked `is_error` — and consecutive
messages of one role are merged, as the API's alternating roles want. `max_tokens` is required:
the request's limit, else DEFAULT_MAX_TOKENS.

The stream's events become the engine's: `message_start` (the prompt's tokens), `content_block_start`
(a tool_use block: its id and name), `content_block_delta` (`text_delta` text, `input_json_delta`
tool-call fragments), `message_delta` (the stop reason and the answer's tokens). The finish is held
back to the end of the body and only given when `message_stop` arrived: `end_turn` and
`stop_sequence` are `stop`, `tool_use` is `tool_calls`, `max_tokens` is `length` — the engine
discards it and asks again with a larger limit, so a tool_use block cut there never executes — and
`refusal` is `content_filter`. A tool_use block never stopped leaves no finish (discarded as
truncated). An `error` event is transient (overloaded_error, api_error, …) unless its type says the
request itself is wrong; `ping` is ignored.
"""

import json
from typing import Iterator

from runs_app.endpoints import Endpoint
from runs_app.providers.base import (
    Finish,
    ModelRequest,
    PermanentModelError,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    TransientModelError,
    Usage,
)
from runs_app.providers.http import EndpointProvider, call_timeout, error_message, redacted, sse_post

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
_STOP_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                "model_context_window_exceeded": "length", "refusal": "content_filter"}
# Error types of a stream's `error` event that retrying the same request cannot mend.
_PERMANENT_TYPES = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                    "request_too_large", "billing_error"}


class AnthropicProvider(EndpointProvider):
    name = "anthropic"
    kind = "anthropic_messages"

    def _stream(self, request: ModelRequest, endpoint: Endpoint) -> Iterator[StreamEvent]:
        body = messages_request(request, model=request.options.get("model") or endpoint.model)
        headers = {"x-api-key": endpoint.credential, "anthropic-version": ANTHROPIC_VERSION}
        tool_blocks: dict[int, int] = {}  # content block index → the call's place in the turn
        open_blocks: set[int] = set()
        reported = [0, 0]  # input and output tokens reported so far (the stream's counts are totals)
        stop_reason, stopped = None, False
        with sse_post(endpoint=endpoint, url=endpoint.base_url.rstrip("/") + "/v1/messages", body=body,
                      headers=headers, timeout=call_timeout(request, endpoint)) as events:
            for event in events:
                data = event.json()
                kind = data.get("type") or event.event
                if kind == "message_start":
                    yield from _usage(data["message"].get("usage") or {}, reported)
                elif kind == "content_block_start":
                    block = data["content_block"]
                    if block.get("type") == "tool_use":
                        position = tool_blocks[data["index"]] = len(tool_blocks)
                        open_blocks.add(data["index"])
                        yield ToolCallDelta(index=position, id=block["id"], name=block["name"])
                    elif block.get("type") == "text" and block.get("text"):
                        yield TextDelta(block["text"])
                elif kind == "content_block_delta":
                    delta = data["delta"]
                    if delta.get("type") == "text_delta" and delta["text"]:
                        yield TextDelta(delta["text"])
                    elif delta.get("type") == "input_json_delta":
                        yield ToolCallDelta(index=tool_blocks[data["index"]], arguments=delta["partial_json"])
                elif kind == "content_block_stop":
                    open_blocks.discard(data["index"])
                elif kind == "message_delta":
                    stop_reason = (data.get("delta") or {}).get("stop_reason") or stop_reason
                    yield from _usage(data.get("usage") or {}, reported)
                elif kind == "message_stop":
                    stopped = True
                elif kind == "error":
                    raise _stream_error(data.get("error") or {}, endpoint)
        # Finish is held back to the end: it then also means the stream arrived complete.
        if stopped and stop_reason is not None:
            finish = _STOP_FINISH.get(stop_reason, stop_reason)
            if open_blocks and finish != "length":
                return  # a tool_use block never stopped: its input may be cut
            yield Finish(finish)


def _usage(usage: dict, reported: list[int]) -> Iterator[Usage]:
    """What `usage` adds to the totals reported so far. Prompt tokens read from or written to the
    cache count as prompt tokens (they are sent, and the budget counts them)."""
    input_total = sum(usage.get(name) or 0 for name in ("input_tokens", "cache_creation_input_tokens",
                                                       "cache_read_input_tokens"))
    output_total = usage.get("output_tokens") or 0
    more_input, more_output = max(0, input_total - reported[0]), max(0, output_total - reported[1])
    if more_input or more_output:
        reported[0] += more_input
        reported[1] += more_output
        yield Usage(input_tokens=more_input, output_tokens=more_output)


def _stream_error(error: dict, endpoint: Endpoint) -> Exception:
    kind = error.get("type") or "error"
    message = redacted(f"model stream error: {kind} - {error_message({'error': error})}", endpoint)
    if kind in _PERMANENT_TYPES:
        return PermanentModelError(message)
    return TransientModelError(message)


def tool_result_is_error(content: str) -> bool:
    """Whether a tool message tells of a failure: tools_app.services.tool_message_content writes
    `{"error": {"code": …}}` for one (and an operator's edit adds notes beside it)."""
    try:
        parsed = json.loads(content)
    except ValueError:
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) and "result" not in parsed


def messages_request(request: ModelRequest, *, model: str) -> dict:
    """The Messages request body for the engine's chat-style request."""
    system = []
    messages: list[dict] = []

    def add(role: str, blocks: list[dict]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)  # roles must alternate: one turn of each
        else:
            messages.append({"role": role, "content": blocks})

    for message in request.messages:
        role = message.get("role")
        content = message.get("content") or ""
        if role == "system":
            system.append(content)
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": message.get("tool_call_id") or "", "content": content,
                          **({"is_error": True} if tool_result_is_error(content) else {})}])
        elif role == "user":
            add("user", [{"type": "text", "text": content}] if content else [])
        elif role == "assistant":
            blocks = [{"type": "text", "text": content}] if content else []
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                blocks.append({"type": "tool_use", "id": call.get("id") or "", "name": function.get("name") or "",
                               "input": _input(function.get("arguments"))})
            add("assistant", blocks)
    for message in messages:
        if message["role"] == "user":
            # The results answering the previous turn's tool_use blocks come first in the message.
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    body: dict = {"model": model, "messages": messages, "max_tokens": request.max_output_tokens or DEFAULT_MAX_TOKENS,
                  "stream": True}
    if system:
        body["system"] = "\n\n".join(system)
    if request.tools:
        body["tools"] = [_tool(tool) for tool in request.tools]
    return body


def _input(arguments) -> dict:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {}  # never stored so: a call's arguments are checked before it enters the history
    return parsed if isinstance(parsed, dict) else {}


def _tool(tool: dict) -> dict:
    function = tool.get("function") or {}
    return {"name": function.get("name"), "description": function.get("description") or "",
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}}}
