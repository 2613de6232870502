"""A streaming provider for any OpenAI-compatible Chat Completions server.

The SDK's own retries are off (max_retries=0): retrying is the run-time's decision, with
backoff recorded on the run. Errors are sorted as the official SDK sorts them for its own retries:
an `x-should-retry` header decides when present; otherwise 408, 409, 429, 5xx, network errors
and dropped streams are transient, other 4xx permanent.
"""

import email.utils
import functools
import json
import re
import time
from typing import Iterator, Literal

import httpx
import openai
from django.conf import settings
from pydantic import BaseModel, Field

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
from runs_app.providers.interrupt import AbortableBackend, endpoint_slot
from runs_app.providers.rules import classify_input_by_rules

_DEFAULT_TIMEOUT_SECONDS = 60.0
_CLASSIFY_TIMEOUT_SECONDS = 15.0
_CLASSIFY_HISTORY_MESSAGES = 12
_TRANSIENT_4XX = (408, 409, 429)
_SUMMARY_TIMEOUT_SECONDS = 60.0

SUMMARY_INSTRUCTIONS = (
    "You keep the memory of a customer-service conversation. Fold the new messages into the summary so "
    "far: keep every fact that may matter later (order numbers, amounts, decisions, what was done and "
    "what is still open), drop pleasantries. Reply with the summary only."
)

CLASSIFY_INSTRUCTIONS = (
    "You route a user's new message in a chat where an agent run is already in progress. "
    'Answer "supplement" if the message adds information to, or continues, the current request '
    '(for example "the order number is 9527"); answer "new_intent" if it abandons it or asks for '
    'something unrelated (for example "forget it, what\'s the weather?"). '
    'Reply with only a JSON object: {"mode": "supplement" | "new_intent", "reason": "<one sentence>"}.'
)


class _Classification(BaseModel):
    mode: Literal["supplement", "new_intent"]
    reason: str = Field(min_length=1)


class OpenAIProvider:
    name = "openai"

    def stream(self, request: ModelRequest) -> Iterator[StreamEvent]:
        arguments = {
            "model": request.options.get("model") or settings.OPENAI_MODEL,
            "messages": request.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.max_output_tokens:
            arguments["max_tokens"] = request.max_output_tokens
        if request.tools:
            arguments["tools"] = request.tools
        with endpoint_slot(settings.OPENAI_BASE_URL, timeout=_timeout(request)):
            yield from self._stream(arguments, request)

    def _stream(self, arguments: dict, request: ModelRequest) -> Iterator[StreamEvent]:
        try:
            response = _client(_timeout(request)).chat.completions.create(**arguments)
        except openai.APIError as error:
            raise _model_error(error) from error

        finish = None
        try:
            for chunk in response:
                if chunk.usage is not None:
                    usage = chunk.usage
                    yield Usage(input_tokens=usage.prompt_tokens or 0, output_tokens=usage.completion_tokens or 0)
                for choice in chunk.choices or []:
                    if choice.index != 0:
                        continue
                    yield from _delta_events(choice.delta)
                    finish = choice.finish_reason or finish
        except (openai.APIError, httpx.HTTPError, ValueError) as error:  # ValueError: a garbled SSE line
            raise TransientModelError(f"model stream broken: {error}") from error
        finally:
            # Also runs on generator.close() (cancel, lease lost): drops the HTTP connection now.
            response.close()
        # Finish is held back to the end: it then also means the stream arrived complete.
        if finish is not None:
            yield Finish(finish)

    def summarize(self, *, previous: str, messages: list[dict], max_tokens: int) -> Summary:
        conversation = [{"role": m.get("role"), "content": m.get("content") or ""}
                        for m in messages if m.get("role") in ("user", "assistant", "tool")]
        try:
            completion = _client(_SUMMARY_TIMEOUT_SECONDS).chat.completions.create(
                model=settings.OPENAI_MODEL,
                max_tokens=max_tokens,
                messages=[
                    {"role": "system", "content": SUMMARY_INSTRUCTIONS},
                    {"role": "user", "content": json.dumps({"summary_so_far": previous, "new_messages": conversation})},
                ],
            )
        except openai.APIError as error:
            raise _model_error(error) from error
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
            for message in history[-_CLASSIFY_HISTORY_MESSAGES:]
            if message.get("role") in ("user", "assistant") and message.get("content")
        ]
        completion = _client(_CLASSIFY_TIMEOUT_SECONDS).chat.completions.create(
            model=settings.OPENAI_MODEL,
            messages=[
                {"role": "system", "content": CLASSIFY_INSTRUCTIONS},
                {"role": "user", "content": json.dumps({"history": recent, "new_input": text})},
            ],
        )
        content = completion.choices[0].message.content if completion.choices else None
        answer = _Classification.model_validate_json(_json_object_text(content or ""))
        return InputClassification(answer.mode, answer.reason)


def _delta_events(delta) -> Iterator[StreamEvent]:
    if delta is None:
        return
    if delta.content:
        yield TextDelta(delta.content)
    for call in delta.tool_calls or []:
        function = getattr(call, "function", None)
        yield ToolCallDelta(
            index=getattr(call, "index", None),  # absent from some servers' fragments
            id=getattr(call, "id", None),
            name=function.name if function else None,
            arguments=(function.arguments if function else None) or "",
        )


def _model_error(error: openai.APIError) -> Exception:
    if isinstance(error, (openai.APIConnectionError, openai.APITimeoutError)):
        return TransientModelError(f"model server unreachable: {error}")
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        should_retry = (error.response.headers.get("x-should-retry") or "").strip().lower()
        if should_retry in ("true", "false"):
            transient = should_retry == "true"  # the server says so, whatever the status
        else:
            transient = status in _TRANSIENT_4XX or status >= 500
        if transient:
            return TransientModelError(
                error.message,
                status=status,
                retry_after=_retry_after(error.response.headers),
            )
        return PermanentModelError(error.message, status=status)
    return TransientModelError(f"model call failed: {error}")


def _retry_after(headers: httpx.Headers) -> float | None:
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return float(milliseconds) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def _json_object_text(content: str) -> str:
    """Models like to wrap JSON in prose or code fences: take the outermost object."""
    match = re.search(r"\{.*\}", content, flags=re.DOTALL)
    if not match:
        raise ValueError("no JSON object in the model's answer")
    return match.group(0)


def _timeout(request: ModelRequest) -> float:
    default = getattr(settings, "OPENAI_TIMEOUT_SECONDS", _DEFAULT_TIMEOUT_SECONDS)
    return float(request.options.get("timeout") or default)


def _client(timeout: float) -> openai.OpenAI:
    return _cached_client(settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, timeout)


@functools.lru_cache(maxsize=8)
def _cached_client(base_url: str, api_key: str, timeout: float) -> openai.OpenAI:
    # One client (and connection pool) per configuration; httpx clients are thread-safe, and the
    # many runs of a worker process share it (issue 34). Its sockets can be shut down from the
    # lease keeper's thread when a run is cancelled (runs_app/providers/interrupt.py).
    calls = max(1, settings.WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT)
    transport = httpx.HTTPTransport(limits=httpx.Limits(max_connections=calls, max_keepalive_connections=calls))
    transport._pool._network_backend = AbortableBackend()  # httpx 0.28 builds its pool privately
    http_client = httpx.Client(transport=transport, timeout=timeout, follow_redirects=True)
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout, http_client=http_client)
