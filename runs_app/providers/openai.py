"""A streaming provider for any OpenAI-compatible Chat Completions server.

Streams are read over each run thread's own HTTP connection with a plain SSE parser
(runs_app/providers/http.py, shared with the Responses and Anthropic providers; cheap enough for a
worker process driving many runs at once);
the official SDK makes the rare unstreamed calls, with its own retries off (max_retries=0):
retrying is the run-time's decision, with backoff recorded on the run. Errors are sorted as the
official SDK sorts them for its own retries: an `x-should-retry` header decides when present;
otherwise 408, 409, 429, 5xx, network errors and dropped streams are transient, other 4xx permanent.

Each provider object calls one endpoint (runs_app.endpoints.Endpoint: the run's agent's model
endpoint, read for this call, or the default one of the OPENAI_* settings). Its credential goes in
the Authorization header and nowhere else: a server's error text that echoes it is redacted
before it becomes a step's reason or a log line.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Iterator

from runs_app.endpoints import Endpoint, endpoint_default
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
from runs_app.providers.http import (
    CLASSIFY_HISTORY_MESSAGES,
    CLASSIFY_INSTRUCTIONS,
    CLASSIFY_TIMEOUT_SECONDS,
    SUMMARY_INSTRUCTIONS,
    SUMMARY_TIMEOUT_SECONDS,
    Classification,
    EndpointProvider,
    call_timeout,
    error_message,
    json_object_text,
    redacted,
    retry_after,
    sse_post,
    status_transient,
)
from runs_app.providers.rules import classify_input_by_rules

if TYPE_CHECKING:
    import openai


def _sdk():
    """The official SDK, imported at its first use (a summary, a classification): importing it costs
    a process ~0.5 s of CPU and ~50 MB of memory, and a worker that only streams never needs it."""
    import openai

    return openai


class OpenAIProvider(EndpointProvider):
    name = "openai"
    kind = "chat_completions"

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint or endpoint_default()

    def _stream(self, request: ModelRequest, endpoint: Endpoint) -> Iterator[StreamEvent]:
        # The stream is read with a plain HTTP connection and SSE parser, not the SDK: a worker process drives
        # many runs at once, and the SDK's request building and per-chunk models cost about four
        # times the CPU of the call itself; it also drops the connection after every stream (it
        # stops reading at [DONE]), where this reads the body to its end and keeps it alive.
        arguments = {
            "model": request.options.get("model") or endpoint.model,
            "messages": request.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.max_output_tokens:
            arguments["max_tokens"] = request.max_output_tokens
        if request.tools:
            arguments["tools"] = request.tools
        finish = None
        with sse_post(endpoint=endpoint, url=endpoint.base_url.rstrip("/") + "/chat/completions", body=arguments,
                      headers={"Authorization": f"Bearer {endpoint.credential}"}, timeout=call_timeout(request, endpoint),
                      per_line=True) as events:
            for event in events:
                if event.data == "[DONE]":
                    continue  # read on to the body's end: the connection then goes back to the pool
                chunk = event.json()
                if chunk.get("error"):
                    raise TransientModelError(redacted(f"model stream error: {error_message(chunk)}", endpoint))
                usage = chunk.get("usage")
                if usage:
                    yield Usage(input_tokens=usage.get("prompt_tokens") or 0, output_tokens=usage.get("completion_tokens") or 0)
                for choice in chunk.get("choices") or []:
                    if (choice.get("index") or 0) != 0:
                        continue
                    yield from _delta_events(choice.get("delta"))
                    finish = choice.get("finish_reason") or finish
        # Finish is held back to the end: it then also means the stream arrived complete.
        if finish is not None:
            yield Finish(finish)

    def summarize(self, *, previous: str, messages: list[dict], max_tokens: int) -> Summary:
        conversation = [{"role": m.get("role"), "content": m.get("content") or ""}
                        for m in messages if m.get("role") in ("user", "assistant", "tool")]
        endpoint = self.endpoint
        openai = _sdk()
        try:
            completion = _client(endpoint, SUMMARY_TIMEOUT_SECONDS).chat.completions.create(
                model=endpoint.model,
                max_tokens=max_tokens,
                messages=[
                    {"role": "system", "content": SUMMARY_INSTRUCTIONS},
                    {"role": "user", "content": json.dumps({"summary_so_far": previous, "new_messages": conversation})},
                ],
            )
        except openai.APIError as error:
            # Not chained: the SDK's error quotes the server's text, which may hold the credential.
            raise _model_error(error, endpoint) from None
        text = (completion.choices[0].message.content if completion.choices else "") or ""
        usage = completion.usage
        return Summary(text=text.strip(), input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                       output_tokens=getattr(usage, "completion_tokens", 0) or 0)

    def classify_input(self, *, history: list[dict], text: str) -> InputClassification:
        try:
            return self._classify_with_model(history=history, text=text)
        except Exception as error:  # any failure of the model route falls back to the rules
            fallback = classify_input_by_rules(history=history, text=text)
            reason = f"fallback: {fallback.reason} (model answer unusable: {type(error).__name__})"
            return InputClassification(fallback.mode, reason)

    def _classify_with_model(self, *, history: list[dict], text: str) -> InputClassification:
        recent = [
            {"role": message.get("role"), "content": message.get("content") or ""}
            for message in history[-CLASSIFY_HISTORY_MESSAGES:]
            if message.get("role") in ("user", "assistant") and message.get("content")
        ]
        endpoint = self.endpoint
        completion = _client(endpoint, CLASSIFY_TIMEOUT_SECONDS).chat.completions.create(
            model=endpoint.model,
            messages=[
                {"role": "system", "content": CLASSIFY_INSTRUCTIONS},
                {"role": "user", "content": json.dumps({"history": recent, "new_input": text})},
            ],
        )
        content = completion.choices[0].message.content if completion.choices else None
        answer = Classification.model_validate_json(json_object_text(content or ""))
        return InputClassification(answer.mode, answer.reason)


def _delta_events(delta: dict | None) -> Iterator[StreamEvent]:
    if not delta:
        return
    if delta.get("content"):
        yield TextDelta(delta["content"])
    for call in delta.get("tool_calls") or []:
        function = call.get("function") or {}
        yield ToolCallDelta(
            index=call.get("index"),  # absent from some servers' fragments
            id=call.get("id"),
            name=function.get("name"),
            arguments=function.get("arguments") or "",
        )


def _model_error(error: openai.APIError, endpoint: Endpoint) -> Exception:
    openai = _sdk()
    if isinstance(error, (openai.APIConnectionError, openai.APITimeoutError)):
        return TransientModelError(redacted(f"model server unreachable: {error}", endpoint))
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        if status_transient(status, error.response.headers):
            return TransientModelError(
                redacted(error.message, endpoint),
                status=status,
                retry_after=retry_after(error.response.headers),
            )
        return PermanentModelError(redacted(error.message, endpoint), status=status)
    return TransientModelError(redacted(f"model call failed: {error}", endpoint))


def _client(endpoint: Endpoint, timeout: float) -> openai.OpenAI:
    return _cached_client(endpoint.base_url, endpoint.credential, timeout)


@functools.lru_cache(maxsize=8)
def _cached_client(base_url: str, api_key: str, timeout: float) -> openai.OpenAI:
    # The SDK, with a pool of its own, for the rare calls that are not streamed (summaries,
    # classification); one client per configuration, shared by threads (httpx clients are thread-safe).
    return _sdk().OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
