"""Runs over HTTP: list (filters, keyset pages), detail, event log, live event stream (SSE),
cancel. Reads come from runs_app.selectors; the one write (cancel) goes through the engine's
cancel protocol."""

import asyncio
import json
import logging
import math
import time
import uuid
from datetime import datetime
from types import SimpleNamespace
from typing import Annotated, Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import StreamingHttpResponse
from ninja import Field, Header, Query, Router, Schema, Status
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict
from pydantic_core import to_json

from approvals_app.api import ApprovalOut
from config.api_base import (
    BodyIn, COMMON_ERRORS, DEFAULT_PAGE_SIZE, MAX_BIGINT, MAX_PAGE_SIZE, ApiError, StorableText, Timestamp, errors, not_found,
)
from engine.actions.cancel import run_cancel_request
from engine.actions.agents import agent_save
from engine.actions.runs import run_retry
from runs_app import liveness
from runs_app.events import event_payload_for_customer
from runs_app.live import PUBLISH_TIMEOUT_SECONDS, session_group
from runs_app.models import RunOutcome, RunPhase, RunStatus, WaitReason
from runs_app.agents import AgentDefinitionInvalid
from runs_app.selectors import (
    agent_get, agent_list, run_agent_version, run_detail, run_event_list, run_event_poll, run_get, run_list, run_wait_clock,
)
from sessions_app import access
from sessions_app.api_keys import ApiKeyRevoked, api_key_authenticate
from tools_app.api import ToolCallOut

logger = logging.getLogger("warden.live")

router = Router(tags=["runs"])

# The event stream: how often the sync stream (WSGI, the test client) looks for new events, how
# long a stream stays quiet before a keepalive comment, and how many events one read fetches.
SSE_POLL_SECONDS = 0.25
SSE_KEEPALIVE_SECONDS = 15.0
SSE_BATCH = 200
# An open stream checks this often that its caller may still see the run (a revoked key, a
# deactivated user, a logout or a lost permission ends it): as often as the console's socket
# (WARDEN_CONSOLE_RECHECK_SECONDS). Its read of the run doubles as the idle read below.
SSE_RECHECK_SECONDS = 30.0
# Under ASGI a stream sleeps on its session's doorbell (runs_app.live rings it after every commit
# of events) and reads the database when its run's doorbell rings, and otherwise only on every
# SSE_IDLE_READ_KEEPALIVES-th keepalive: the access re-check, and any event whose doorbell was
# lost. With the defaults one read of two queries per 30 s (issue 16: an idle stream ≤ 0.1/s).
SSE_IDLE_READ_KEEPALIVES = 2
# Without a channel layer (none configured, or it failed) the async stream polls this often:
# slower than the sync stream, since under ASGI one process serves every open stream.
SSE_POLL_WITHOUT_LAYER_SECONDS = 1.0
# A stream trusts its doorbell once a message it sent itself came back through the layer. It
# waits SSE_DOORBELL_PROBE_SECONDS for the first, twice as long for each next one, and polls
# after SSE_DOORBELL_PROBES (6.35 s in all).
SSE_DOORBELL_PROBE_SECONDS = 0.05
SSE_DOORBELL_PROBES = 7


# ---------------------------------------------------------------------------
# Schemas
# ---------------------------------------------------------------------------

def _blank_to_none(value):
    return value or None


class RunOut(BaseModel):
    """A run's state. A plain pydantic model (not a ninja Schema): list pages validate plain
    dicts, several times faster than ORM objects through ninja's attribute getter."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    session_id: uuid.UUID
    status: RunStatus
    phase: Annotated[RunPhase | None, BeforeValidator(_blank_to_none)] = Field(description="queued/running runs only")
    wait_reason: Annotated[WaitReason | None, BeforeValidator(_blank_to_none)] = Field(description="waiting runs only")
    outcome: Annotated[RunOutcome | None, BeforeValidator(_blank_to_none)] = Field(
        description="ended runs: what their writes came to, beside the status (a refused refund is a `completed` run "
                    "whose outcome is `rejected`): `applied` (a write took effect), `rejected` / `expired` (its approval), "
                    "`not_applied` (asked for, did not happen), `none` (no write asked for); null while active")
    model_calls: int
    tokens_used: int
    cancel_requested_at: datetime | None
    error_code: Annotated[str | None, BeforeValidator(_blank_to_none)] = Field(
        description="failed runs: machine-readable reason")
    created_at: datetime
    finished_at: datetime | None


class RunPage(Schema):
    items: list[RunOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last page")


class BudgetsOut(Schema):
    max_model_calls: int
    model_calls: int
    max_tokens: int
    tokens_used: int
    deadline: datetime
    model_retries: int
    set_by: str | None = Field(description="who chose these budgets in their request; null: the deployment's defaults")


class WaitOut(Schema):
    reason: WaitReason
    type: str
    request_id: str
    expires_at: datetime | None
    resume_target: str
    clock: str = Field(description="what ends the wait: approval_expiry, question_expiry, backoff or reconciliation")
    ends_at: datetime | None = Field(description="when that clock ends the wait (none for reconciliation)")
    deadline_paused: bool = Field(description="the run's execution deadline does not run while it waits for a person")


class CancelOut(Schema):
    requested_at: datetime
    requested_by: str | None
    reason: str


class ErrorDetailOut(Schema):
    code: str
    detail: str


class StepOut(Schema):
    id: int
    index: int
    kind: str
    status: str
    started_at: datetime
    finished_at: datetime | None
    input_tokens: int
    output_tokens: int
    finish_reason: str
    discard_reason: str
    text: str = Field(description="what the model said in this step (streamed so far while running)")
    context_manifest: Any = Field(description="model steps: which history messages the call saw (`message_seq_ranges`: inclusive [first, last] seq ranges) and which summary")

    @staticmethod
    def resolve_text(step) -> str:
        return step.streamed_text


class AppliedEffectOut(Schema):
    tool_call: uuid.UUID
    tool: str
    arguments: Any
    result: Any
    idempotency_key: str | None
    finished_at: datetime | None


class EventOut(Schema):
    seq: int
    type: str
    payload: Any
    created_at: datetime


class RunAgentOut(Schema):
    slug: str
    version: int
    name: str
    instructions: str
    provider: str
    model: str
    tools: list[str]
    approval_rules: Any


class RunDetailOut(RunOut):
    agent: RunAgentOut | None = Field(description="the agent version the run was started with (and keeps): instructions, "
                                                  "tools, rules, model; null for a run without an agent")
    started_at: datetime | None
    updated_at: datetime
    created_by: str | None
    provider: str
    budgets: BudgetsOut
    wait: WaitOut | None = Field(description="what a waiting run waits for")
    cancel: CancelOut | None = Field(description="the cancel request, once made (the status changes only when it is safe)")
    error: ErrorDetailOut | None
    event_seq: int = Field(description="the latest event's seq: stream or page events from here")
    step_count: int
    can_cancel: bool
    can_retry: bool = Field(description="whether the caller may try this failed or cancelled run again")
    retry_of: uuid.UUID | None = Field(description="the run this one retries")
    retries: list[uuid.UUID] = Field(description="runs that retried this one, oldest first")
    steps: list[StepOut]
    tool_calls: list[ToolCallOut]
    approvals: list[ApprovalOut]
    applied_effects: list[AppliedEffectOut] = Field(description="writes that took effect downstream; never rolled back silently")
    recent_events: list[EventOut] = Field(description="the latest events, oldest first; page older ones with /events")


class EventPage(Schema):
    items: list[EventOut]
    next_after: int = Field(description="pass as ?after= to continue")
    run_status: RunStatus
    finished: bool = Field(description="the run is terminal and every event has been returned")


class CancelIn(BodyIn):
    reason: StorableText = Field("", max_length=300)


class RetryBudgetsIn(BodyIn):
    max_model_calls: int | None = Field(None, ge=1, le=1000)
    max_tokens: int | None = Field(None, ge=1, le=10_000_000)


class RetryIn(BodyIn):
    reason: StorableText = Field("", max_length=300, description="why; kept in the audit trail")
    budgets: RetryBudgetsIn | None = Field(None, description="limits of the new run; the old run's by default")


def run_detail_out(*, run, user) -> SimpleNamespace:
    detail = run_detail(run=run)
    out = {field: getattr(run, field) for field in (
        "id", "session_id", "status", "model_calls", "tokens_used", "cancel_requested_at", "created_at", "started_at",
        "finished_at", "updated_at", "provider", "event_seq", "step_count",
    )}
    out |= {
        "phase": run.phase or None,
        "wait_reason": run.wait_reason or None,
        "outcome": run.outcome or None,
        "error_code": run.error_code or None,
        "created_by": run.created_by.get_username() if run.created_by_id else None,
        "budgets": {field: getattr(run, field) for field in (
            "max_model_calls", "model_calls", "max_tokens", "tokens_used", "deadline", "model_retries")}
        | {"set_by": run.budgets_set_by.get_username() if run.budgets_set_by_id else None},
        "wait": _wait_out(run),
        "cancel": {"requested_at": run.cancel_requested_at, "reason": run.cancel_reason,
                   "requested_by": run.cancel_requested_by.get_username() if run.cancel_requested_by_id else None}
        if run.cancel_requested_at else None,
        "error": {"code": run.error_code, "detail": run.error_detail} if run.error_code else None,
        "can_cancel": access.can_cancel_run(user=user, run=run),
        "can_retry": access.can_retry_run(user=user, run=run),
        "agent": _agent_of(run),
        "retry_of": run.retry_of_id,
        "retries": list(run.retries.order_by("created_at").values_list("id", flat=True)),
        "steps": detail.steps,
        "tool_calls": detail.tool_calls,
        "approvals": detail.approvals,
        "applied_effects": detail.applied_effects,
        "recent_events": _as_seen_by(detail.recent_events, _customer_view(user, run)),
    }
    return SimpleNamespace(**out)


def _agent_of(run) -> dict | None:
    version = run_agent_version(run)
    if version is None:
        return None
    return {"slug": version.agent.slug, "version": version.number, "name": version.name, "instructions": version.instructions,
            "provider": version.provider, "model": version.model, "tools": list(version.tools),
            "approval_rules": version.approval_rules}


def _wait_out(run) -> dict | None:
    clock = run_wait_clock(run)
    if clock is None:
        return None
    return {"reason": run.wait_reason, "type": run.wait_type, "request_id": run.request_id, "expires_at": run.expires_at,
            "resume_target": run.resume_target, "clock": clock.clock, "ends_at": clock.ends_at,
            "deadline_paused": clock.deadline_paused}


def _customer_view(user, run) -> str | None:
    """The customer's username when `user` gets the customer's view of the run's events (their
    own session: operators' notes and evidence blanked); None for an operator's full view."""
    if access.reads_desk_notes(user=user, session_owner_id=run.session.owner_id):
        return None
    return run.session.owner.get_username()


def _as_seen_by(events, customer: str | None):
    if customer is None:
        return events
    return [SimpleNamespace(seq=e.seq, type=e.type, created_at=e.created_at,
                            payload=event_payload_for_customer(e.type, e.payload, customer_username=customer))
            for e in events]


def _visible_run(request, run_id):
    run = run_get(user=request.auth, run_id=run_id)
    if run is None:
        raise not_found("run")
    return run


# ---------------------------------------------------------------------------
# Endpoints
# ---------------------------------------------------------------------------

@router.get("", response={200: RunPage, **COMMON_ERRORS}, summary="List runs")
def runs_list(
    request,
    status: list[RunStatus] = Query(None, description="repeat for several"),
    phase: RunPhase | None = None,
    wait_reason: WaitReason | None = None,
    outcome: list[RunOutcome] = Query(None, description="ended runs by outcome; repeat for several "
                                                        "(`not_applied`, `rejected`, `expired`: the writes that did not happen)"),
    session: uuid.UUID | None = None,
    created_after: Timestamp | None = Query(None, description="inclusive, ISO 8601 (UTC if no offset)"),
    created_before: Timestamp | None = Query(None, description="exclusive"),
    cursor: str | None = Query(None, max_length=500),
    limit: int = Query(DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE),
):
    """Runs the caller may see, newest first. Filters combine; pages continue with `cursor`.
    `?outcome=not_applied&outcome=rejected&outcome=expired` finds the runs whose write did not happen."""
    items, next_cursor = run_list(
        user=request.auth, statuses=status, phase=phase, wait_reason=wait_reason, outcomes=outcome, session_id=session,
        created_after=created_after, created_before=created_before, cursor=cursor, limit=limit,
    )
    return {"items": items, "next_cursor": next_cursor}


@router.get("/{run_id}", response={200: RunDetailOut, **COMMON_ERRORS}, summary="Run detail")
def runs_get(request, run_id: uuid.UUID):
    """Status and phase, wait context, budgets and usage, the cancel request, the error, steps,
    tool calls, approvals, side effects already applied, and the latest events."""
    return run_detail_out(run=_visible_run(request, run_id), user=request.auth)


@router.get("/{run_id}/events", response={200: EventPage, **COMMON_ERRORS}, summary="Run events after a sequence number")
def runs_events(
    request,
    run_id: uuid.UUID,
    after: int = Query(0, ge=0, le=MAX_BIGINT, description="return events with seq > after"),
    limit: int = Query(100, ge=1, le=500),
):
    """The run's ordered, persisted event log, for polling or catching up after a reconnect."""
    run = _visible_run(request, run_id)
    events = run_event_list(run_id=run.pk, after_seq=after, limit=limit)
    next_after = events[-1].seq if events else after
    return {
        "items": _as_seen_by(events, _customer_view(request.auth, run)),
        "next_after": next_after,
        "run_status": run.status,
        "finished": run.is_terminal and next_after >= run.event_seq,
    }


@router.post("/{run_id}/cancel", response={202: RunOut, **COMMON_ERRORS, **errors(400, 403, 409)}, summary="Request cancellation")
def runs_cancel(request, run_id: uuid.UUID, payload: CancelIn | None = None):
    """Records the request (who, why). The run becomes `cancelled` once nothing is in flight;
    a write with an unknown outcome is reconciled first. 409 if the run already ended."""
    run = _visible_run(request, run_id)
    if not access.can_cancel_run(user=request.auth, run=run, even_if_ended=True):
        raise ApiError(403, "not_permitted", "You may not cancel this run.")
    run = run_cancel_request(run=run, acting_user=request.auth, reason=payload.reason if payload else "")
    run.refresh_from_db()
    return Status(202, run)


@router.post("/{run_id}/retry", response={201: RunOut, **COMMON_ERRORS, **errors(400, 403, 409)}, summary="Retry a run")
def runs_retry(request, run_id: uuid.UUID, payload: RetryIn | None = None):
    """Try a failed or cancelled run again from its last checkpoint, as a new run in the same
    session: it continues from the session's history, and a write the old run applied is reused
    (never made twice). 409 unless the run failed or was cancelled and the session is idle."""
    run = _visible_run(request, run_id)
    if not access.can_cancel_run(user=request.auth, run=run, even_if_ended=True):
        raise ApiError(403, "not_permitted", "You may not retry this run.")
    budgets = None
    if payload is not None and payload.budgets is not None:
        budgets = {key: value for key, value in payload.budgets.model_dump().items() if value is not None}
    retry = run_retry(run=run, acting_user=request.auth, budgets=budgets, reason=payload.reason if payload else "")
    return Status(201, retry)


# ---------------------------------------------------------------------------
# Server-Sent Events
# ---------------------------------------------------------------------------

def _sse_event(event) -> str:
    data = to_json({"seq": event.seq, "type": event.type, "payload": event.payload, "created_at": event.created_at},
                   fallback=str, inf_nan_mode="null").decode()
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n"


def _sse_end(status: str) -> str:
    return f'event: end\ndata: {{"status": "{status}"}}\n\n'


SSE_ACCESS_REVOKED = 'event: error\ndata: {"code": "access_revoked", "message": "You may no longer see this run."}\n\n'


def _still_allowed(request, run_id):
    """The stream's caller, checked again: the same key (not revoked, owner active) or the same
    browser session (not logged out, user active). Returns the run as they may see it now (its
    status and event_seq come with it), or None when they may no longer see it."""
    header = request.headers.get("Authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else None
    session_key = None if token else request.session.session_key
    user_id = request.auth.pk

    def check():
        if token:
            try:
                user = api_key_authenticate(token=token)
            except ApiKeyRevoked:
                return None
        else:
            if session_key is None or not request.session.exists(session_key):
                return None
            user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
        return run_get(user=user, run_id=run_id) if user is not None else None

    return check


class _StreamState:
    """What the stream has sent so far; shared by the sync and async generators."""

    def __init__(self, *, run_id, after: int, max_seconds: int, still_allowed=None, customer: str | None = None,
                 session_id=None):
        self.run_id = run_id
        self.session_id = session_id  # its group on the channel layer announces the run's events
        self.customer = customer  # the customer's view of the payloads (see _customer_view)
        self.after = after
        now = time.monotonic()
        self.deadline = now + max_seconds
        self.last_sent = now
        self.last_read = now
        self.still_allowed = still_allowed
        self.next_check = now + SSE_RECHECK_SECONDS if still_allowed is not None else math.inf
        self.allowed = True

    def recheck_if_due(self):  # database work: called where _poll runs
        """The run as the re-check read it, when one was due and the caller may still see it."""
        if time.monotonic() < self.next_check:
            return None
        run = self.still_allowed()
        self.allowed = run is not None
        self.next_check = time.monotonic() + SSE_RECHECK_SECONDS
        return run

    def step(self, events, finished: bool, status: str) -> tuple[list[str], bool]:
        """Frames to send for one poll, and whether the stream ends after them."""
        if not self.allowed:
            return [SSE_ACCESS_REVOKED], True
        frames = [_sse_event(event) for event in _as_seen_by(events, self.customer)]
        if events:
            self.after = events[-1].seq
            self.last_sent = time.monotonic()
        if finished:
            return [*frames, _sse_end(status)], True
        if time.monotonic() >= self.deadline:
            return frames, True
        if not frames and time.monotonic() - self.last_sent >= SSE_KEEPALIVE_SECONDS:
            self.last_sent = time.monotonic()
            frames.append(": keepalive\n\n")
        return frames, False


def _poll(state: _StreamState):
    seen = state.recheck_if_due()
    if not state.allowed:
        return [], "", False
    if seen is not None and seen.event_seq <= state.after and not seen.is_terminal:
        return [], seen.status, False  # the re-check read the run: nothing new, no second query
    return run_event_poll(run_id=state.run_id, after_seq=state.after, limit=SSE_BATCH)


def _sse_sync(state: _StreamState):
    liveness.gauge_add("sse_clients", 1)
    try:
        yield from _sse_sync_frames(state)
    finally:
        liveness.gauge_add("sse_clients", -1)


def _sse_sync_frames(state: _StreamState):
    yield "retry: 2000\n\n"
    while True:
        events, status, finished = _poll(state)
        frames, done = state.step(events, finished, status)
        yield from frames
        if done:
            return
        if len(events) < SSE_BATCH:
            time.sleep(SSE_POLL_SECONDS)


def _poll_and_release(state: _StreamState):
    """Under ASGI: between polls a stream holds no database connection (the web process's pool
    is shared by every request and stream)."""
    try:
        return _poll(state)
    finally:
        for conn in connections.all(initialized_only=True):
            if not conn.in_atomic_block:  # a test's transaction holds its data: leave it be
                conn.close_if_unusable_or_obsolete()


class _Doorbell:
    """An async stream's seat in its session's group on the channel layer (runs_app.live: the
    database is the truth, the layer a doorbell). `news` is set when a doorbell of the run
    announces events after what was sent, and when the seat comes into use or fails. It is
    `live` once a message came back through the layer: every commit after that is announced to
    us, so one more read and doorbells cover the rest — the console's join-then-read, made safe
    for channels_postgres, which drops what reaches a channel before its first receive()."""

    def __init__(self, state: _StreamState):
        self.state = state
        self.run_id = str(state.run_id)
        self.group = session_group(state.session_id)
        self.live = False
        self.news = asyncio.Event()
        self._layer = None
        self._channel = None
        self._joined = False  # group_add was sent: leave the group at the end
        self._listening: asyncio.Task | None = None

    def open(self) -> None:
        if self.state.session_id is None:
            return
        try:
            self._layer = get_channel_layer()
        except Exception:  # noqa: BLE001 - a broken layer setting: the stream polls instead
            logger.warning("event stream of run %s: the channel layer cannot be built; polling", self.run_id, exc_info=True)
            return
        if self._layer is not None:
            self._listening = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        layer = self._layer
        try:
            self._channel = await layer.new_channel()
            self._joined = True
            await layer.group_add(self.group, self._channel)
            # One receive() for the seat's life: a cancelled one unsubscribes the channel for good
            # on channels_redis's pub/sub layer, so it is waited on, never timed out.
            receiving = asyncio.ensure_future(layer.receive(self._channel))
            try:
                for attempt in range(SSE_DOORBELL_PROBES):
                    await layer.send(self._channel, {"type": "sse.probe"})
                    done, _ = await asyncio.wait({receiving}, timeout=SSE_DOORBELL_PROBE_SECONDS * 2**attempt)
                    if done:
                        break
                else:
                    raise TimeoutError("nothing came back through the channel layer")
            except BaseException:
                receiving.cancel()
                raise
            message = receiving.result()
            self.live = True
            self.news.set()
            while True:
                self._take(message)
                message = await layer.receive(self._channel)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the stream goes on polling (SSE_POLL_WITHOUT_LAYER_SECONDS)
            logger.warning("event stream of run %s: no doorbell from the channel layer; polling", self.run_id, exc_info=True)
            self.live = False
            self.news.set()

    def _take(self, message: dict) -> None:
        # Deltas (run.delta) and other runs' doorbells are not this stream's news.
        if message.get("type") == "run.events" and message.get("run_id") == self.run_id:
            if max((event.get("seq", 0) for event in message.get("events", ())), default=0) > self.state.after:
                self.news.set()

    async def close(self) -> None:
        """Leaves the group. Runs when the stream ends, and when its client went away: daphne
        then sends http.disconnect, and Django cancels the response's task, inside this stream."""
        if self._listening is not None:
            self._listening.cancel()
            await asyncio.wait({self._listening})
        if self._joined:
            try:
                await asyncio.wait_for(self._layer.group_discard(self.group, self._channel), PUBLISH_TIMEOUT_SECONDS)
            except Exception:  # noqa: BLE001 - the stream is over either way
                logger.warning("event stream of run %s: could not leave %s", self.run_id, self.group, exc_info=True)


async def _sse_async(state: _StreamState):
    """Under ASGI: between reads the stream waits for its run's doorbell (_Doorbell), a keepalive
    or the idle read; without a channel layer it polls. While it waits it runs nothing in a
    thread and holds no database connection (the thread Django gives the sync view's request
    stays, idle, until the response ends)."""
    liveness.gauge_add("sse_clients", 1)  # a connected client, for warden_live_clients
    doorbell = _Doorbell(state)
    try:
        yield "retry: 2000\n\n"
        doorbell.open()
        read = sync_to_async(_poll_and_release)
        while True:
            doorbell.news.clear()  # this read covers every doorbell rung so far
            events, status, finished = await read(state)
            state.last_read = time.monotonic()
            frames, done = state.step(events, finished, status)
            for frame in frames:
                yield frame
            if done:
                return
            if len(events) == SSE_BATCH:
                continue
            while not await _sse_wait(state, doorbell):  # time for a keepalive, not a read
                if time.monotonic() >= state.deadline:
                    return
                state.last_sent = time.monotonic()
                yield ": keepalive\n\n"
    finally:
        await doorbell.close()
        liveness.gauge_add("sse_clients", -1)


async def _sse_wait(state: _StreamState, doorbell: _Doorbell) -> bool:
    """Waits until a read is due (True): a doorbell, the re-check or the idle read — or, without
    a live doorbell, the next poll; or until a keepalive or the deadline is (False)."""
    if doorbell.live:
        read_at = min(state.last_read + SSE_IDLE_READ_KEEPALIVES * SSE_KEEPALIVE_SECONDS, state.next_check)
    else:
        read_at = state.last_read + SSE_POLL_WITHOUT_LAYER_SECONDS
    timeout = min(read_at, state.last_sent + SSE_KEEPALIVE_SECONDS, state.deadline) - time.monotonic()
    if doorbell.news.is_set():
        return True
    if timeout > 0:
        try:
            await asyncio.wait_for(doorbell.news.wait(), timeout)
            return True
        except TimeoutError:
            pass
    return time.monotonic() >= read_at


SSE_RESPONSE = {
    "200": {
        "description": (
            "`text/event-stream`: one event per RunEvent (`id:` its seq, `event:` its type, `data:` JSON "
            "{seq, type, payload, created_at}); `: keepalive` comments while quiet; a final `event: end` "
            "when the run is terminal and everything was sent. Reconnect with `Last-Event-ID`. The caller's "
            "access is checked again every 30 seconds: a revoked key, a logout or a lost permission ends "
            "the stream with `event: error` (`{\"code\": \"access_revoked\"}`)."
        ),
        # OpenAPI 3.1 convention for event streams: the schema describes one event.
        "content": {"text/event-stream": {"schema": {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "id": {"type": "string", "pattern": "^[0-9]+$", "description": "the event's seq: send it back as Last-Event-ID"},
                "event": {"type": "string", "description": "the RunEvent type (run_status, tool_call, approval_requested, …), `end` or `error`"},
                "data": {"type": "string", "contentMediaType": "application/json",
                         "description": "JSON: {seq, type, payload, created_at}; for `end`: {status}"},
                "retry": {"type": "integer", "description": "reconnection delay in milliseconds"},
            },
        }}},
    }
}


@router.get(
    "/{run_id}/events/stream",
    response=COMMON_ERRORS,
    summary="Live event stream (Server-Sent Events)",
    openapi_extra={"responses": SSE_RESPONSE},
)
def runs_events_stream(
    request,
    run_id: uuid.UUID,
    after: int = Query(0, ge=0, le=MAX_BIGINT, description="start after this seq (Last-Event-ID wins if both are sent)"),
    last_event_id: int | None = Header(None, alias="Last-Event-ID", ge=0, le=MAX_BIGINT),
    max_seconds: int = Query(300, ge=1, le=3600, description="end the stream after this long; reconnect to continue"),
):
    """Streams the run's events as they are committed, catching up from `after` /
    `Last-Event-ID` first. Ends when the run is terminal and all events were sent."""
    run = _visible_run(request, run_id)
    state = _StreamState(run_id=run.pk, after=last_event_id if last_event_id is not None else after, max_seconds=max_seconds,
                         still_allowed=_still_allowed(request, run.pk), customer=_customer_view(request.auth, run),
                         session_id=run.session_id)
    # Under ASGI (daphne) the body must be an async iterator, or Django would buffer the
    # whole stream before sending it; under WSGI and the test client a plain generator.
    content = _sse_async(state) if isinstance(request, ASGIRequest) else _sse_sync(state)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


# ---------------------------------------------------------------------------
# Agents (docs/EXTENDING.md)
# ---------------------------------------------------------------------------

agents_router = Router(tags=["agents"])


class AgentVersionOut(Schema):
    number: int
    name: str
    instructions: str
    provider: str
    model: str
    provider_options: Any
    tools: list[str]
    budgets: Any = Field(description="defaults of a run's budgets: max_model_calls, max_tokens, deadline_seconds")
    budget_limits: Any = Field(description="the most a request may ask for (beside the deployment's caps)")
    approval_rules: Any = Field(description='{"<write tool>": [{"when": "amount <= 20", "approval": "none|user|operator", '
                                            '"approvers": N}, …]}: first match wins')
    interjection_classifier: str
    created_by: str | None
    created_at: datetime

    @staticmethod
    def resolve_created_by(version) -> str | None:
        return version.created_by.get_username() if version.created_by_id else None


class AgentOut(Schema):
    slug: str
    name: str
    version: AgentVersionOut = Field(description="the current version: what the next run uses")
    versions: list[int] = Field(description="every version's number, newest first")

    @staticmethod
    def resolve_version(agent):
        return agent.current_version

    @staticmethod
    def resolve_versions(agent) -> list[int]:
        return list(agent.versions.order_by("-number").values_list("number", flat=True))


def _storable_json(value: dict) -> dict:
    # PostgreSQL's jsonb cannot hold \u0000: refused here (422), not by the database (500).
    if "\\u0000" in json.dumps(value):
        raise ValueError("must not contain NUL characters")
    return value


class AgentIn(BodyIn):
    """An agent's whole definition; saving it makes a new version (runs under way keep theirs)."""

    model_config = ConfigDict(extra="forbid")

    slug: StorableText | None = Field(None, max_length=64, description="on create; derived from the name if left out")
    name: StorableText = Field(max_length=100)
    instructions: StorableText = Field(max_length=20_000)
    provider: StorableText | None = Field(None, max_length=32,
                                          description="a name in WARDEN_PROVIDERS; default WARDEN_MODEL_PROVIDER")
    model: StorableText = Field("", max_length=100)
    provider_options: Annotated[dict, AfterValidator(_storable_json)] = Field(default_factory=dict)
    tools: list[str] = Field(default_factory=list, description="registered tool names (WARDEN_TOOL_MODULES)")
    budgets: dict = Field(default_factory=dict)
    budget_limits: dict = Field(default_factory=dict)
    approval_rules: dict = Field(default_factory=dict)
    interjection_classifier: str = Field("model", description="`model` or `keywords`")


def _visible_agent(request, slug: str):
    agent = agent_get(user=request.auth, slug=slug)
    if agent is None:
        raise not_found("agent")
    return agent


def _definition_refused(error: AgentDefinitionInvalid) -> ApiError:
    fields = [{"field": f"body.{field}", "message": message, "type": "invalid_agent"} for field, message in error.errors.items()]
    return ApiError(422, "invalid_agent", f"The agent definition was refused, nothing was saved: {error}", fields)


def _agent_save_or_refuse(request, payload: AgentIn, agent=None):
    if not access.can_manage_agents(user=request.auth):
        raise ApiError(403, "not_permitted", "Defining agents needs the runs_app.change_agent permission.")
    try:
        version = agent_save(definition=payload.model_dump(), acting_user=request.auth, agent=agent)
    except AgentDefinitionInvalid as error:
        raise _definition_refused(error) from None
    return _visible_agent(request, version.agent.slug)


@agents_router.get("", response={200: list[AgentOut], **errors(401, 429)}, summary="List agents")
def agents_list(request):
    """The deployment's agents, to pick one for a new session (`POST /sessions {"agent": slug}`)."""
    return agent_list(user=request.auth)


@agents_router.get("/{slug}", response={200: AgentOut, **COMMON_ERRORS}, summary="Agent detail")
def agents_get(request, slug: str):
    return _visible_agent(request, slug)


@agents_router.post("", response={201: AgentOut, **COMMON_ERRORS, **errors(400, 403)}, summary="Define an agent")
def agents_create(request, payload: AgentIn):
    """Needs runs_app.change_agent. A definition naming an unknown tool or provider, rules that do
    not parse or a rule earlier rules already cover is refused (422 `invalid_agent`, `fields`
    naming each), and nothing is saved."""
    return Status(201, _agent_save_or_refuse(request, payload))


@agents_router.put("/{slug}", response={200: AgentOut, **COMMON_ERRORS, **errors(400, 403)}, summary="Save a new version")
def agents_update(request, slug: str, payload: AgentIn):
    """The whole definition again: a new version, used by the agent's next runs; runs under way
    (and waiting ones) keep the version they started with."""
    return _agent_save_or_refuse(request, payload, agent=_visible_agent(request, slug))
