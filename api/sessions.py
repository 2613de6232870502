"""Sessions and messages over HTTP, plus `GET /me`. Posting a message goes through
`message_post`: it starts a run, or queues the input for the active one (SPEC §8)."""

import uuid
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Literal

from ninja import Field, Path, Query, Router, Schema, Status

from config.pagination import CURSOR_PATTERN
from config.errors import CommonRefusal, WardenError
from config.fair_share import session_turn
from api.errors import not_found
from agents.errors import AgentRefusal
from api.base import (
    BodyIn, COMMON_ERRORS, DEFAULT_PAGE_SIZE, MAX_BIGINT, MAX_PAGE_SIZE, ShownJSON, StorableText, errors,
)
from access import policy as access
from agents.selectors import agent_get
from api import streams
from api.events import (
    FeedPage, SSE_MANY_RUNS_RESPONSE, after_query, customer_view_of, feed_page, last_event_id_header, limit_query,
    max_seconds_query, resume_from,
)
from api.runs import RunOut
from engine.actions.messages import PostResult, held_input_drop, held_input_send, message_post
from engine.actions.sessions import session_open
from runs_app.feeds import feed_events
from sessions_app.models import InputDisposition, InputMode, MessageRole
from sessions_app.selectors import (
    held_input_list, message_list, message_list_latest, pending_input_get, pending_input_list, session_get, session_list,
)
from sessions_app.services import MAX_MESSAGE_CHARS

router = Router(tags=["sessions"])

# How much history the session detail embeds; the messages endpoint pages through the rest.
DETAIL_MESSAGES = 100


class SessionOut(Schema):
    id: uuid.UUID
    title: str
    owner: str
    agent: str | None = Field(description="the slug of the agent the session's runs use (null: none)")
    active_run_id: uuid.UUID | None = Field(description="the one queued, running or waiting run, if any")
    message_count: int
    created_at: datetime
    updated_at: datetime

    @staticmethod
    def resolve_owner(session) -> str:
        return session.owner.get_username()

    @staticmethod
    def resolve_agent(session) -> str | None:
        return session.agent.slug if session.agent_id else None

    @staticmethod
    def resolve_active_run_id(session) -> uuid.UUID | None:
        return getattr(session, "active_run_id", None)

    @staticmethod
    def resolve_message_count(session) -> int:
        return session.message_seq


class SessionPage(Schema):
    items: list[SessionOut]
    next_cursor: str | None


class MessageOut(Schema):
    id: int
    seq: int
    role: MessageRole
    content: str
    tool_calls: ShownJSON = Field(description="assistant messages that ask for tools: the calls as the model stated them")
    tool_call_id: str
    tool_name: str
    run_id: uuid.UUID | None
    created_at: datetime


class MessagePage(Schema):
    items: list[MessageOut]
    next_after: int = Field(description="pass as ?after= to continue")


class PendingInputOut(Schema):
    id: int
    content: str
    mode: InputMode
    resolved_mode: InputMode | None
    disposition: InputDisposition | None
    received_at: datetime
    consumed_at: datetime | None
    consumed_by_run_id: uuid.UUID | None
    held_from_run_id: uuid.UUID | None = Field(
        description="the cancelled run it was meant for, when it was held (disposition `held` until its user "
                    "sends it as a new request or drops it — then `new_run` or `discarded`)")
    held_reason: str = Field(description="why it was held, in words (empty unless it was)")

    @staticmethod
    def resolve_held_from_run_id(pending) -> uuid.UUID | None:
        return pending.held_from_id

    @staticmethod
    def resolve_resolved_mode(pending) -> str | None:
        return pending.resolved_mode or None

    @staticmethod
    def resolve_disposition(pending) -> str | None:
        return pending.disposition or None

    @staticmethod
    def resolve_consumed_by_run_id(pending) -> uuid.UUID | None:
        return pending.consumed_by_id


class SessionDetailOut(SessionOut):
    messages: list[MessageOut] = Field(description=f"the latest {DETAIL_MESSAGES} messages, oldest first")
    pending_inputs: list[PendingInputOut] = Field(description="input waiting for the active run to read it")
    held_inputs: list[PendingInputOut] = Field(
        description="input meant for a run that was cancelled before reading it: nothing starts from it until its "
                    "user chooses (the console's \"Send as a new request\" or \"Drop it\")")


class SessionIn(BodyIn):
    title: StorableText = Field("", max_length=200)
    agent: StorableText | None = Field(None, max_length=64, description="the slug of the agent its runs use (GET /agents); "
                                                               "default: the deployment's (WARDEN_DEFAULT_AGENT)")


class BudgetsIn(BodyIn):
    """Limits of the run a message starts. Each is capped by the deployment (WARDEN_MODEL_CALLS_CAP,
    WARDEN_TOKENS_CAP, WARDEN_DEADLINE_CAP_SECONDS; 403 `budget_over_cap` above one) unless the caller
    has runs_app.exceed_budget_caps; the bounds below hold for everyone."""
    max_model_calls: int | None = Field(None, ge=1, le=1000)
    max_tokens: int | None = Field(None, ge=1, le=10_000_000)
    deadline_seconds: int | None = Field(None, ge=1, le=7 * 86_400, description="wall-clock limit from now")


class MessageIn(BodyIn):
    content: StorableText = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    mode: InputMode = Field(
        InputMode.AUTO,
        description="while a run is active: `supplement` joins it, `new_intent` cancels it and starts a new run, "
                    "`queue` waits for it to end, `auto` lets the classifier decide",
    )
    budgets: BudgetsIn | None = Field(None, description="limits of the run this message starts (ignored when it joins one)")


class MessagePostOut(Schema):
    disposition: Literal["started_run", "answered", "pending"] = Field(
        description="`started_run`: the message started a new queued run; `answered`: it answered the question "
                    "the active run waited on, which resumes; `pending`: a run is active and reads the input at its "
                    "next safe point")
    message: MessageOut | None = Field(description="the history entry (started_run, answered)")
    pending_input: PendingInputOut | None = Field(
        description="the stored input (pending); `consumed_by_run_id` is already set when an intent switch "
                    "found nothing running, cancelled the run and started the next one from it")
    run: RunOut = Field(description="the run started, or the active run the input was given to")


def _visible_session(request, session_id):
    session = session_get(sessions=access.visible_sessions(user=request.auth), session_id=session_id)
    if session is None:
        raise not_found("session")
    return session


def _session_detail_out(session) -> SimpleNamespace:
    # A namespace, not the model instance: `messages` would collide with the reverse relation.
    return SimpleNamespace(
        **{field: getattr(session, field) for field in (
            "id", "title", "owner", "agent", "agent_id", "active_run_id", "message_seq", "created_at", "updated_at")},
        messages=message_list_latest(session=session, limit=DETAIL_MESSAGES),
        pending_inputs=pending_input_list(session=session),
        held_inputs=held_input_list(session=session),
    )


@router.post("", response={201: SessionOut, **errors(400, 401, 404, 422)}, summary="Create a session")
def sessions_create(request, payload: SessionIn):
    agent = None
    if payload.agent is not None:
        agent = agent_get(slug=payload.agent) if access.can_see_agents(user=request.auth) else None
        if agent is None:
            raise WardenError(AgentRefusal.UNKNOWN_AGENT, f"There is no agent {payload.agent!r}.", fields=[
                {"field": "body.agent", "message": f"no agent {payload.agent!r} (GET /agents lists them)",
                 "type": AgentRefusal.UNKNOWN_AGENT.value}])
    session = session_open(owner=request.auth, title=payload.title, agent=agent)
    return Status(201, session_get(sessions=access.visible_sessions(user=request.auth), session_id=session.pk))


@router.get("", response={200: SessionPage, **COMMON_ERRORS}, summary="List sessions")
def sessions_list(
    request,
    cursor: str | None = Query(None, max_length=60, pattern=CURSOR_PATTERN,
                                 description="`next_cursor` of the page before"),
    limit: int = Query(DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE),
):
    """Sessions the caller may see (their own, or all with sessions_app.view_session), newest first."""
    items, next_cursor = session_list(sessions=access.visible_sessions(user=request.auth), cursor=cursor, limit=limit)
    return {"items": items, "next_cursor": next_cursor}


@router.get("/{session_id}", response={200: SessionDetailOut, **COMMON_ERRORS}, summary="Session detail")
def sessions_get(request, session_id: uuid.UUID):
    """The session, its latest messages and the input waiting for its active run."""
    return _session_detail_out(_visible_session(request, session_id))


@router.get("/{session_id}/messages", response={200: MessagePage, **COMMON_ERRORS}, summary="Session history")
def sessions_messages(
    request,
    session_id: uuid.UUID,
    after: int = Query(0, ge=0, le=MAX_BIGINT, description="return messages with seq > after"),
    limit: int = Query(100, ge=1, le=500),
):
    """The append-only history in order, paged by sequence number."""
    session = _visible_session(request, session_id)
    items = message_list(session=session, after_seq=after, limit=limit)
    return {"items": items, "next_after": items[-1].seq if items else after}


@router.post(
    "/{session_id}/messages",
    response={201: MessagePostOut, 202: MessagePostOut, **COMMON_ERRORS, **errors(400, 403)},
    summary="Say something in a session",
)
def sessions_message_post(request, session_id: uuid.UUID, payload: MessageIn):
    """With no active run the message starts one (201, queued for a worker). While a run is
    active the input is stored and the run reads it at its next safe point (202): never lost,
    never a second concurrent run. Budgets above the deployment's caps: 403 `budget_over_cap`
    naming the cap, unless the caller has runs_app.exceed_budget_caps."""
    session = _visible_session(request, session_id)
    if not access.can_post_in_session(user=request.auth, session=session):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Only the session's owner may post in it.")
    budgets = None
    if payload.budgets is not None:
        budgets = {key: value for key, value in payload.budgets.model_dump().items() if value is not None}
    with session_turn(session.pk):  # the session's other posts first, waiting without a connection
        result = message_post(session=session, content=payload.content, mode=payload.mode, acting_user=request.auth,
                              budgets=budgets)
    return _post_result_out(result)


def _post_result_out(result: PostResult) -> Status:
    pending = result.pending_input
    if pending is not None:
        # An intent switch while nothing was running has already cancelled the run and started
        # the next one from this input; the row as it is now says so.
        pending.refresh_from_db()
    status = 201 if result.disposition == "started_run" else 202
    return Status(status, {
        "disposition": result.disposition,
        "message": result.message,
        "pending_input": pending,
        "run": result.run,
    })


# ---------------------------------------------------------------------------
# Input held from a cancelled run: its user sends it as a new request or drops it
# ---------------------------------------------------------------------------

def _held_input(request, session_id, input_id):
    """The session's input, when the caller may post in the session (404 as the detail; 403 for a
    reader who may not post); 404 when the input is not this session's."""
    session = _visible_session(request, session_id)
    if not access.can_post_in_session(user=request.auth, session=session):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Only the session's owner may choose what becomes of its input.")
    pending = pending_input_get(session=session, input_id=input_id)
    if pending is None:
        raise not_found("input")
    return session, pending


INPUT_ID = Path(..., ge=1, le=MAX_BIGINT, description="the input's `id` (the session detail's `held_inputs`)")


@router.post(
    "/{session_id}/held-inputs/{input_id}/send",
    response={201: MessagePostOut, 202: MessagePostOut, **COMMON_ERRORS, **errors(403, 409)},
    summary="Send input held from a cancelled run as a new request",
)
def sessions_held_input_send(request, session_id: uuid.UUID, input_id: int = INPUT_ID):
    """Input meant for a run that was cancelled is held (the session detail's `held_inputs`), never
    started by itself. Sending it posts it again as a queued request: it starts a run (201), or
    waits for the active one to end (202). Audited. 409 `input_not_held` once it was sent or dropped."""
    session, held = _held_input(request, session_id, input_id)
    with session_turn(session.pk):
        result = held_input_send(pending=held, acting_user=request.auth)
    return _post_result_out(result)


@router.post(
    "/{session_id}/held-inputs/{input_id}/drop",
    response={200: PendingInputOut, **COMMON_ERRORS, **errors(403, 409)},
    summary="Drop input held from a cancelled run",
)
def sessions_held_input_drop(request, session_id: uuid.UUID, input_id: int = INPUT_ID):
    """Nothing starts; the input stays in the session's record, `discarded`. Audited. 409
    `input_not_held` once it was sent or dropped."""
    session, held = _held_input(request, session_id, input_id)
    with session_turn(session.pk):
        return held_input_drop(pending=held, acting_user=request.auth)


# ---------------------------------------------------------------------------
# The session's events: every run's, in commit order (runs_app.feeds; the transport: api/streams.py)
# ---------------------------------------------------------------------------

def _session_with_runs(request, session_id):
    """The session, when the caller may see it (404 as the detail) and its runs (403: a reader of
    sessions who may not read runs)."""
    session = _visible_session(request, session_id)
    if not access.can_see_runs_of(user=request.auth, session=session):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "You may read this session, not its runs' events.")
    return session


@router.get("/{session_id}/events", response={200: FeedPage, **COMMON_ERRORS, **errors(403)},
            summary="Events of the session's runs, in commit order")
def sessions_events(request, session_id: uuid.UUID, after: str | None = after_query(), limit: int = limit_query()):
    """Every event of every run of the session — one run after another, since a session has at most
    one active run — from the cursor `after`: for catching up after a reconnect, or polling."""
    session = _session_with_runs(request, session_id)
    return feed_page(events=feed_events(session_id=session.pk), after=after, limit=limit,
                     customer_of=customer_view_of(request.auth))


@router.get(
    "/{session_id}/events/stream",
    response={**COMMON_ERRORS, **errors(403)},
    summary="Live events of the session's runs (Server-Sent Events)",
    openapi_extra={"responses": SSE_MANY_RUNS_RESPONSE},
)
def sessions_events_stream(
    request,
    session_id: uuid.UUID,
    after: str | None = after_query("start after this cursor (Last-Event-ID wins if both are sent)"),
    last_event_id: str = last_event_id_header(),
    max_seconds: int = max_seconds_query(),
):
    """Streams the events of the session's runs as they are committed, catching up from `after` /
    `Last-Event-ID` first. It does not end with a run: the next run's events follow."""
    session = _session_with_runs(request, session_id)
    caller = streams.caller_again(request)

    def still_allowed():
        user = caller()
        seen = session_get(sessions=access.visible_sessions(user=user), session_id=session.pk) if user is not None else None
        return seen if seen is not None and access.can_see_runs_of(user=user, session=seen) else None

    feed = streams.ManyRunsFeed(events=feed_events(session_id=session.pk), customer_of=customer_view_of(request.auth),
                                label=f"session {session.pk}", what="this session", session_id=session.pk)
    return streams.event_stream_response(feed=feed, after=resume_from(last_event_id=last_event_id, after=after),
                                         max_seconds=max_seconds, still_allowed=still_allowed, request=request)
