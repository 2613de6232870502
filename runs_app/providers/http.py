"""What the HTTP providers share (openai, responses, anthropic): each run thread's HTTP client, a
plain server-sent-events reader, the sorting of a server's errors into transient and permanent,
the redaction of an endpoint's credential, and — for the providers without an SDK of their own —
summaries and classification asked through their own stream.

The same fault means the same thing whatever the wire protocol (docs/EXTENDING.md, "Model
endpoints"): no answer (connection refused, reset, timed out), a stream dropped or garbled midway
(a transport error, a line that is not JSON, an event of the wrong shape), 408, 409, 429 and 5xx
are transient — asked again after a backoff, a Retry-After honoured; other 4xx are permanent. A
server's `x-should-retry` header decides when present, as the official SDKs have it. A stream that
ends cleanly but before its last event yields no Finish: the engine discards it as truncated.
"""

import email.utils
import functools
import http.client
import json
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, Literal, NamedTuple
from urllib.parse import urljoin, urlsplit

import httpx
from pydantic import BaseModel, Field

from config.sockets import readable
from config.tracing import tracing_enabled
from runs_app.endpoints import Endpoint
from runs_app.providers.base import (
    Finish,
    InputClassification,
    ModelRequest,
    PermanentModelError,
    StreamEvent,
    Summary,
    TextDelta,
    TransientModelError,
    Usage,
)
from runs_app.providers.interrupt import AbortableBackend, current_interrupt, endpoint_slot
from runs_app.providers.rules import classify_input_by_rules

TRANSIENT_4XX = (408, 409, 429)
CLASSIFY_TIMEOUT_SECONDS = 15.0
CLASSIFY_HISTORY_MESSAGES = 12
CLASSIFY_MAX_TOKENS = 300
SUMMARY_TIMEOUT_SECONDS = 60.0

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


class Classification(BaseModel):
    mode: Literal["supplement", "new_intent"]
    reason: str = Field(min_length=1)


# --- server-sent events ---------------------------------------------------------------------------

class SSEEvent(NamedTuple):
    event: str  # the `event:` field ("" when the server sends none)
    data: str

    def json(self) -> dict:
        """The data as a JSON object (ValueError otherwise: a garbled event breaks the stream)."""
        value = json.loads(self.data)
        if not isinstance(value, dict):
            raise ValueError(f"a stream event that is not an object: {self.data[:80]}")
        return value


def sse_events(lines: Iterable[str], *, per_line: bool = False) -> Iterator[SSEEvent]:
    """The events of a text/event-stream body. An event ends at a blank line; one cut before it
    is never dispatched (the SSE rule), so a stream dropped midway loses it rather than passing
    half of it on. `per_line`: every `data:` line is an event of its own — what Chat Completions
    servers send, read as Warden always read them (some put no blank line between chunks)."""
    name, data = "", []
    for line in lines:
        if not line:
            if data:
                yield SSEEvent(name, "\n".join(data))
            name, data = "", []
            continue
        if line.startswith(":"):
            continue  # a comment: servers send them to keep the connection open
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            name = value
        elif field == "data":
            if per_line:
                yield SSEEvent(name, value.strip())
            else:
                data.append(value)


@contextmanager
def sse_post(*, endpoint: Endpoint, url: str, body: dict, headers: dict, timeout: float,
             per_line: bool = False) -> Iterator[Iterator[SSEEvent]]:
    """POST `body` and read the answer as events, inside the block. Whatever breaks in the block
    — the transport, a line that is not JSON, an event without the fields it must have — is a
    TransientModelError naming no credential; the response is closed when the block ends, also
    when the provider's generator is closed (cancel, lease lost): the connection is dropped now.

    The call goes over this run thread's own keep-alive connection to the server (`_direct_send`):
    a model call is one request and one streamed answer, and httpx's layers cost a worker process
    that drives hundreds of runs about four times the CPU of the call itself (issue 34). Only when
    the server answers with a redirect is the call asked through httpx where the redirect points
    (with the method httpx gives a redirected request), and httpx follows any further one.
    With tracing on, calls go through httpx from the start: its instrumentation gives each call its
    HTTP span and passes the trace on to the server. Neither path takes a proxy from the
    environment (model servers are called directly, as they always were)."""
    sent = None if tracing_enabled() else _direct_send(endpoint=endpoint, url=url, body=body, headers=headers,
                                                        timeout=timeout)
    if isinstance(sent, tuple):
        with _direct_stream(*sent, endpoint, per_line=per_line) as events:
            yield events
        return
    method = "POST"
    if sent is not None:
        method, url = sent.method, sent.url
        if not sent.same_origin:
            headers = {name: value for name, value in headers.items() if name.lower() not in CREDENTIAL_HEADERS}
    client = http_client(timeout, endpoint.connect_timeout_seconds)
    try:
        request = client.build_request(method, url, json=body if method == "POST" else None,
                                       headers={"Accept": "text/event-stream", **headers})
        response = client.send(request, stream=True)
    except httpx.HTTPError as error:
        raise TransientModelError(redacted(f"model server unreachable: {error}", endpoint)) from error
    try:
        if response.status_code != 200:
            response.read()
            raise status_error(response, endpoint)
        yield sse_events(response.iter_lines(), per_line=per_line)
    except (httpx.HTTPError, ValueError, AttributeError, TypeError, KeyError) as error:
        raise TransientModelError(redacted(f"model stream broken: {error}", endpoint)) from error
    finally:
        response.close()


# --- a run thread's own connection to a model server ----------------------------------------------

REDIRECTS = (301, 302, 303, 307, 308)
DROPPED = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)  # http.client.RemoteDisconnected included
# The providers' credential headers: never sent on to another origin by a redirect.
CREDENTIAL_HEADERS = ("authorization", "x-api-key")
_direct = threading.local()


@dataclass(frozen=True)
class _Redirect:
    """Where a redirected call goes next, and how: httpx's rule (a 303, or a POST answered with 301
    or 302, becomes a GET; 307 and 308 keep the POST and its body), and whether it leaves the
    origin (then no credential goes with it, as httpx strips Authorization on a redirect it follows)."""

    method: str
    url: str
    same_origin: bool


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(parts.scheme)


def _redirect(url: str, status: int, location: str) -> _Redirect:
    target = urljoin(url, location)
    before, after = _origin(url), _origin(target)
    # httpx's one exception: the same host's upgrade from http to https on the default ports.
    upgrade = before == ("http", after[1], 80) and after == ("https", before[1], 443)
    return _Redirect("POST" if status in (307, 308) else "GET", target, before == after or upgrade)


class _Connection(http.client.HTTPConnection):
    """A connection whose connect (and TLS handshake) waits `connect_timeout`, and whose reads then
    wait `timeout` each, as httpx's timeouts do."""

    def __init__(self, host: str, port: int | None, *, timeout: float, connect_timeout: float, **kwargs):
        super().__init__(host, port, timeout=connect_timeout, **kwargs)
        self.read_timeout = timeout

    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(self.read_timeout)


class _TLSConnection(_Connection, http.client.HTTPSConnection):
    pass


def _connection(url: str, timeout: float, connect_timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """This thread's connection to the server of `url`, and the request's target. A kept-alive
    connection with something to read while idle was closed by the server (or the call before
    was cut): it is replaced, as httpcore does before reusing one."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransientModelError(f"model server unreachable: {parts.scheme or 'no'} scheme in the endpoint's URL")
    key = (parts.scheme, parts.hostname, parts.port, timeout, connect_timeout)
    cache = _direct.__dict__.setdefault("by_origin", {})
    conn = cache.get(key)
    if conn is not None and conn.sock is not None and readable(conn.sock):
        conn.close()
    if conn is None:
        if parts.scheme == "https":
            conn = _TLSConnection(parts.hostname, parts.port, timeout=timeout, connect_timeout=connect_timeout,
                                  context=_tls_context())
        else:
            conn = _Connection(parts.hostname, parts.port, timeout=timeout, connect_timeout=connect_timeout)
        cache[key] = conn
    target = parts.path or "/"
    return conn, target + (f"?{parts.query}" if parts.query else "")


def _direct_send(*, endpoint: Endpoint, url: str, body: dict, headers: dict,
                 timeout: float) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse] | _Redirect:
    """The request sent and the answer's head read: the response to stream (status 200), where a
    redirect points (the caller asks there through httpx), or the server's error raised as httpx's
    path would."""
    conn, target = _connection(url, timeout, endpoint.connect_timeout_seconds or timeout)
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    interrupt = current_interrupt()
    for attempt in (1, 2):
        try:
            if conn.sock is None:
                conn.connect()
            if interrupt is not None:
                interrupt.attach(conn.sock)  # the lease keeper shuts this socket down to end the call now
            conn.request("POST", target, body=payload, headers={
                "Content-Type": "application/json", "Accept": "text/event-stream", "User-Agent": "warden", **headers})
            response = conn.getresponse()
            break
        except (OSError, http.client.HTTPException) as error:
            conn.close()
            # Dropped before a byte of an answer — a kept-alive connection the server closed as it
            # was reused, a new one reset by a server whose accept queue was full — is asked once
            # more on a new connection, as the engine would ask after a backoff (a model call has
            # no effect but its cost); never a timeout, a refusal, or a call this run aborted.
            if attempt == 2 or not isinstance(error, DROPPED) or (interrupt is not None and interrupt.aborted.is_set()):
                raise TransientModelError(redacted(f"model server unreachable: {_said(error)}", endpoint)) from error
    if response.status == 200:
        return conn, response
    try:
        content = response.read()
    except (OSError, http.client.HTTPException) as error:
        conn.close()
        raise TransientModelError(redacted(f"model stream broken: {_said(error)}", endpoint)) from error
    location = response.getheader("Location")
    if response.status in REDIRECTS and location:
        return _redirect(url, response.status, location)
    raise status_error(httpx.Response(response.status, headers=response.getheaders(), content=content), endpoint)


@contextmanager
def _direct_stream(conn: http.client.HTTPConnection, response: http.client.HTTPResponse, endpoint: Endpoint, *,
                   per_line: bool) -> Iterator[Iterator[SSEEvent]]:
    """The answer's events. Read to its end, the connection stays open for the thread's next call;
    cut short (an error, a cancel, a lease lost), it is closed."""
    ended = False

    def lines() -> Iterator[str]:
        # read1, not readline: http.client's readline takes a chunked body cut short for its end.
        nonlocal ended
        rest = b""
        while data := response.read1(65536):
            *complete, rest = (rest + data).split(b"\n")
            for line in complete:
                yield (line[:-1] if line.endswith(b"\r") else line).decode()
        if response.length:
            raise http.client.IncompleteRead(rest, response.length)  # a sized body cut short
        if rest:
            yield rest.decode()
        response.read()  # at the body's end: frees the connection for the thread's next call
        ended = True

    try:
        yield sse_events(lines(), per_line=per_line)
    except (OSError, http.client.HTTPException, ValueError, AttributeError, TypeError, KeyError) as error:
        raise TransientModelError(redacted(f"model stream broken: {_said(error)}", endpoint)) from error
    finally:
        if not ended:
            response.close()
            conn.close()


def _said(error: Exception) -> str:
    return str(error) or type(error).__name__


# --- errors ---------------------------------------------------------------------------------------

def error_message(body) -> str:
    """The human part of an error body: OpenAI's and Anthropic's `{"error": {"message": …}}`,
    the Responses stream's `{"message": …}`, or the body itself, shortened."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    if error is None and isinstance(body, dict) and body.get("message"):
        return str(body["message"])[:500]
    return str(error or body)[:500]


def redacted(text: str, endpoint: Endpoint) -> str:
    """`text` without the endpoint's credential (servers echo a wrong key in their error text)."""
    secret = endpoint.credential
    return text.replace(secret, "[credential]") if secret and len(secret) >= 4 else text


def status_transient(status: int, headers: httpx.Headers) -> bool:
    should_retry = (headers.get("x-should-retry") or "").strip().lower()
    if should_retry in ("true", "false"):
        return should_retry == "true"  # the server says so, whatever the status
    return status in TRANSIENT_4XX or status >= 500


def status_error(response: httpx.Response, endpoint: Endpoint) -> Exception:
    """A model server's error answer, sorted as the official SDKs sort it for their own retries."""
    status = response.status_code
    try:
        detail = error_message(response.json())
    except ValueError:
        detail = response.text[:500]
    message = redacted(f"Error code: {status} - {detail}", endpoint)
    if status_transient(status, response.headers):
        return TransientModelError(message, status=status, retry_after=retry_after(response.headers))
    return PermanentModelError(message, status=status)


def retry_after(headers: httpx.Headers) -> float | None:
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


def json_object_text(content: str) -> str:
    """Models like to wrap JSON in prose or code fences: take the outermost object."""
    match = re.search(r"\{.*\}", content, flags=re.DOTALL)
    if not match:
        raise ValueError("no JSON object in the model's answer")
    return match.group(0)


def call_timeout(request: ModelRequest, endpoint: Endpoint) -> float:
    return float(request.options.get("timeout") or endpoint.timeout_seconds)


# --- each run thread's client ---------------------------------------------------------------------

_clients = threading.local()


@functools.cache
def _tls_context():
    # Made once: loading the CA bundle costs milliseconds, and every run thread has a client.
    return httpx.create_ssl_context()


def http_client(timeout: float, connect_timeout: float | None = None) -> httpx.Client:
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


# --- a provider over one endpoint -----------------------------------------------------------------

class EndpointProvider:
    """A provider calling the model endpoint it is made for (runs_app.endpoints.Endpoint), within
    that endpoint's per-process call slots. Subclasses speak a wire protocol (`_stream`); summaries
    and classification are asked through the same stream, with the same guarantees."""

    name = ""
    kind = ""  # the EndpointKind this provider speaks, for the message when no endpoint is named

    def __init__(self, endpoint: Endpoint | None = None):
        self._endpoint = endpoint

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            raise PermanentModelError(f"the {self.name} provider calls a model endpoint of kind {self.kind}, and the "
                                      "run names none: name one in the agent's definition")
        return self._endpoint

    def stream(self, request: ModelRequest) -> Iterator[StreamEvent]:
        endpoint = self.endpoint
        with endpoint_slot(endpoint.slots, timeout=call_timeout(request, endpoint), limit=endpoint.max_concurrency):
            yield from self._stream(request, endpoint)

    def _stream(self, request: ModelRequest, endpoint: Endpoint) -> Iterator[StreamEvent]:
        raise NotImplementedError

    def summarize(self, *, previous: str, messages: list[dict], max_tokens: int) -> Summary:
        conversation = [{"role": m.get("role"), "content": m.get("content") or ""}
                        for m in messages if m.get("role") in ("user", "assistant", "tool")]
        return self._ask(instructions=SUMMARY_INSTRUCTIONS, max_tokens=max_tokens, timeout=SUMMARY_TIMEOUT_SECONDS,
                         content=json.dumps({"summary_so_far": previous, "new_messages": conversation}))

    def classify_input(self, *, history: list[dict], text: str) -> InputClassification:
        recent = [
            {"role": message.get("role"), "content": message.get("content") or ""}
            for message in history[-CLASSIFY_HISTORY_MESSAGES:]
            if message.get("role") in ("user", "assistant") and message.get("content")
        ]
        try:
            answer = self._ask(instructions=CLASSIFY_INSTRUCTIONS, max_tokens=CLASSIFY_MAX_TOKENS,
                               timeout=CLASSIFY_TIMEOUT_SECONDS,
                               content=json.dumps({"history": recent, "new_input": text}))
            parsed = Classification.model_validate_json(json_object_text(answer.text))
            return InputClassification(parsed.mode, parsed.reason)
        except Exception as error:  # any failure of the model route falls back to the rules
            fallback = classify_input_by_rules(history=history, text=text)
            return InputClassification(fallback.mode, f"fallback: {fallback.reason} (model answer unusable: {type(error).__name__})")

    def _ask(self, *, instructions: str, content: str, max_tokens: int, timeout: float) -> Summary:
        """One question without tools, its whole streamed answer as text with its tokens."""
        request = ModelRequest(messages=[{"role": "system", "content": instructions}, {"role": "user", "content": content}],
                               options={"timeout": timeout}, max_output_tokens=max_tokens)
        text, input_tokens, output_tokens, finished = "", 0, 0, False
        events = self.stream(request)
        try:
            for event in events:
                if isinstance(event, TextDelta):
                    text += event.text
                elif isinstance(event, Usage):
                    input_tokens += event.input_tokens
                    output_tokens += event.output_tokens
                elif isinstance(event, Finish):
                    finished = True
        finally:
            events.close()
        if not finished:
            raise TransientModelError("the model's answer ended before its end (truncated)")
        return Summary(text=text.strip(), input_tokens=input_tokens, output_tokens=output_tokens)
