"""A streaming provider for any OpenAI-compatible Chat Completions server.

Streams are read with httpx and a plain SSE parser (cheap enough for a worker process driving many
runs at once); the official SDK makes the rare unstreamed calls, with its own retries off
(max_retries=0): retrying is the run-time's decision, with backoff recorded on the run. Errors are
sorted as the official SDK sorts them for its own retries:
an `x-should-retry` header decides when present; otherwise 408, 409, 429, 5xx, network errors
and dropped streams are transient, other 4xx permanent.

Each provider object calls one endpoint (runs_app.endpoints.Endpoint: the run's agent's model
endpoint, read for this call, or the default one of the OPENAI_* settings). Its credential goes in
the Authorization header and nowhere else: a server's error text that echoes it is redacted
before it becomes a step's reason or a log line.
"""

import email.utils
import functools
import json
import re
import threading
import time
from typing import Iterator, Literal

import httpx
import openai
from pydantic import BaseModel, Field

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
from runs_app.providers.interrupt import AbortableBackend, endpoint_slot
from runs_app.providers.rules import classify_input_by_rules

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

    def __init__(self, endpoint: Endpoint | None = None):
        self._endpoint = endpoint

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint or endpoint_default()

    def stream(self, request: ModelRequest) -> Iterator[StreamEvent]:
        endpoint = self.endpoint
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
        with endpoint_slot(endpoint.slots, timeout=_timeout(request, endpoint), limit=endpoint.max_concurrency):
            yield from self._stream(arguments, request, endpoint)

    def _stream(self, arguments: dict, request: ModelRequest, endpoint: Endpoint) -> Iterator[StreamEvent]:
        # The stream is read with httpx and a plain SSE parser, not the SDK: a worker process drives
        # many runs at once, and the SDK's request building and per-chunk models cost about four
        # times the CPU of the call itself; it also drops the connection after every stream (it
        # stops reading at [DONE]), where this reads the body to its end and keeps it alive.
        client = _http_client(_timeout(request, endpoint), endpoint.connect_timeout_seconds)
        url = endpoint.base_url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {endpoint.credential}", "Accept": "text/event-stream"}
        try:
            response = client.send(client.build_request("POST", url, json=arguments, headers=headers), stream=True)
        except httpx.HTTPError as error:
            raise TransientModelError(_redacted(f"model server unreachable: {error}", endpoint)) from error
        finish = None
        try:
            if response.status_code != 200:
                response.read()
                raise _status_error(response, endpoint)
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue  # comments, `event:` and `id:` fields, blank separators
                data = line[5:].strip()
                if data == "[DONE]":
                    continue  # read on to the body's end: the connection then goes back to the pool
                chunk = json.loads(data)
                if not isinstance(chunk, dict):
                    raise ValueError(f"a stream chunk that is not an object: {data[:80]}")
                if chunk.get("error"):
                    raise TransientModelError(_redacted(f"model stream error: {_error_message(chunk)}", endpoint))
                usage = chunk.get("usage")
                if usage:
                    yield Usage(input_tokens=usage.get("prompt_tokens") or 0, output_tokens=usage.get("completion_tokens") or 0)
                for choice in chunk.get("choices") or []:
                    if (choice.get("index") or 0) != 0:
                        continue
                    yield from _delta_events(choice.get("delta"))
                    finish = choice.get("finish_reason") or finish
        except (httpx.HTTPError, ValueError, AttributeError) as error:  # ValueError: a garbled SSE line
            raise TransientModelError(_redacted(f"model stream broken: {error}", endpoint)) from error
        finally:
            # Also runs on generator.close() (cancel, lease lost): drops the HTTP connection now.
            response.close()
        # Finish is held back to the end: it then also means the stream arrived complete.
        if finish is not None:
            yield Finish(finish)

    def summarize(self, *, previous: str, messages: list[dict], max_tokens: int) -> Summary:
        conversation = [{"role": m.get("role"), "content": m.get("content") or ""}
                        for m in messages if m.get("role") in ("user", "assistant", "tool")]
        endpoint = self.endpoint
        try:
            completion = _client(endpoint, _SUMMARY_TIMEOUT_SECONDS).chat.completions.create(
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
            for message in history[-_CLASSIFY_HISTORY_MESSAGES:]
            if message.get("role") in ("user", "assistant") and message.get("content")
        ]
        endpoint = self.endpoint
        completion = _client(endpoint, _CLASSIFY_TIMEOUT_SECONDS).chat.completions.create(
            model=endpoint.model,
            messages=[
                {"role": "system", "content": CLASSIFY_INSTRUCTIONS},
                {"role": "user", "content": json.dumps({"history": recent, "new_input": text})},
            ],
        )
        content = completion.choices[0].message.content if completion.choices else None
        answer = _Classification.model_validate_json(_json_object_text(content or ""))
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


def _error_message(body) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error or body)[:500]


def _redacted(text: str, endpoint: Endpoint) -> str:
    """`text` without the endpoint's credential (servers echo a wrong key in their error text)."""
    secret = endpoint.credential
    return text.replace(secret, "[credential]") if secret and len(secret) >= 4 else text


def _status_error(response: httpx.Response, endpoint: Endpoint) -> Exception:
    """A model server's error answer, sorted as the official SDK sorts it for its own retries."""
    status = response.status_code
    try:
        detail = _error_message(response.json())
    except ValueError:
        detail = response.text[:500]
    message = _redacted(f"Error code: {status} - {detail}", endpoint)
    should_retry = (response.headers.get("x-should-retry") or "").strip().lower()
    if should_retry in ("true", "false"):
        transient = should_retry == "true"  # the server says so, whatever the status
    else:
        transient = status in _TRANSIENT_4XX or status >= 500
    if transient:
        return TransientModelError(message, status=status, retry_after=_retry_after(response.headers))
    return PermanentModelError(message, status=status)


def _model_error(error: openai.APIError, endpoint: Endpoint) -> Exception:
    if isinstance(error, (openai.APIConnectionError, openai.APITimeoutError)):
        return TransientModelError(_redacted(f"model server unreachable: {error}", endpoint))
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        should_retry = (error.response.headers.get("x-should-retry") or "").strip().lower()
        if should_retry in ("true", "false"):
            transient = should_retry == "true"  # the server says so, whatever the status
        else:
            transient = status in _TRANSIENT_4XX or status >= 500
        if transient:
            return TransientModelError(
                _redacted(error.message, endpoint),
                status=status,
                retry_after=_retry_after(error.response.headers),
            )
        return PermanentModelError(_redacted(error.message, endpoint), status=status)
    return TransientModelError(_redacted(f"model call failed: {error}", endpoint))


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


def _timeout(request: ModelRequest, endpoint: Endpoint) -> float:
    return float(request.options.get("timeout") or endpoint.timeout_seconds)


def _client(endpoint: Endpoint, timeout: float) -> openai.OpenAI:
    return _cached_client(endpoint.base_url, endpoint.credential, timeout)


_clients = threading.local()


@functools.cache
def _tls_context():
    # Made once: loading the CA bundle costs milliseconds, and every run thread has a client.
    return httpx.create_ssl_context()


def _http_client(timeout: float, connect_timeout: float | None = None) -> httpx.Client:
    """This thread's client (and its keep-alive connections) for this timeout. A worker process
    drives each of its runs in a thread of its own (issue 34): one shared pool would cost every
    request a scan of all its connections (httpcore's pool is quadratic in them), while a run's
    thread makes one call at a time and reuses its own connection. Its sockets can be shut down
    from the lease keeper's thread when the run is cancelled (runs_app/providers/interrupt.py)."""
    by_timeout = getattr(_clients, "by_timeout", None)
    if by_timeout is None:
        by_timeout = _clients.by_timeout = {}
    connect_timeout = connect_timeout or timeout
    client = by_timeout.get((timeout, connect_timeout))
    if client is None:
        transport = httpx.HTTPTransport(verify=_tls_context(), limits=httpx.Limits(max_connections=4, max_keepalive_connections=2))
        transport._pool._network_backend = AbortableBackend()  # httpx 0.28 builds its pool privately
        client = by_timeout[(timeout, connect_timeout)] = httpx.Client(
            transport=transport, timeout=httpx.Timeout(timeout, connect=connect_timeout), follow_redirects=True)
    return client


@functools.lru_cache(maxsize=8)
def _cached_client(base_url: str, api_key: str, timeout: float) -> openai.OpenAI:
    # The SDK, with a pool of its own, for the rare calls that are not streamed (summaries,
    # classification); one client per configuration, shared by threads (httpx clients are thread-safe).
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
