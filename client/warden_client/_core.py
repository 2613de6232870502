"""What the sync and the async client share: a call described as data (`Call`: method, path,
query, body, how to read the answer, its Idempotency-Key), the retry decisions, the reading of
answers into resources or typed errors, and the state of a resumable event stream. The two
clients only move bytes (httpx.Client / httpx.AsyncClient) and sleep (time / asyncio)."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from warden_client import __version__
from warden_client.errors import APIConnectionError, StreamError, error_from_response, retry_after_of
from warden_client.models import Event, Page, Resource
from warden_client.sse import ServerSentEvent

T = TypeVar("T")

API_PREFIX = "/api/v1"
USER_AGENT = f"warden-client/{__version__}"
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Answers worth sending the same request again for: the server throttled (429), failed or was
# unreachable behind a proxy (5xx; 503 `try_again` says nothing was saved).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# A 409 that asks for a retry: the first request with this Idempotency-Key is still being answered
# (for instance the attempt whose answer was lost on the way back).
RETRY_CODES = frozenset({"idempotency_key_in_use"})
# The connection failed or broke before a whole answer came: the request may or may not have
# reached the server, so only calls that are safe to repeat are retried.
RETRY_EXCEPTIONS: tuple[type[Exception], ...] = (
    httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout,
    httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.CloseError,
)

Query = list[tuple[str, str]]


@dataclass
class Call(Generic[T]):
    """One logical API call. A write gets its Idempotency-Key here, once: every retry of the call
    sends the same key, so the server does the write at most once and answers a retry with the
    first answer (`Idempotent-Replayed: true`)."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: Query = field(default_factory=list)
    body: Any = None
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        if self.method in UNSAFE_METHODS and self.idempotency_key is None:
            self.idempotency_key = str(uuid.uuid4())

    @property
    def retryable(self) -> bool:
        """A GET, or a write that carries its key."""
        return self.method not in UNSAFE_METHODS or self.idempotency_key is not None

    def request(self) -> dict[str, Any]:
        """The keyword arguments of httpx's `request()`."""
        headers = {"Accept": "application/json"}
        if self.idempotency_key is not None:
            headers["Idempotency-Key"] = self.idempotency_key
        request: dict[str, Any] = {"method": self.method, "url": API_PREFIX + self.path, "headers": headers}
        if self.params:
            request["params"] = self.params
        if self.method in UNSAFE_METHODS:
            request["json"] = self.body if self.body is not None else {}
        return request


def query(**values: Any) -> Query:
    """Query parameters without the unset ones; a list repeats its parameter (`status=a&status=b`)."""
    pairs: Query = []
    for name, value in values.items():
        if value is None:
            continue
        for item in value if isinstance(value, (list, tuple, set, frozenset)) else [value]:
            pairs.append((name, _query_text(item)))
    return pairs


def _query_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def body(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


# --- retries ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RetryPolicy:
    """`max_attempts` tries in all (1: never retry); between them an exponential backoff from
    `backoff` seconds up to `max_backoff`, with jitter — or the server's Retry-After, up to
    `max_retry_after`."""

    max_attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0

    def backoff_delay(self, attempt: int) -> float:
        """The pause after the `attempt`-th failure in a row (1, 2, …)."""
        ceiling = min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))
        return ceiling * random.uniform(0.5, 1.0)

    def after_response(self, call: Call[Any], attempt: int, response: httpx.Response) -> float | None:
        """Seconds to wait before trying `call` again after this answer; None: the answer stands."""
        if attempt >= self.max_attempts or not call.retryable:
            return None
        if response.status_code == 409:
            if _error_code(response) not in RETRY_CODES:
                return None
        elif response.status_code not in RETRY_STATUSES:
            return None
        retry_after = retry_after_of(response.headers)
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        return self.backoff_delay(attempt)

    def after_exception(self, call: Call[Any], attempt: int, exc: Exception) -> float | None:
        if attempt >= self.max_attempts or not call.retryable or not isinstance(exc, RETRY_EXCEPTIONS):
            return None
        return self.backoff_delay(attempt)


def _error_code(response: httpx.Response) -> str | None:
    try:
        data = json.loads(response.content)
    except ValueError:
        return None
    return data.get("code") if isinstance(data, dict) else None


def connection_error(call_or_what: Call[Any] | str, exc: Exception, attempts: int) -> APIConnectionError:
    what = call_or_what if isinstance(call_or_what, str) else f"{call_or_what.method} {API_PREFIX}{call_or_what.path}"
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    return APIConnectionError(f"{what} failed{tries}: {type(exc).__name__}: {exc}")


def result_of(call: Call[T], response: httpx.Response) -> T:
    """The parsed answer, or the typed error it is."""
    if not response.is_success:
        raise error_from_response(response.status_code, response.headers, response.content)
    data = response.json() if response.content else None
    result = call.parse(data)
    if isinstance(result, Resource) and response.headers.get("Idempotent-Replayed") == "true":
        object.__setattr__(result, "replayed", True)
    return result


def page_of(parse_item: Callable[[dict[str, Any]], T]) -> Callable[[Any], Page[T]]:
    def parse(data: Any) -> Page[T]:
        return Page(items=[parse_item(item) for item in data["items"]], next_cursor=data.get("next_cursor"))
    return parse


def client_headers(api_key: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    headers.update(extra or {})
    return headers


# --- event streams ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReconnectPolicy:
    """A stream whose connection broke reconnects with Last-Event-ID, at most `max_attempts` times
    in a row without receiving an event, waiting `backoff` seconds doubled each time up to
    `max_backoff`. A stream the server ended (its `max_seconds`) is reopened at once — after the
    server's `retry:` delay when that connection brought no event, so an idle stream never spins."""

    max_attempts: int = 8
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_seconds: int | None = None  # ask the server to end each connection after this long

    def delay(self, failures: int) -> float:
        return min(self.max_backoff, self.backoff * 2.0 ** (failures - 1)) * random.uniform(0.75, 1.0)


class EventStreamState:
    """One logical event stream across its connections: what to send on (re)connecting, which
    event ids were delivered, when to stop. Events are delivered once each and in order: the
    server resumes after `Last-Event-ID`, and an event it sends again anyway (a run's seq or a
    session's (run, seq) not above what was delivered) is dropped."""

    def __init__(self, *, path: str, run_id: str | None, last_event_id: str | None, params: Query,
                 policy: ReconnectPolicy):
        self.path = path
        self.run_id = run_id  # a run's stream (ends with `event: end`); None: a session's
        self.last_event_id = last_event_id
        self.params = params
        self.policy = policy
        self.failures = 0  # connections in a row that broke before delivering an event
        self.ended = False
        self.end_status: str | None = None
        self._delivered: dict[str, int] = {}  # run id → the highest seq delivered
        self._server_retry_ms: int | None = None
        self.delivered_in_connection = 0

    def request(self) -> dict[str, Any]:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        params = list(self.params)
        if self.policy.max_seconds is not None:
            params.append(("max_seconds", str(self.policy.max_seconds)))
        self.delivered_in_connection = 0
        return {"method": "GET", "url": API_PREFIX + self.path, "headers": headers, "params": params}

    def after_status(self, response: httpx.Response, content: bytes) -> float:
        """A stream request that was not answered 200: seconds to wait before reconnecting, or the
        typed error (4xx other than 429, or retries used up)."""
        error = error_from_response(response.status_code, response.headers, content)
        if response.status_code not in RETRY_STATUSES:
            raise error
        delay = self._failed(error)
        return max(delay, min(error.retry_after or 0.0, self.policy.max_backoff * 4))

    def after_break(self, exc: Exception | None) -> float:
        """The connection ended: `exc` None when the server closed the stream cleanly (its
        `max_seconds`), else how it broke. Seconds to wait before reconnecting."""
        if exc is None:
            if self.delivered_in_connection:
                return 0.0
            # Nothing came on that connection: the server's reconnection delay (`retry:`), not a hot loop.
            return (self._server_retry_ms or 1000) / 1000
        if not isinstance(exc, RETRY_EXCEPTIONS):
            raise exc
        return self._failed(connection_error(f"the event stream {API_PREFIX}{self.path}", exc, self.failures + 1))

    def _failed(self, error: Exception) -> float:
        self.failures += 1
        if self.failures > self.policy.max_attempts:
            raise error
        return self.policy.delay(self.failures)

    def take(self, sse: ServerSentEvent) -> Event | None:
        """The event to deliver for one SSE frame, if any; `end` stops the stream, `error` raises."""
        if sse.retry is not None:
            self._server_retry_ms = sse.retry
        data = _json_object(sse.data)
        if sse.event == "error":
            raise StreamError(str(data.get("message") or sse.data), code=str(data.get("code") or "stream_error"))
        if sse.event == "end":
            self.ended = True
            self.end_status = data.get("status")
            return None
        if "seq" not in data or "type" not in data:
            return None
        run_id = str(data.get("run_id") or self.run_id or "")
        seq = int(data["seq"])
        if seq <= self._delivered.get(run_id, 0):
            return None  # sent again across a reconnection: delivered already
        self._delivered[run_id] = seq
        if sse.id is not None:
            self.last_event_id = sse.id
        self.delivered_in_connection += 1
        self.failures = 0
        return Event.from_json(data, run_id=run_id, id=sse.id)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

