"""Runs over HTTP: list (filters, keyset pages), detail, event log, live event stream (SSE; its
transport is api/streams.py), cancel and retry. Reads come from the selectors, of what the access
policy lets the caller see; the writes go through the engine's actions."""

import uuid
from datetime import datetime
from types import SimpleNamespace
from typing import Annotated

from ninja import Field, Header, Query, Router, Schema, Status
from pydantic import BaseModel, BeforeValidator, ConfigDict

from config.pagination import CURSOR_PATTERN
from config.errors import CommonRefusal, WardenError
from api.errors import not_found
from access import policy as access
from agents.selectors import agent_versions_of, run_agent_version
from api import streams
from api.approvals import ApprovalOut
from api.base import (
    BodyIn, COMMON_ERRORS, DEFAULT_PAGE_SIZE, MAX_BIGINT, MAX_PAGE_SIZE, ShownJSON, StorableText, Timestamp, errors,
)
from api.tool_calls import ToolCallOut
from approvals_app.selectors import approvals_of_run
from engine.actions.cancel import run_cancel_request
from engine.actions.runs import run_fork, run_retry
from config.fair_share import session_turn
from runs_app.models import RunOutcome, RunPhase, RunStatus, WaitReason
from runs_app.selectors import run_event_list, run_get, run_list, run_recent_events, run_steps, run_wait_clock
from tools_app.selectors import (
    SEARCH_LIMIT, applied_effects, applied_writes_column, money_moved, run_ids_matching, runs_calling, tool_calls_of_run,
)

router = Router(tags=["runs"])

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


class MoneyOut(BaseModel):
    amount: str = Field(description="a decimal number, as the tool's arguments gave it: \"9.00\"")
    currency: str | None = Field(description="as the tool declares it (ISO 4217: EUR); null: it declares none")


class RunListItem(RunOut):
    title: str = Field(description="the session's title")
    agent: str | None = Field(description="the slug of the agent the run was started with; null: before agents")
    money_moved: list[MoneyOut] = Field(
        description="what the run's writes that took effect moved, summed per currency (the amounts their tools "
                    "declare; the run detail's applied_effects lists them); [] when none moved money")


class RunPage(Schema):
    items: list[RunListItem]
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
    endpoint: str = Field(description="model steps: the model endpoint the call went to, by name — the agent's "
                                      "fallback when its own failed (empty: the deployment's default endpoint)")
    model: str = Field(description="model steps: the model that endpoint was asked for")
    cost: str | None = Field(description="model steps: what the call cost from that model's prices per million "
                                         "prompt and answer tokens, a decimal in WARDEN_COST_CURRENCY; null: no "
                                         "usage reported or no prices known")
    text: str = Field(description="what the model said in this step (streamed so far while running)")
    context_manifest: ShownJSON = Field(description="model steps: which history messages the call saw (`message_seq_ranges`: inclusive [first, last] seq ranges) and which summary")

    @staticmethod
    def resolve_text(step) -> str:
        return step.streamed_text

    @staticmethod
    def resolve_cost(step) -> str | None:
        return None if step.cost is None else str(step.cost)


class AppliedEffectOut(Schema):
    tool_call: uuid.UUID
    tool: str
    arguments: ShownJSON
    result: ShownJSON
    idempotency_key: str | None
    finished_at: datetime | None


class EventOut(Schema):
    seq: int
    type: str
    payload: ShownJSON
    created_at: datetime


class RunAgentOut(Schema):
    slug: str
    version: int
    name: str
    instructions: str
    provider: str
    model: str
    tools: list[str]
    approval_rules: ShownJSON
    write_caps: ShownJSON = Field(description="writes a model turn and a run may make ({} : the deployment's defaults)")
    limits: ShownJSON = Field(description="cumulative limits per write tool (docs/EXTENDING.md, \"Limits\")")


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
    can_fork: bool = Field(description="whether the caller may fork this ended run")
    forked_from: uuid.UUID | None = Field(description="the run this one forks (in another session)")
    forks: list[uuid.UUID] = Field(description="runs that forked this one, oldest first")
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
        "can_fork": access.can_fork_run(user=user, run=run),
        "forked_from": run.forked_from_id,
        "forks": list(run.forks.order_by("created_at").values_list("id", flat=True)),
        # Everything about the run, in a fixed number of queries.
        "steps": run_steps(run_id=run.pk),
        "tool_calls": tool_calls_of_run(run_id=run.pk),
        "approvals": approvals_of_run(run_id=run.pk),
        "applied_effects": applied_effects(run_id=run.pk),
        "recent_events": streams.as_seen_by(run_recent_events(run_id=run.pk), _customer_view(user, run)),
    }
    return SimpleNamespace(**out)


def _agent_of(run) -> dict | None:
    version = run_agent_version(run)
    if version is None:
        return None
    return {"slug": version.agent.slug, "version": version.number, "name": version.name, "instructions": version.instructions,
            "provider": version.provider, "model": version.model, "tools": list(version.tools),
            "approval_rules": version.approval_rules, "write_caps": version.write_caps, "limits": version.limits}


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


def _visible_run(request, run_id):
    run = run_get(runs=access.visible_runs(user=request.auth), run_id=run_id)
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
    q: StorableText | None = Query(None, min_length=1, max_length=200, description=(
        "what the desk's search finds: a business reference or key, an order number or any other tool argument's "
        "value, an idempotency key, a customer, a session's title, a run, session or tool call id (exact values; "
        f"at most {SEARCH_LIMIT} runs match)")),
    agent: str | None = Query(None, max_length=64, description="runs of this agent (its slug; GET /agents)"),
    tool: str | None = Query(None, max_length=100, description="runs that called this tool (read or write)"),
    created_after: Timestamp | None = Query(None, description="inclusive, ISO 8601 (UTC if no offset)"),
    created_before: Timestamp | None = Query(None, description="exclusive"),
    cursor: str | None = Query(None, max_length=60, pattern=CURSOR_PATTERN,
                                 description="`next_cursor` of the page before"),
    limit: int = Query(DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE),
):
    """Runs the caller may see, newest first. Filters combine; pages continue with `cursor`.
    `?outcome=not_applied&outcome=rejected&outcome=expired` finds the runs whose write did not happen;
    `?q=9527` the runs about order 9527, as the desk's search box does."""
    runs = access.visible_runs(user=request.auth)
    if q is not None:
        runs = runs.filter(pk__in=run_ids_matching(term=q))
    if agent is not None:
        runs = runs.filter(agent_version__in=agent_versions_of(slug=agent))
    if tool is not None:
        runs = runs.filter(pk__in=runs_calling(tool_name=tool))
    items, next_cursor = run_list(
        runs=runs, by_owner=access.runs_by_owner(request.auth), statuses=status,
        phase=phase, wait_reason=wait_reason, outcomes=outcome, session_id=session, created_after=created_after,
        created_before=created_before, cursor=cursor, limit=limit, columns={"applied_writes": applied_writes_column()},
    )
    for item in items:
        item["money_moved"] = money_moved(item.pop("applied_writes"))
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
        "items": streams.as_seen_by(events, _customer_view(request.auth, run)),
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
        raise WardenError(CommonRefusal.NOT_PERMITTED, "You may not cancel this run.")
    with session_turn(run.session_id):
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
        raise WardenError(CommonRefusal.NOT_PERMITTED, "You may not retry this run.")
    budgets = None
    if payload is not None and payload.budgets is not None:
        budgets = {key: value for key, value in payload.budgets.model_dump().items() if value is not None}
    with session_turn(run.session_id):
        retry = run_retry(run=run, acting_user=request.auth, budgets=budgets, reason=payload.reason if payload else "")
    return Status(201, retry)


class ForkIn(BodyIn):
    reason: StorableText = Field("", max_length=300, description="why; kept in the audit trail")


@router.post("/{run_id}/fork", response={201: RunOut, **COMMON_ERRORS, **errors(403, 409)}, summary="Fork a run")
def runs_fork(request, run_id: uuid.UUID, payload: ForkIn | None = None):
    """Run an ended run's conversation again from the customer's message that started it, as a new
    run in a new session of the same customer (its `session_id`), with the run's agent version and
    budgets. Business keys are the deployment's: a write the old run — or anyone — already asked for
    is answered with that outcome, never made again. 409 while the run is active."""
    run = _visible_run(request, run_id)
    if not access.can_cancel_run(user=request.auth, run=run, even_if_ended=True):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "You may not fork this run.")
    fork = run_fork(run=run, acting_user=request.auth, reason=payload.reason if payload else "")
    return Status(201, fork)


# ---------------------------------------------------------------------------
# The live event stream (the transport: api/streams.py)
# ---------------------------------------------------------------------------

def _still_allowed(request, run_id):
    """Returns the run as the stream's caller may see it now (its status and event_seq come with
    it), or None when they may no longer see it."""
    caller = streams.caller_again(request)

    def check():
        user = caller()
        return run_get(runs=access.visible_runs(user=user), run_id=run_id) if user is not None else None

    return check


SSE_RESPONSE = streams.sse_response(
    description=(
        "`text/event-stream`: one event per RunEvent (`id:` its seq, `event:` its type, `data:` JSON "
        "{seq, type, payload, created_at}); `: keepalive` comments while quiet; a final `event: end` "
        "when the run is terminal and everything was sent. Reconnect with `Last-Event-ID`. The caller's "
        "access is checked again every 30 seconds: a revoked key, a logout or a lost permission ends "
        "the stream with `event: error` (`{\"code\": \"access_revoked\"}`)."
    ),
    id_pattern="^[0-9]+$", id_meaning="the event's seq: send it back as Last-Event-ID",
    events="the RunEvent type (run_status, tool_call, approval_requested, …), `end` or `error`",
    data="JSON: {seq, type, payload, created_at}; for `end`: {status}",
)


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
    # `int`, not `int | None`: a header is a digit string or absent (the schema promised "null").
    last_event_id: int = Header(None, alias="Last-Event-ID", ge=0, le=MAX_BIGINT),
    max_seconds: int = Query(300, ge=1, le=3600, description="end the stream after this long; reconnect to continue"),
):
    """Streams the run's events as they are committed, catching up from `after` /
    `Last-Event-ID` first. Ends when the run is terminal and all events were sent."""
    run = _visible_run(request, run_id)
    return streams.event_stream_response(
        feed=streams.RunFeed(run=run, customer=_customer_view(request.auth, run)),
        after=last_event_id if last_event_id is not None else after, max_seconds=max_seconds,
        still_allowed=_still_allowed(request, run.pk), request=request,
    )
