"""Every API operation the clients offer, as a `Call`: its path and parameters exactly as the
server's OpenAPI schema names them (operation ids in the comments), and how its answer is read.
The sync and async resources are thin wrappers around these."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from urllib.parse import quote

from warden_client._core import Call, Query, body, page_of, query
from warden_client.models import (
    Agent, Approval, Event, EventPage, FeedPage, Me, Message, MessagePosted, Page, PendingInput, Run, RunDetail,
    RunListItem, Session, SessionDetail, ToolCall,
)


def _id(value: object) -> str:
    return quote(str(value), safe="")


def _list(value: str | Iterable[str] | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


# --- me, agents ------------------------------------------------------------------------------------

def me() -> Call[Me]:  # me
    return Call("GET", "/me", Me.from_json)


def agents_list() -> Call[list[Agent]]:  # agents_list
    return Call("GET", "/agents", lambda data: [Agent.from_json(item) for item in data])


def agents_get(slug: str) -> Call[Agent]:  # agents_get
    return Call("GET", f"/agents/{_id(slug)}", Agent.from_json)


# --- sessions --------------------------------------------------------------------------------------

def sessions_create(*, title: str = "", agent: str | None = None, idempotency_key: str | None = None) -> Call[Session]:
    return Call("POST", "/sessions", Session.from_json, body=body(title=title, agent=agent), idempotency_key=idempotency_key)


def sessions_list(*, cursor: str | None = None, limit: int | None = None) -> Call[Page[Session]]:
    return Call("GET", "/sessions", page_of(Session.from_json), params=query(cursor=cursor, limit=limit))


def sessions_get(session_id: str) -> Call[SessionDetail]:
    return Call("GET", f"/sessions/{_id(session_id)}", SessionDetail.from_json)


def sessions_messages(session_id: str, *, after: int = 0, limit: int | None = None) -> Call[tuple[list[Message], int]]:
    def parse(data: Any) -> tuple[list[Message], int]:
        return [Message.from_json(item) for item in data["items"]], int(data["next_after"])
    return Call("GET", f"/sessions/{_id(session_id)}/messages", parse, params=query(after=after, limit=limit))


def sessions_message_post(session_id: str, content: str, *, mode: str | None = None,
                          budgets: dict[str, int] | None = None, idempotency_key: str | None = None) -> Call[MessagePosted]:
    return Call("POST", f"/sessions/{_id(session_id)}/messages", MessagePosted.from_json,
                body=body(content=content, mode=mode, budgets=budgets), idempotency_key=idempotency_key)


def sessions_held_input_send(session_id: str, input_id: int, *, idempotency_key: str | None = None) -> Call[MessagePosted]:
    return Call("POST", f"/sessions/{_id(session_id)}/held-inputs/{int(input_id)}/send", MessagePosted.from_json,
                body={}, idempotency_key=idempotency_key)


def sessions_held_input_drop(session_id: str, input_id: int, *, idempotency_key: str | None = None) -> Call[PendingInput]:
    return Call("POST", f"/sessions/{_id(session_id)}/held-inputs/{int(input_id)}/drop", PendingInput.from_json,
                body={}, idempotency_key=idempotency_key)


def sessions_events(session_id: str, *, after: str | None = None, limit: int | None = None) -> Call[FeedPage]:
    return Call("GET", f"/sessions/{_id(session_id)}/events", _feed_page, params=query(after=after, limit=limit))


def sessions_events_stream_path(session_id: str) -> str:
    return f"/sessions/{_id(session_id)}/events/stream"


# --- every run's events (runs_app.follow_all_events) ----------------------------------------------

def events_list(*, after: str | None = None, limit: int | None = None) -> Call[FeedPage]:
    return Call("GET", "/events", _feed_page, params=query(after=after, limit=limit))


EVENTS_STREAM_PATH = "/events/stream"


def _feed_page(data: Any) -> FeedPage:
    """A page of many runs' events in commit order: each item's `cursor` is its `id`."""
    items = [Event.from_json(item, id=item.get("cursor")) for item in data["items"]]
    return FeedPage(items=items, next_after=data.get("next_after"))


# --- runs ------------------------------------------------------------------------------------------

def runs_list(*, status: str | Iterable[str] | None = None, phase: str | None = None, wait_reason: str | None = None,
              outcome: str | Iterable[str] | None = None, session: str | None = None, q: str | None = None,
              agent: str | None = None, tool: str | None = None, created_after: datetime | str | None = None,
              created_before: datetime | str | None = None, cursor: str | None = None,
              limit: int | None = None) -> Call[Page[RunListItem]]:
    params: Query = query(status=_list(status), phase=phase, wait_reason=wait_reason, outcome=_list(outcome),
                          session=session, q=q, agent=agent, tool=tool, created_after=created_after,
                          created_before=created_before, cursor=cursor, limit=limit)
    return Call("GET", "/runs", page_of(RunListItem.from_json), params=params)


def runs_get(run_id: str) -> Call[RunDetail]:
    return Call("GET", f"/runs/{_id(run_id)}", RunDetail.from_json)


def runs_events(run_id: str, *, after: int = 0, limit: int | None = None) -> Call[EventPage]:
    def parse(data: Any) -> EventPage:
        items = [Event.from_json(item, run_id=str(run_id)) for item in data["items"]]
        return EventPage.from_json(data, items=items)
    return Call("GET", f"/runs/{_id(run_id)}/events", parse, params=query(after=after, limit=limit))


def runs_cancel(run_id: str, *, reason: str = "", idempotency_key: str | None = None) -> Call[Run]:
    return Call("POST", f"/runs/{_id(run_id)}/cancel", Run.from_json, body=body(reason=reason),
                idempotency_key=idempotency_key)


def runs_retry(run_id: str, *, reason: str = "", budgets: dict[str, int] | None = None,
               idempotency_key: str | None = None) -> Call[Run]:
    return Call("POST", f"/runs/{_id(run_id)}/retry", Run.from_json, body=body(reason=reason, budgets=budgets),
                idempotency_key=idempotency_key)


def runs_fork(run_id: str, *, reason: str = "", idempotency_key: str | None = None) -> Call[Run]:
    return Call("POST", f"/runs/{_id(run_id)}/fork", Run.from_json, body=body(reason=reason),
                idempotency_key=idempotency_key)


def runs_events_stream_path(run_id: str) -> str:
    return f"/runs/{_id(run_id)}/events/stream"


# --- approvals -------------------------------------------------------------------------------------

def approvals_list(*, status: str | Iterable[str] | None = None, decidable: bool | None = None, run: str | None = None,
                   cursor: str | None = None, limit: int | None = None) -> Call[Page[Approval]]:
    params = query(status=_list(status), decidable=decidable, run=run, cursor=cursor, limit=limit)
    return Call("GET", "/approvals", page_of(Approval.from_json), params=params)


def approvals_get(approval_id: str) -> Call[Approval]:
    return Call("GET", f"/approvals/{_id(approval_id)}", Approval.from_json)


def approvals_decide(approval_id: str, decision: str, *, note: str = "", customer_message: str = "",
                     idempotency_key: str | None = None) -> Call[Approval]:
    return Call("POST", f"/approvals/{_id(approval_id)}/decision", Approval.from_json,
                body=body(decision=decision, note=note, customer_message=customer_message),
                idempotency_key=idempotency_key)


# --- tool calls ------------------------------------------------------------------------------------

def tool_calls_list(*, status: str | Iterable[str] | None = None, run: str | None = None, tool: str | None = None,
                    cursor: str | None = None, limit: int | None = None) -> Call[Page[ToolCall]]:
    params = query(status=_list(status), run=run, tool=tool, cursor=cursor, limit=limit)
    return Call("GET", "/tool-calls", page_of(ToolCall.from_json), params=params)


def tool_calls_get(tool_call_id: str) -> Call[ToolCall]:
    return Call("GET", f"/tool-calls/{_id(tool_call_id)}", ToolCall.from_json)
