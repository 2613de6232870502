"""The synchronous client: `Warden(url, api_key)`, its resources (`sessions`, `runs`, `approvals`,
`agents`, `tool_calls`) and the loops that move bytes — retries, pages, event streams — around
the shared core (_core.py, _endpoints.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TypeVar

import httpx

from warden_client import _endpoints as api
from warden_client._core import (
    RETRY_EXCEPTIONS, Call, EventStreamState, ReconnectPolicy, RetryPolicy, client_headers, connection_error, result_of,
)
from warden_client.models import (
    Agent, Approval, Event, EventPage, FeedPage, Me, Message, MessagePosted, Page, PendingInput, Run, RunDetail,
    RunListItem, Session, SessionDetail, ToolCall,
)
from warden_client.sse import SSEDecoder

T = TypeVar("T")

DEFAULT_URL = "http://localhost:8000"
# A stream's read timeout: the server sends a keepalive comment every 15 s while quiet.
STREAM_READ_TIMEOUT = 60.0


def settings_from_env(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """The base URL and key: the arguments, else WARDEN_URL and WARDEN_API_KEY."""
    url = base_url or os.environ.get("WARDEN_URL") or DEFAULT_URL
    return url.rstrip("/").removesuffix("/api/v1"), api_key or os.environ.get("WARDEN_API_KEY") or None


class Warden:
    """A client of one Warden deployment. `base_url` is the server's root (`http://host:8000`),
    `api_key` an API key (`wdn_…`, sent as a Bearer token); both default to WARDEN_URL and
    WARDEN_API_KEY. Use it as a context manager, or call `close()`."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0,
                 retry: RetryPolicy | None = None, reconnect: ReconnectPolicy | None = None,
                 headers: dict[str, str] | None = None, trust_env: bool = True,
                 http_client: httpx.Client | None = None):
        self.base_url, self.api_key = settings_from_env(base_url, api_key)
        self.retry = retry or RetryPolicy()
        self.reconnect = reconnect or ReconnectPolicy()
        # A client passed in (tests, proxies, custom transports) keeps its base URL and settings; it
        # gets the key and User-Agent in its headers.
        self._http = http_client or httpx.Client(base_url=self.base_url, timeout=timeout, trust_env=trust_env)
        self._http.headers.update(client_headers(self.api_key, headers))
        self._stream_timeout = httpx.Timeout(timeout, read=STREAM_READ_TIMEOUT)
        self.sessions = Sessions(self)
        self.runs = Runs(self)
        self.approvals = Approvals(self)
        self.agents = Agents(self)
        self.tool_calls = ToolCalls(self)
        self.events = Events(self)

    def __enter__(self) -> Warden:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def me(self) -> Me:
        """`GET /me`: who the key belongs to, and their operator permissions."""
        return self.call(api.me())

    # --- the loops ---------------------------------------------------------------------------------

    def call(self, call: Call[T]) -> T:
        """Send `call`, retrying what is safe to retry (RetryPolicy), and read its answer."""
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(**call.request())
            except RETRY_EXCEPTIONS as exc:
                delay = self.retry.after_exception(call, attempt, exc)
                if delay is None:
                    raise connection_error(call, exc, attempt) from exc
                time.sleep(delay)
                continue
            delay = self.retry.after_response(call, attempt, response)
            if delay is None:
                return result_of(call, response)
            time.sleep(delay)

    def paginate(self, page: Callable[[str | None], Call[Page[T]]]) -> Iterator[T]:
        """Every item of a list, following `next_cursor` page after page."""
        cursor: str | None = None
        while True:
            current = self.call(page(cursor))
            yield from current.items
            if not current.next_cursor:
                return
            cursor = current.next_cursor

    def feed(self, page: Callable[[str | None], Call[FeedPage]], after: str | None) -> Iterator[Event]:
        """Every event of a many-runs feed after the cursor `after`, up to now, page after page."""
        while True:
            current = self.call(page(after))
            yield from current.items
            if not current.items:
                return
            after = current.next_after

    def stream(self, state: EventStreamState) -> Iterator[Event]:
        """The events of a stream, reconnecting with Last-Event-ID when its connection ends."""
        while not state.ended:
            try:
                with self._http.stream(**state.request(), timeout=self._stream_timeout) as response:
                    if response.status_code != 200:
                        delay = state.after_status(response, response.read())
                    else:
                        decoder = SSEDecoder()
                        for chunk in response.iter_bytes():
                            for sse in decoder.feed_bytes(chunk):
                                event = state.take(sse)
                                if event is not None:
                                    yield event
                                if state.ended:
                                    return
                        delay = state.after_break(None)
            except RETRY_EXCEPTIONS as exc:
                delay = state.after_break(exc)
            time.sleep(delay)


class _Resource:
    def __init__(self, client: Warden):
        self._client = client


class Sessions(_Resource):
    def create(self, *, title: str = "", agent: str | None = None, idempotency_key: str | None = None) -> Session:
        """`POST /sessions`: a new session (of the deployment's default agent unless `agent` names one)."""
        return self._client.call(api.sessions_create(title=title, agent=agent, idempotency_key=idempotency_key))

    def get(self, session_id: str) -> SessionDetail:
        """`GET /sessions/{id}`: the session, its latest messages and its pending input."""
        return self._client.call(api.sessions_get(session_id))

    def list(self, *, cursor: str | None = None, limit: int | None = None) -> Page[Session]:
        """One page of the sessions the caller may see, newest first."""
        return self._client.call(api.sessions_list(cursor=cursor, limit=limit))

    def iter(self, *, limit: int | None = None) -> Iterator[Session]:
        """Every session the caller may see, newest first (pages of `limit`)."""
        return self._client.paginate(lambda cursor: api.sessions_list(cursor=cursor, limit=limit))

    def say(self, session_id: str, content: str, *, mode: str | None = None, budgets: dict[str, int] | None = None,
            idempotency_key: str | None = None) -> MessagePosted:
        """`POST /sessions/{id}/messages`: starts a run, or hands the input to the active one
        (`mode`: auto, supplement, new_intent, queue). Sent with an Idempotency-Key, so a retry after
        a lost answer stores the message once (`replayed` on the answer says the retry found it)."""
        return self._client.call(api.sessions_message_post(session_id, content, mode=mode, budgets=budgets,
                                                           idempotency_key=idempotency_key))

    def send_held(self, session_id: str, input_id: int, *, idempotency_key: str | None = None) -> MessagePosted:
        """Input held when the run it was meant for was cancelled (`get(...).held_inputs`), sent as a
        new request: it starts a run (`started_run`) or waits for the active one (`pending`). Once:
        a second choice is a ConflictError (`input_not_held`)."""
        return self._client.call(api.sessions_held_input_send(session_id, input_id, idempotency_key=idempotency_key))

    def drop_held(self, session_id: str, input_id: int, *, idempotency_key: str | None = None) -> PendingInput:
        """Held input dropped: nothing starts; it stays in the session's record as `discarded`."""
        return self._client.call(api.sessions_held_input_drop(session_id, input_id, idempotency_key=idempotency_key))

    def messages(self, session_id: str, *, after: int = 0, page_size: int | None = None) -> Iterator[Message]:
        """The session's history after seq `after`, in order, every page."""
        while True:
            items, next_after = self._client.call(api.sessions_messages(session_id, after=after, limit=page_size))
            yield from items
            if not items:
                return
            after = next_after

    def events(self, session_id: str, *, after: str | None = None, page_size: int | None = None) -> Iterator[Event]:
        """The events of the session's runs committed so far, in commit order, after the cursor `after`.
        The API holds back events behind a transaction still running (an empty page), so the last
        events committed may come only on a later call, or by `stream`."""
        return self._client.feed(lambda cursor: api.sessions_events(session_id, after=cursor, limit=page_size), after)

    def stream(self, session_id: str, *, after: str | None = None) -> Iterator[Event]:
        """The session's events live, across its runs (`GET /sessions/{id}/events/stream`), from the
        start or after the cursor `after` (an event's `id`). Never ends by itself: the connection is
        reopened from the last event's id when the server ends it or it breaks."""
        return self._client.stream(EventStreamState(
            path=api.sessions_events_stream_path(session_id), run_id=None, last_event_id=after, params=[],
            policy=self._client.reconnect))


class Runs(_Resource):
    def list(self, *, status: str | Iterable[str] | None = None, phase: str | None = None,
             wait_reason: str | None = None, outcome: str | Iterable[str] | None = None, session: str | None = None,
             q: str | None = None, agent: str | None = None, tool: str | None = None,
             created_after: datetime | str | None = None, created_before: datetime | str | None = None,
             cursor: str | None = None, limit: int | None = None) -> Page[RunListItem]:
        """One page of `GET /runs`, newest first; filters combine (`q`: the desk's search)."""
        return self._client.call(api.runs_list(
            status=status, phase=phase, wait_reason=wait_reason, outcome=outcome, session=session, q=q, agent=agent,
            tool=tool, created_after=created_after, created_before=created_before, cursor=cursor, limit=limit))

    def iter(self, *, status: str | Iterable[str] | None = None, phase: str | None = None,
             wait_reason: str | None = None, outcome: str | Iterable[str] | None = None, session: str | None = None,
             q: str | None = None, agent: str | None = None, tool: str | None = None,
             created_after: datetime | str | None = None, created_before: datetime | str | None = None,
             limit: int | None = None) -> Iterator[RunListItem]:
        """Every run matching the filters, newest first, following the cursor (pages of `limit`)."""
        return self._client.paginate(lambda cursor: api.runs_list(
            status=status, phase=phase, wait_reason=wait_reason, outcome=outcome, session=session, q=q, agent=agent,
            tool=tool, created_after=created_after, created_before=created_before, cursor=cursor, limit=limit))

    def get(self, run_id: str) -> RunDetail:
        return self._client.call(api.runs_get(run_id))

    def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> EventPage:
        """One page of the run's event log after seq `after`."""
        return self._client.call(api.runs_events(run_id, after=after, limit=limit))

    def cancel(self, run_id: str, *, reason: str = "", idempotency_key: str | None = None) -> Run:
        return self._client.call(api.runs_cancel(run_id, reason=reason, idempotency_key=idempotency_key))

    def retry(self, run_id: str, *, reason: str = "", budgets: dict[str, int] | None = None,
              idempotency_key: str | None = None) -> Run:
        """A failed or cancelled run tried again as a new run (the answer is the new run)."""
        return self._client.call(api.runs_retry(run_id, reason=reason, budgets=budgets, idempotency_key=idempotency_key))

    def fork(self, run_id: str, *, reason: str = "", idempotency_key: str | None = None) -> Run:
        return self._client.call(api.runs_fork(run_id, reason=reason, idempotency_key=idempotency_key))

    def stream(self, run_id: str, *, after: int = 0) -> Iterator[Event]:
        """The run's events after seq `after`, live; stops once the run is terminal and every event
        was delivered (the server's `event: end`). Reconnects with Last-Event-ID when the connection
        breaks or the server restarts: no event twice, none skipped."""
        return self._client.stream(EventStreamState(
            path=api.runs_events_stream_path(run_id), run_id=str(run_id), last_event_id=str(after) if after else None,
            params=[], policy=self._client.reconnect))

    def wait(self, run_id: str) -> RunDetail:
        """Block until the run is terminal (by its event stream); the run as it ended."""
        for _ in self.stream(run_id, after=self.get(run_id).event_seq):
            pass
        return self.get(run_id)


class Approvals(_Resource):
    def list(self, *, status: str | Iterable[str] | None = None, decidable: bool | None = None, run: str | None = None,
             cursor: str | None = None, limit: int | None = None) -> Page[Approval]:
        """One page of the caller's queue: by default the pending approvals they may decide."""
        return self._client.call(api.approvals_list(status=status, decidable=decidable, run=run, cursor=cursor,
                                                    limit=limit))

    def iter(self, *, status: str | Iterable[str] | None = None, decidable: bool | None = None, run: str | None = None,
             limit: int | None = None) -> Iterator[Approval]:
        return self._client.paginate(lambda cursor: api.approvals_list(
            status=status, decidable=decidable, run=run, cursor=cursor, limit=limit))

    def get(self, approval_id: str) -> Approval:
        return self._client.call(api.approvals_get(approval_id))

    def approve(self, approval_id: str, *, note: str = "", idempotency_key: str | None = None) -> Approval:
        """Approve: the run resumes. `note` is internal (desk and audit trail)."""
        return self._client.call(api.approvals_decide(approval_id, "approve", note=note, idempotency_key=idempotency_key))

    def reject(self, approval_id: str, *, note: str = "", customer_message: str = "",
               idempotency_key: str | None = None) -> Approval:
        """Reject: the write is cancelled and the model told so, with `customer_message` (never the note)."""
        return self._client.call(api.approvals_decide(approval_id, "reject", note=note,
                                                      customer_message=customer_message,
                                                      idempotency_key=idempotency_key))


class Events(_Resource):
    """Every run's events the caller may see, in commit order (the key's owner needs the
    runs_app.follow_all_events permission; 403 otherwise)."""

    def iter(self, *, after: str | None = None, page_size: int | None = None) -> Iterator[Event]:
        """The events committed so far after the cursor `after` (an event's `id`)."""
        return self._client.feed(lambda cursor: api.events_list(after=cursor, limit=page_size), after)

    def stream(self, *, after: str | None = None) -> Iterator[Event]:
        """Every run's events live (`GET /events/stream`), resumed with Last-Event-ID like a session's."""
        return self._client.stream(EventStreamState(path=api.EVENTS_STREAM_PATH, run_id=None, last_event_id=after,
                                                    params=[], policy=self._client.reconnect))


class Agents(_Resource):
    def list(self) -> list[Agent]:
        return self._client.call(api.agents_list())

    def get(self, slug: str) -> Agent:
        return self._client.call(api.agents_get(slug))


class ToolCalls(_Resource):
    def list(self, *, status: str | Iterable[str] | None = None, run: str | None = None, tool: str | None = None,
             cursor: str | None = None, limit: int | None = None) -> Page[ToolCall]:
        """One page of tool calls, newest first; `status="unknown"` is the reconciliation queue."""
        return self._client.call(api.tool_calls_list(status=status, run=run, tool=tool, cursor=cursor, limit=limit))

    def iter(self, *, status: str | Iterable[str] | None = None, run: str | None = None, tool: str | None = None,
             limit: int | None = None) -> Iterator[ToolCall]:
        return self._client.paginate(lambda cursor: api.tool_calls_list(status=status, run=run, tool=tool,
                                                                        cursor=cursor, limit=limit))

    def get(self, tool_call_id: str) -> ToolCall:
        return self._client.call(api.tool_calls_get(tool_call_id))


__all__ = ["Agents", "Approvals", "Events", "Runs", "Sessions", "ToolCalls", "Warden", "settings_from_env"]
