"""The asynchronous client, `AsyncWarden`: the same resources and calls as `Warden` (the same
`Call`s, retry decisions and stream state from _core.py and _endpoints.py), awaited over
httpx.AsyncClient; lists iterate with `async for`, streams too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import TypeVar

import httpx

from warden_client import _endpoints as api
from warden_client._core import (
    RETRY_EXCEPTIONS, Call, EventStreamState, ReconnectPolicy, RetryPolicy, client_headers, connection_error, result_of,
)
from warden_client.client import STREAM_READ_TIMEOUT, settings_from_env
from warden_client.models import (
    Agent, Approval, Event, EventPage, FeedPage, Me, Message, MessagePosted, Page, PendingInput, Run, RunDetail,
    RunListItem, Session, SessionDetail, ToolCall,
)
from warden_client.sse import SSEDecoder

T = TypeVar("T")


class AsyncWarden:
    """`Warden`, awaited: `async with AsyncWarden(url, key) as client: run = await client.runs.get(id)`."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0,
                 retry: RetryPolicy | None = None, reconnect: ReconnectPolicy | None = None,
                 headers: dict[str, str] | None = None, trust_env: bool = True,
                 http_client: httpx.AsyncClient | None = None):
        self.base_url, self.api_key = settings_from_env(base_url, api_key)
        self.retry = retry or RetryPolicy()
        self.reconnect = reconnect or ReconnectPolicy()
        # A client passed in (tests, proxies, custom transports) keeps its base URL and settings; it
        # gets the key and User-Agent in its headers.
        self._http = http_client or httpx.AsyncClient(base_url=self.base_url, timeout=timeout, trust_env=trust_env)
        self._http.headers.update(client_headers(self.api_key, headers))
        self._stream_timeout = httpx.Timeout(timeout, read=STREAM_READ_TIMEOUT)
        self.sessions = AsyncSessions(self)
        self.runs = AsyncRuns(self)
        self.approvals = AsyncApprovals(self)
        self.agents = AsyncAgents(self)
        self.tool_calls = AsyncToolCalls(self)
        self.events = AsyncEvents(self)

    async def __aenter__(self) -> AsyncWarden:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def me(self) -> Me:
        return await self.call(api.me())

    async def call(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(**call.request())
            except RETRY_EXCEPTIONS as exc:
                delay = self.retry.after_exception(call, attempt, exc)
                if delay is None:
                    raise connection_error(call, exc, attempt) from exc
                await asyncio.sleep(delay)
                continue
            delay = self.retry.after_response(call, attempt, response)
            if delay is None:
                return result_of(call, response)
            await asyncio.sleep(delay)

    async def paginate(self, page: Callable[[str | None], Call[Page[T]]]) -> AsyncIterator[T]:
        cursor: str | None = None
        while True:
            current = await self.call(page(cursor))
            for item in current.items:
                yield item
            if not current.next_cursor:
                return
            cursor = current.next_cursor

    async def feed(self, page: Callable[[str | None], Call[FeedPage]], after: str | None) -> AsyncIterator[Event]:
        while True:
            current = await self.call(page(after))
            for item in current.items:
                yield item
            if not current.items:
                return
            after = current.next_after

    async def stream(self, state: EventStreamState) -> AsyncIterator[Event]:
        while not state.ended:
            try:
                async with self._http.stream(**state.request(), timeout=self._stream_timeout) as response:
                    if response.status_code != 200:
                        delay = state.after_status(response, await response.aread())
                    else:
                        decoder = SSEDecoder()
                        async for chunk in response.aiter_bytes():
                            for sse in decoder.feed_bytes(chunk):
                                event = state.take(sse)
                                if event is not None:
                                    yield event
                                if state.ended:
                                    return
                        delay = state.after_break(None)
            except RETRY_EXCEPTIONS as exc:
                delay = state.after_break(exc)
            await asyncio.sleep(delay)


class _AsyncResource:
    def __init__(self, client: AsyncWarden):
        self._client = client


class AsyncSessions(_AsyncResource):
    async def create(self, *, title: str = "", agent: str | None = None, idempotency_key: str | None = None) -> Session:
        return await self._client.call(api.sessions_create(title=title, agent=agent, idempotency_key=idempotency_key))

    async def get(self, session_id: str) -> SessionDetail:
        return await self._client.call(api.sessions_get(session_id))

    async def list(self, *, cursor: str | None = None, limit: int | None = None) -> Page[Session]:
        return await self._client.call(api.sessions_list(cursor=cursor, limit=limit))

    def iter(self, *, limit: int | None = None) -> AsyncIterator[Session]:
        return self._client.paginate(lambda cursor: api.sessions_list(cursor=cursor, limit=limit))

    async def say(self, session_id: str, content: str, *, mode: str | None = None,
                  budgets: dict[str, int] | None = None, idempotency_key: str | None = None) -> MessagePosted:
        return await self._client.call(api.sessions_message_post(session_id, content, mode=mode, budgets=budgets,
                                                                 idempotency_key=idempotency_key))

    async def send_held(self, session_id: str, input_id: int, *, idempotency_key: str | None = None) -> MessagePosted:
        """Held input (its run was cancelled) sent as a new request; see Warden.sessions.send_held."""
        return await self._client.call(api.sessions_held_input_send(session_id, input_id, idempotency_key=idempotency_key))

    async def drop_held(self, session_id: str, input_id: int, *, idempotency_key: str | None = None) -> PendingInput:
        """Held input dropped; see Warden.sessions.drop_held."""
        return await self._client.call(api.sessions_held_input_drop(session_id, input_id, idempotency_key=idempotency_key))

    async def messages(self, session_id: str, *, after: int = 0, page_size: int | None = None) -> AsyncIterator[Message]:
        while True:
            items, next_after = await self._client.call(api.sessions_messages(session_id, after=after, limit=page_size))
            for item in items:
                yield item
            if not items:
                return
            after = next_after

    def events(self, session_id: str, *, after: str | None = None, page_size: int | None = None) -> AsyncIterator[Event]:
        return self._client.feed(lambda cursor: api.sessions_events(session_id, after=cursor, limit=page_size), after)

    def stream(self, session_id: str, *, after: str | None = None) -> AsyncIterator[Event]:
        return self._client.stream(EventStreamState(
            path=api.sessions_events_stream_path(session_id), run_id=None, last_event_id=after, params=[],
            policy=self._client.reconnect))


class AsyncRuns(_AsyncResource):
    async def list(self, *, status: str | Iterable[str] | None = None, phase: str | None = None,
                   wait_reason: str | None = None, outcome: str | Iterable[str] | None = None,
                   session: str | None = None, q: str | None = None, agent: str | None = None, tool: str | None = None,
                   created_after: datetime | str | None = None, created_before: datetime | str | None = None,
                   cursor: str | None = None, limit: int | None = None) -> Page[RunListItem]:
        return await self._client.call(api.runs_list(
            status=status, phase=phase, wait_reason=wait_reason, outcome=outcome, session=session, q=q, agent=agent,
            tool=tool, created_after=created_after, created_before=created_before, cursor=cursor, limit=limit))

    def iter(self, *, status: str | Iterable[str] | None = None, phase: str | None = None,
             wait_reason: str | None = None, outcome: str | Iterable[str] | None = None, session: str | None = None,
             q: str | None = None, agent: str | None = None, tool: str | None = None,
             created_after: datetime | str | None = None, created_before: datetime | str | None = None,
             limit: int | None = None) -> AsyncIterator[RunListItem]:
        return self._client.paginate(lambda cursor: api.runs_list(
            status=status, phase=phase, wait_reason=wait_reason, outcome=outcome, session=session, q=q, agent=agent,
            tool=tool, created_after=created_after, created_before=created_before, cursor=cursor, limit=limit))

    async def get(self, run_id: str) -> RunDetail:
        return await self._client.call(api.runs_get(run_id))

    async def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> EventPage:
        return await self._client.call(api.runs_events(run_id, after=after, limit=limit))

    async def cancel(self, run_id: str, *, reason: str = "", idempotency_key: str | None = None) -> Run:
        return await self._client.call(api.runs_cancel(run_id, reason=reason, idempotency_key=idempotency_key))

    async def retry(self, run_id: str, *, reason: str = "", budgets: dict[str, int] | None = None,
                    idempotency_key: str | None = None) -> Run:
        return await self._client.call(api.runs_retry(run_id, reason=reason, budgets=budgets,
                                                      idempotency_key=idempotency_key))

    async def fork(self, run_id: str, *, reason: str = "", idempotency_key: str | None = None) -> Run:
        return await self._client.call(api.runs_fork(run_id, reason=reason, idempotency_key=idempotency_key))

    def stream(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        return self._client.stream(EventStreamState(
            path=api.runs_events_stream_path(run_id), run_id=str(run_id), last_event_id=str(after) if after else None,
            params=[], policy=self._client.reconnect))

    async def wait(self, run_id: str) -> RunDetail:
        async for _ in self.stream(run_id, after=(await self.get(run_id)).event_seq):
            pass
        return await self.get(run_id)


class AsyncApprovals(_AsyncResource):
    async def list(self, *, status: str | Iterable[str] | None = None, decidable: bool | None = None,
                   run: str | None = None, cursor: str | None = None, limit: int | None = None) -> Page[Approval]:
        return await self._client.call(api.approvals_list(status=status, decidable=decidable, run=run, cursor=cursor,
                                                          limit=limit))

    def iter(self, *, status: str | Iterable[str] | None = None, decidable: bool | None = None, run: str | None = None,
             limit: int | None = None) -> AsyncIterator[Approval]:
        return self._client.paginate(lambda cursor: api.approvals_list(
            status=status, decidable=decidable, run=run, cursor=cursor, limit=limit))

    async def get(self, approval_id: str) -> Approval:
        return await self._client.call(api.approvals_get(approval_id))

    async def approve(self, approval_id: str, *, note: str = "", idempotency_key: str | None = None) -> Approval:
        return await self._client.call(api.approvals_decide(approval_id, "approve", note=note,
                                                            idempotency_key=idempotency_key))

    async def reject(self, approval_id: str, *, note: str = "", customer_message: str = "",
                     idempotency_key: str | None = None) -> Approval:
        return await self._client.call(api.approvals_decide(approval_id, "reject", note=note,
                                                            customer_message=customer_message,
                                                            idempotency_key=idempotency_key))


class AsyncEvents(_AsyncResource):
    def iter(self, *, after: str | None = None, page_size: int | None = None) -> AsyncIterator[Event]:
        return self._client.feed(lambda cursor: api.events_list(after=cursor, limit=page_size), after)

    def stream(self, *, after: str | None = None) -> AsyncIterator[Event]:
        return self._client.stream(EventStreamState(path=api.EVENTS_STREAM_PATH, run_id=None, last_event_id=after,
                                                    params=[], policy=self._client.reconnect))


class AsyncAgents(_AsyncResource):
    async def list(self) -> list[Agent]:
        return await self._client.call(api.agents_list())

    async def get(self, slug: str) -> Agent:
        return await self._client.call(api.agents_get(slug))


class AsyncToolCalls(_AsyncResource):
    async def list(self, *, status: str | Iterable[str] | None = None, run: str | None = None, tool: str | None = None,
                   cursor: str | None = None, limit: int | None = None) -> Page[ToolCall]:
        return await self._client.call(api.tool_calls_list(status=status, run=run, tool=tool, cursor=cursor,
                                                           limit=limit))

    def iter(self, *, status: str | Iterable[str] | None = None, run: str | None = None, tool: str | None = None,
             limit: int | None = None) -> AsyncIterator[ToolCall]:
        return self._client.paginate(lambda cursor: api.tool_calls_list(status=status, run=run, tool=tool,
                                                                        cursor=cursor, limit=limit))

    async def get(self, tool_call_id: str) -> ToolCall:
        return await self._client.call(api.tool_calls_get(tool_call_id))
