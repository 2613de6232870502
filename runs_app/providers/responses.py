"""A streaming provider for OpenAI's Responses API (POST {base_url}/responses; base URL as for Chat
Completions, e.g. https://api.openai.com/v1), over the HTTP pieces every provider shares
(runs_app/providers/http.py): the same client, slots, interrupt and error sorting.

The engine's OpenAI-style chat messages map to Responses input items: system messages become
`instructions`; user and assistant text, input messages; an assistant's tool calls, `function_call`
items (several: parallel calls); a tool's outcome — a failure's error object included, as the text
the model reads — a `function_call_output`. Nothing is stored at OpenAI (`store: false`): Warden
keeps the history. Tools are sent non-strict, as Chat Completions takes them.

The stream's events become the engine's: `response.output_text.delta` text,
`response.output_item.added` (a function_call: its call_id and name) and
`response.function_call_arguments.delta` tool-call fragments, the usage of the final response.
The finish is held back to the end of the body: `response.completed` is `stop` (`tool_calls`
when it asked for any); `response.incomplete` cut by max_output_tokens is `length` — the engine
discards it and asks again with a larger limit, so a call cut there never executes; a function
call never closed (`response.output_item.done`) leaves no finish at all (discarded as truncated).
`response.failed` and `error` events are transient unless the error names the request itself.
"""

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

# Error codes of a failed response that retrying the same request cannot mend.
_PERMANENT_CODES = {"invalid_prompt", "invalid_request_error", "context_length_exceeded", "invalid_api_key",
                    "model_not_found", "insufficient_quota"}
_INCOMPLETE_FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}


class ResponsesProvider(EndpointProvider):
    name = "openai-responses"
    kind = "responses"

    def _stream(self, request: ModelRequest, endpoint: Endpoint) -> Iterator[StreamEvent]:
        body = responses_request(request, model=request.options.get("model") or endpoint.model)
        calls: dict[int, int] = {}  # output_index → the call's place in the turn
        open_calls: set[int] = set()
        finish = None
        with sse_post(endpoint=endpoint, url=endpoint.base_url.rstrip("/") + "/responses", body=body,
                      headers={"Authorization": f"Bearer {endpoint.credential}"},
                      timeout=call_timeout(request, endpoint)) as events:
            for event in events:
                data = event.json()
                kind = data.get("type") or event.event
                if kind == "response.output_text.delta":
                    if data["delta"]:
                        yield TextDelta(data["delta"])
                elif kind == "response.output_item.added" and data["item"].get("type") == "function_call":
                    item = data["item"]
                    position = calls[data["output_index"]] = len(calls)
                    open_calls.add(position)
                    yield ToolCallDelta(index=position, id=item["call_id"], name=item["name"],
                                        arguments=item.get("arguments") or "")
                elif kind == "response.function_call_arguments.delta":
                    yield ToolCallDelta(index=calls[data["output_index"]], arguments=data["delta"])
                elif kind == "response.output_item.done" and data["output_index"] in calls:
                    open_calls.discard(calls[data["output_index"]])
                elif kind == "response.refusal.delta":
                    finish = "content_filter"  # the model declined: its answer is not one to act on
                elif kind in ("response.completed", "response.incomplete", "response.failed"):
                    response = data["response"]
                    usage = response.get("usage") or {}
                    if usage:
                        yield Usage(input_tokens=usage.get("input_tokens") or 0, output_tokens=usage.get("output_tokens") or 0)
                    if kind == "response.failed" or response.get("status") == "failed":
                        raise _stream_error(response.get("error") or {}, endpoint)
                    if response.get("status") == "incomplete":
                        reason = (response.get("incomplete_details") or {}).get("reason") or "incomplete"
                        finish = _INCOMPLETE_FINISH.get(reason, reason)
                    elif finish is None:
                        finish = "tool_calls" if calls else "stop"
                    if open_calls and finish in ("stop", "tool_calls"):
                        finish = None  # a call the server never closed: its arguments may be cut
                elif kind == "error":
                    raise _stream_error(data.get("error") if isinstance(data.get("error"), dict) else data, endpoint)
        # Finish is held back to the end: it then also means the stream arrived complete.
        if finish is not None:
            yield Finish(finish)


def _stream_error(error: dict, endpoint: Endpoint) -> Exception:
    message = redacted(f"model stream error: {error.get('code') or 'error'} - {error_message({'error': error})}", endpoint)
    if error.get("code") in _PERMANENT_CODES or error.get("type") in _PERMANENT_CODES:
        return PermanentModelError(message)
    return TransientModelError(message)


def responses_request(request: ModelRequest, *, model: str) -> dict:
    """The Responses request body for the engine's chat-style request."""
    instructions = []
    items: list[dict] = []
    for message in request.messages:
        role = message.get("role")
        content = message.get("content") or ""
        if role == "system":
            instructions.append(content)
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": message.get("tool_call_id") or "", "output": content})
        elif role in ("user", "assistant"):
            if content or role == "user":
                items.append({"role": role, "content": content})
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                items.append({"type": "function_call", "call_id": call.get("id") or "", "name": function.get("name") or "",
                              "arguments": function.get("arguments") or "{}"})
    body: dict = {"model": model, "input": items, "stream": True, "store": False}
    if instructions:
        body["instructions"] = "\n\n".join(instructions)
    if request.max_output_tokens:
        body["max_output_tokens"] = request.max_output_tokens
    if request.tools:
        body["tools"] = [_tool(tool) for tool in request.tools]
    return body


def _tool(tool: dict) -> dict:
    function = tool.get("function") or {}
    return {"type": "function", "name": function.get("name"), "description": function.get("description") or "",
            "parameters": function.get("parameters") or {"type": "object", "properties": {}},
            "strict": bool(function.get("strict", False))}

