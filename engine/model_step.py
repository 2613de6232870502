"""One model call: start the step, stream, validate, and commit the outcome (SPEC §3, §11)."""

import json
import logging
import random
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from config.logs import log_context
from config.storable import json_problem
from config.tracing import span, span_set
from engine import state
from engine.actions.runs import run_end
from engine.checkpoint import Checkpoint, RunFailure, StopDriving, model_calls_used
from engine.context import BuiltContext, CachedContext, context_build, context_from_cache
from engine.faults import fault_point
from engine.interjections import inputs_at_safe_point
from engine.lease import RunBeat, connection_give_back
from engine.model_route import FALLBACK, PRIMARY, Route, route_read
from engine.state import Lease, run_phase_enter, run_phase_values, run_transition, run_write, step_create, step_discard, step_transition
from engine.tool_exec import tool_call_rows, tool_calls_create
from runs_app.events import RunEventType
from runs_app.live import step_deltas
from runs_app.models import Run, RunErrorCode, RunPhase, RunStatus, Step, StepKind, StepStatus, WaitReason
from agents.selectors import run_agent_version, run_offered_tools
from runs_app.providers.base import (
    Finish,
    ModelRequest,
    PermanentModelError,
    TextDelta,
    ToolCallDelta,
    TransientModelError,
    Usage,
)
from runs_app.transitions import LeaseLost
from sessions_app.models import Message, MessageRole
from sessions_app.services import messages_append
from tools_app.registry import ASK_USER, tool_get, tool_schemas
from tools_app.services import tool_call_event

logger = logging.getLogger("warden.engine")

@dataclass
class ProposedCall:
    index: int
    id: str = ""
    name: str = ""
    arguments_text: str = ""
    arguments: dict | None = None


@dataclass
class StreamResult:
    text: str = ""
    calls: dict[int, ProposedCall] = field(default_factory=dict)
    finish_reason: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    aborted: str = ""  # "cancel" when the stream was cut short on purpose
    # Which endpoint and model the call went to, and what it cost (Route.answered_by): the step's record.
    endpoint: str = ""
    model: str = ""
    cost: Decimal | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def delivered(self) -> bool:
        """Whether the server sent anything of an answer (then a failure is not retried elsewhere)."""
        return bool(self.text or self.calls or self.tokens)

    def answered_by(self) -> dict:
        return {"endpoint": self.endpoint, "model": self.model, "cost": self.cost}


class _StreamBroken(Exception):
    """A provider error mid-stream, with what the stream had delivered (its tokens count)."""

    def __init__(self, error: Exception, result: StreamResult):
        super().__init__(str(error))
        self.error = error
        self.result = result


def output_token_limit(run: Run) -> int:
    """The max_tokens the next model call asks for: the run's (grown after a length cut), else
    the run's provider options', else the setting."""
    return run.max_output_tokens or int((run.provider_options or {}).get("max_tokens") or settings.WARDEN_MODEL_MAX_OUTPUT_TOKENS)


def _budget_check(run: Run) -> None:
    if model_calls_used(run) >= run.max_model_calls:
        raise RunFailure(RunErrorCode.MODEL_CALL_BUDGET, f"used all {run.max_model_calls} model calls")
    if run.tokens_used >= run.max_tokens:
        raise RunFailure(RunErrorCode.TOKEN_BUDGET, f"used {run.tokens_used} of {run.max_tokens} tokens")


def model_step_open(*, run: Run, lease: Lease, close_tools_step: Step | None = None) -> Step:
    """Start a model step: phase calling_model, one more model call counted (before the call,
    so a run that crashes its worker mid-call still runs out of budget). A tools step whose
    last call was closed elsewhere (a decision, a reconciliation) is completed with it."""
    index = run.step_count
    counted = {"model_calls": run.model_calls + 1, "step_count": index + 1}
    started = (RunEventType.STEP_STARTED, {"step": index, "kind": StepKind.MODEL})
    if close_tools_step is None:
        phase, phase_events = run_phase_values(run=run, phase=RunPhase.CALLING_MODEL, announce_unchanged=True)
        step = state.model_step_opened(run=run, lease=lease, changes={**phase, **counted}, events=[started, *phase_events])
        if step is not None:
            return step  # one statement, the run's fields updated (engine/state/fast.py)
    with transaction.atomic():
        if close_tools_step is not None:
            step_transition(step=close_tools_step, to=StepStatus.COMPLETED, lease_token=lease.token)
        # What this write leaves the run at: a one-statement commit of the turn checks it is still so.
        run_phase_enter(run=run, phase=RunPhase.CALLING_MODEL, lease_token=lease.token, events_before=[started],
                        changes=counted, announce_unchanged=True)
        step = step_create(run_id=run.id, index=index, kind=StepKind.MODEL, lease_token=lease.token)
    run.model_calls += 1
    run.step_count += 1
    return step


def model_step_discard(*, cp: Checkpoint, lease: Lease, reason: str, step: Step | None = None,
                       result: StreamResult | None = None, manifest: dict | None = None,
                       changes: dict | None = None) -> None:
    """Throw a model step's output away. Whatever tokens the server reported for it are charged
    all the same: rejected output is paid for."""
    step = step or cp.latest_step
    run = cp.run
    tokens = result.tokens if result is not None else 0
    values = dict(changes or {})
    if tokens:
        values["tokens_used"] = run.tokens_used + tokens
    with transaction.atomic():
        discarded = step_discard(
            step=step, reason=reason, lease_token=lease.token,
            **({"input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
                "finish_reason": result.finish_reason[:32], "streamed_text": result.text, **result.answered_by()}
               if result is not None else {}),
            **({"context_manifest": manifest} if manifest is not None else {}),
        )
        run_write(run_id=run.id, changes=values, events=[discarded], lease_token=lease.token)
    for field_name, value in values.items():
        setattr(run, field_name, value)


def model_turn(*, cp: Checkpoint, lease: Lease, heartbeat: RunBeat) -> str | None:
    run = cp.run
    step = cp.latest_step
    # The call before this one failed with a transient error: this is its retry (engine/model_route.py).
    retrying = step is not None and step.kind == StepKind.MODEL and step.status == StepStatus.FAILED
    own_open_step = (
        step is not None and step.kind == StepKind.MODEL and step.status == StepStatus.RUNNING and step.lease_token == lease.token
    )
    if inputs_at_safe_point(run=run, lease=lease, before="model"):
        return None  # input applied or a cancel requested: re-read the checkpoint
    if not own_open_step:
        _budget_check(run)
        step = model_step_open(run=run, lease=lease, close_tools_step=cp.tools_step)
    version = run_agent_version(run)
    offered = run_offered_tools(run)
    try:
        # The run's model endpoints as they stand now (a rotated key applies to this call), read while
        # this thread still holds its database connection.
        try:
            route = route_read(run)
        except PermanentModelError as error:
            raise _StreamBroken(error, StreamResult()) from error
        endpoint = route.endpoint
        built = _context(run=run, lease=lease, route=route,
                         instructions=version.instructions if version is not None else None, cached=cp.context)
        tools = tool_schemas(offered)
        # What the model was shown, beside what it saw of the history: its agent version and tools.
        built.manifest |= {"tools": [t["function"]["name"] for t in tools],
                           "agent_version": version.pk if version is not None else None}
        request = ModelRequest(
            messages=built.messages,
            tools=tools,
            run_id=str(run.id),
            call_index=run.model_calls - 1,
            options=run.provider_options or {},
            max_output_tokens=output_token_limit(run),
        )
        with log_context(step=step.index), span(
            "model.call", run_id=run.id, session_id=run.session_id, step=step.index, step_id=step.pk,
            lease_token=lease.token, provider=run.provider, model_call=run.model_calls,
            endpoint=endpoint.name if endpoint is not None else None,
        ) as current:
            result = _ask(route=route, request=request, run=run, step=step, heartbeat=heartbeat, retrying=retrying)
            span_set(current, finish_reason=result.finish_reason, input_tokens=result.input_tokens,
                     output_tokens=result.output_tokens, tool_calls=len(result.calls), aborted=result.aborted or None,
                     answered_by=result.endpoint or None, model=result.model or None)
    except _StreamBroken as broken:
        if isinstance(broken.error, PermanentModelError):
            _step_close(step=step, lease=lease, status=StepStatus.FAILED, reason=f"model error: {broken.error}",
                        result=broken.result, run=run)
            raise RunFailure(RunErrorCode.MODEL_ERROR, f"{broken.error} (status {broken.error.status})") from broken.error
        return _backoff(run=run, lease=lease, step=step, error=broken.error, result=broken.result)
    if result.aborted:
        model_step_discard(cp=cp, lease=lease, reason=f"stream aborted: {result.aborted}", step=step, result=result,
                           manifest=built.manifest)
        return None
    problem = _validate(result, offered=offered, version=version)
    if problem:
        return _rejected(cp=cp, lease=lease, step=step, result=result, problem=problem, manifest=built.manifest,
                         limit=request.max_output_tokens)
    cp.context = built.cacheable
    return _commit_turn(run=run, lease=lease, step=step, result=result, manifest=built.manifest, cp=cp)


def _context(*, run: Run, lease: Lease, route: Route, instructions: str | None,
             cached: CachedContext | None = None) -> BuiltContext:
    """The context for the next call, for the window of the run's models (engine/model_route.py):
    the one this worker built last, extended by its own commits since, while the whole history
    still fits that window (`cached`); else read and built. Summarizing an outgrown history is
    itself a model call: when it fails, the turn takes the same way as a broken stream (a transient
    error backs off and is asked again, a permanent one fails the run), never the loop's internal
    error."""
    window = route.window_tokens(output_limit=output_token_limit(run))
    if (cached is not None and cached.session_id == run.session_id
            and cached.manifest.get("window_tokens") == (window or settings.WARDEN_CONTEXT_TOKENS)):
        return context_from_cache(cached)
    try:
        built = context_build(session_id=run.session_id, provider=route.summarizer(), instructions=instructions,
                              window_tokens=window)
    except (TransientModelError, PermanentModelError) as error:
        raise _StreamBroken(error, StreamResult()) from error
    if built.summary_tokens:
        _charge(run=run, lease=lease, tokens=built.summary_tokens)
    return built


def _charge(*, run: Run, lease: Lease, tokens: int) -> None:
    with transaction.atomic():
        run_write(run_id=run.id, changes={"tokens_used": run.tokens_used + tokens}, lease_token=lease.token)
    run.tokens_used += tokens


def _rejected(*, cp: Checkpoint, lease: Lease, step: Step, result: StreamResult, problem: str, manifest: dict,
              limit: int) -> str | None:
    """The output must not be acted on (SPEC §3): discard it (its tokens charged) and ask again —
    with a larger output limit after a length cut, at once the first time, after a growing
    backoff when rejections repeat — or fail early: the same rejection twice in a row, too many
    in a row, a length cut at the largest limit, or no model calls left."""
    run = cp.run
    rejections = run.invalid_outputs + 1
    changes: dict = {"invalid_outputs": rejections}
    repeated = step.index > 0 and Step.objects.filter(
        run_id=run.id, index__lt=step.index, kind=StepKind.MODEL).order_by("-index").values_list(
        "discard_reason", flat=True).first() == problem[:300]
    if result.finish_reason == "length":
        ceiling = settings.WARDEN_MODEL_MAX_OUTPUT_TOKENS_CEILING
        if limit >= ceiling:
            model_step_discard(cp=cp, lease=lease, reason=problem, step=step, result=result, manifest=manifest)
            raise RunFailure(RunErrorCode.OUTPUT_TRUNCATED,
                             f"the model's answer did not fit in {limit} output tokens (the largest limit allowed)")
        changes["max_output_tokens"] = min(limit * 2, ceiling)
        repeated = False  # asked again with a larger limit: not the same request
    model_step_discard(cp=cp, lease=lease, reason=problem, step=step, result=result, manifest=manifest, changes=changes)
    if repeated or rejections >= settings.WARDEN_MAX_INVALID_OUTPUTS or model_calls_used(run) >= run.max_model_calls:
        why = "the same output was rejected twice in a row" if repeated else f"{rejections} outputs in a row were rejected"
        raise RunFailure(RunErrorCode.INVALID_OUTPUT, f"{why}; the last: {problem}")
    if rejections >= 2:
        return _wait_before_asking_again(run=run, lease=lease, retries=rejections - 1, why=f"rejected output: {problem}")
    return None


def _ask(*, route: Route, request: ModelRequest, run: Run, step: Step, heartbeat: RunBeat, retrying: bool) -> StreamResult:
    """The call, to the run's endpoint or — by the fallback rule (engine/model_route.py) — on to its
    fallback, in this step; the result says which answered. _StreamBroken when it did not."""
    try:
        return _answered(_stream(provider=route.provider, request=request, run=run, step=step, heartbeat=heartbeat),
                         route, PRIMARY)
    except _StreamBroken as broken:
        _answered(broken.result, route, PRIMARY)
        if not route.falls_back(broken.error, delivered=broken.result.delivered, retrying=retrying):
            raise
        first = broken
    logger.warning("model endpoint %s failed (%s); asking fallback %s", route.endpoint.name, first.error,
                   route.fallback.name)
    try:
        return _answered(_stream(provider=route.fallback_provider, request=route.fallback_request(request), run=run,
                                 step=step, heartbeat=heartbeat), route, FALLBACK)
    except _StreamBroken as second:
        raise _StreamBroken(route.both_failed(first.error, second.error),
                            _answered(second.result, route, FALLBACK)) from second.error


def _answered(result: StreamResult, route: Route, role: str) -> StreamResult:
    """`result` with the record of the call `role` made (its endpoint, model and cost)."""
    record = route.answered_by(role, input_tokens=result.input_tokens, output_tokens=result.output_tokens)
    result.endpoint, result.model, result.cost = record["endpoint"], record["model"], record["cost"]
    return result


def _stream(*, provider, request: ModelRequest, run: Run, step: Step, heartbeat: RunBeat) -> StreamResult:
    result = StreamResult()
    out = step_deltas(session_id=run.session_id, run_id=run.id, step=step.index)
    heartbeat.streaming(step_id=step.pk, text_getter=lambda: result.text)
    slots = _CallSlots()
    # No database connection is held while the model answers: the process's other runs use it.
    connection_give_back()
    events = None
    try:
        events = provider.stream(request)
        for event in events:
            if heartbeat.lease_lost.is_set():
                raise LeaseLost(f"run {run.id}: lease lost mid-stream")
            if heartbeat.cancel_requested.is_set():
                result.aborted = "cancel requested"
                break
            if isinstance(event, TextDelta):
                result.text += event.text
                if out.text(result.text):
                    fault_point("mid_model_stream")
            elif isinstance(event, ToolCallDelta):
                index = slots.index_of(event)
                call = result.calls.setdefault(index, ProposedCall(index=index))
                call.id = call.id or (event.id or "")
                call.name = call.name or (event.name or "")
                call.arguments_text += event.arguments or ""
                out.call(index=index, id=call.id, name=call.name, arguments=call.arguments_text)
            elif isinstance(event, Usage):
                result.input_tokens += event.input_tokens
                result.output_tokens += event.output_tokens
            elif isinstance(event, Finish):
                result.finish_reason = event.reason
    except (TransientModelError, PermanentModelError) as error:
        out.abandon()  # nothing more of this stream goes out
        # The lease keeper shut the call's socket: the break is ours, not the model server's.
        if heartbeat.lease_lost.is_set():
            raise LeaseLost(f"run {run.id}: lease lost mid-stream") from error
        if not heartbeat.cancel_requested.is_set():
            raise _StreamBroken(error, result) from error
        result.aborted = "cancel requested"
        return result
    except BaseException:
        out.abandon()  # lease lost: nothing more of this stream goes out
        raise
    finally:
        # Detached first: once the connection is back in the client's pool, another run's.
        heartbeat.interrupt.detach()
        close = getattr(events, "close", None)
        if close:
            close()
        heartbeat.streaming(step_id=None, text_getter=None)
    out.close(result.text)
    return result


class _CallSlots:
    """Which call of the turn a tool-call fragment belongs to. Servers that send no `index`
    (older Ollama, Gemini's compatible endpoint) are told apart by the call id a new call's first
    fragment carries; an id-less, index-less fragment continues the latest call."""

    def __init__(self):
        self._by_id: dict[str, int] = {}
        self._latest: int | None = None

    def index_of(self, delta: ToolCallDelta) -> int:
        if delta.index is not None:
            index = delta.index
        elif delta.id and delta.id not in self._by_id:
            index = max([*self._by_id.values(), -1 if self._latest is None else self._latest]) + 1
        elif delta.id:
            index = self._by_id[delta.id]
        else:
            index = self._latest if self._latest is not None else 0
        if delta.id:
            self._by_id.setdefault(delta.id, index)
        self._latest = index
        return index


def _validate(result: StreamResult, *, offered: list[str] | None = None, version=None) -> str:
    """Why the output must not be acted on, or '' when it is sound (SPEC §3). A call of a tool the
    run's agent version does not offer is refused like an unknown one: it is never executed."""
    if not result.finish_reason:
        return "stream ended without a finish reason (truncated)"
    if result.finish_reason == "length":
        return "the model was cut off by its length limit"
    if result.finish_reason not in ("stop", "tool_calls", "function_call"):
        return f"unusable finish reason {result.finish_reason!r}"
    for call in result.calls.values():
        tool = tool_get(call.name)
        if tool is None:
            return f"the model asked for unknown tool {call.name!r}"
        if offered is not None and call.name not in offered and call.name != ASK_USER:
            return f"the model asked for tool {call.name!r}, which agent {version} does not offer"
        try:
            parsed = json.loads(call.arguments_text or "{}")
        except json.JSONDecodeError as error:
            return f"arguments of {call.name} are not valid JSON: {error.msg}"
        if not isinstance(parsed, dict):
            return f"arguments of {call.name} are not a JSON object"
        if problem := json_problem(parsed):
            return f"arguments of {call.name} {problem}"
        try:
            call.arguments = tool.arguments.model_validate(parsed).model_dump(mode="json")
        except ValidationError as error:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) or "(root)" for e in error.errors())
            return f"arguments of {call.name} do not match its schema ({fields})"
        if not call.id:
            return f"tool call {call.index} has no id"
    return ""


def _step_close(*, step: Step, lease: Lease, status: str, reason: str = "", result: StreamResult | None = None,
                run: Run | None = None) -> None:
    with transaction.atomic():
        if result is not None and result.tokens and run is not None:
            run_write(run_id=run.id, changes={"tokens_used": run.tokens_used + result.tokens}, lease_token=lease.token)
            run.tokens_used += result.tokens
        step_transition(step=step, to=status, lease_token=lease.token, discard_reason=reason[:300],
                        **(result.answered_by() if result is not None else {}))


def _backoff(*, run: Run, lease: Lease, step: Step, error: TransientModelError, result: StreamResult) -> str:
    """Transient model error: the call does not count against the budget (it was never answered;
    see `model_calls_used`) but the tokens the stream reported are charged; wait with
    exponential backoff and jitter, up to a limit."""
    retries = run.model_retries + 1
    if retries > settings.WARDEN_MAX_MODEL_RETRIES:
        _step_close(step=step, lease=lease, status=StepStatus.FAILED, reason=f"transient model error: {error}",
                    result=result, run=run)
        raise RunFailure(RunErrorCode.MODEL_RETRIES, f"{retries - 1} transient model errors; last: {error}")
    return _wait_before_asking_again(
        run=run, lease=lease, retries=retries, why=str(error), status_code=error.status, retry_after=error.retry_after,
        changes={"model_retries": retries, "tokens_used": run.tokens_used + result.tokens},
        failed_step=(step, {"discard_reason": f"transient: {error}"[:300], "input_tokens": result.input_tokens,
                            "output_tokens": result.output_tokens, **result.answered_by()}),
    )


def _wait_before_asking_again(*, run: Run, lease: Lease, retries: int, why: str, status_code: int | None = None,
                              retry_after: float | None = None, changes: dict | None = None,
                              failed_step: tuple[Step, dict] | None = None) -> str:
    """Suspend the run in `waiting / retry_backoff` (one commit, with the failed step's close),
    then end the task: the sweeper wakes the run when the backoff is over."""
    delay = settings.WARDEN_RETRY_BASE_SECONDS * (2 ** (retries - 1))
    delay = min(delay, 300) * random.uniform(0.8, 1.2)
    if retry_after:
        delay = max(delay, retry_after)
    wake_at = timezone.now() + timedelta(seconds=delay)
    with transaction.atomic():
        if failed_step is not None:
            step_transition(step=failed_step[0], to=StepStatus.FAILED, lease_token=lease.token, **failed_step[1])
        run_transition(
            run=run,
            to=RunStatus.WAITING,
            wait_reason=WaitReason.RETRY_BACKOFF,
            lease_token=lease.token,
            event_payload={"error": why, "status_code": status_code, "retry": retries, "wake_at": wake_at.isoformat()},
            wait_type="timer",
            expires_at=wake_at,
            resume_target="model",
            **(changes or {}),
        )
    raise StopDriving("retry-backoff")


def _commit_turn(*, run: Run, lease: Lease, step: Step, result: StreamResult, manifest: dict,
                 cp: Checkpoint | None = None) -> str | None:
    """One transaction: the step's outcome, the assistant message, and either the tool calls
    (with the first batch of reads already marked running) or the run's completion. A turn
    that asks only for reads, or answers, — the hot path — is one statement (engine/state/fast.py)."""
    calls = [result.calls[i] for i in sorted(result.calls)]
    if cp is not None and _commit_turn_at_once(cp=cp, lease=lease, step=step, result=result, manifest=manifest,
                                               calls=calls):
        return None if calls else "completed"
    with transaction.atomic():
        step_transition(
            step=step, to=StepStatus.COMPLETED, lease_token=lease.token,
            input_tokens=result.input_tokens, output_tokens=result.output_tokens, finish_reason=result.finish_reason,
            context_manifest=manifest, streamed_text=result.text, **result.answered_by(),
        )
        assistant, step_completed = _turn_record(run=run, step=step, result=result, calls=calls)
        messages_append(session_id=run.session_id, messages=[assistant])
        changes = _turn_changes(run, result)
        if not calls:
            # A final answer: the run completes in the same commit.
            run_end(run=run, to=RunStatus.COMPLETED, lease_token=lease.token, changes=changes, events_before=[step_completed])
            return "completed"
        tools_step = step_create(run_id=run.id, index=run.step_count, kind=StepKind.TOOLS, lease_token=lease.token)
        created = tool_calls_create(run=run, step=tools_step, proposed=calls, lease=lease)
        run_phase_enter(run=run, phase=RunPhase.EXECUTING_TOOLS, lease_token=lease.token,
                        events_before=[step_completed, (RunEventType.STEP_STARTED, {"step": tools_step.index, "kind": StepKind.TOOLS})],
                        events_after=created, changes=changes | {"step_count": run.step_count + 1}, announce_unchanged=True)
    run.tokens_used += result.tokens
    run.step_count += 1
    return None


def _turn_record(*, run: Run, step: Step, result: StreamResult, calls: list[ProposedCall]) -> tuple[Message, tuple]:
    """What a model turn adds to the history and to the run's log, whatever comes next."""
    assistant = Message(
        role=MessageRole.ASSISTANT, content=result.text, run_id=run.id, step_id=step.pk,
        tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments_text} for c in calls],
    )
    step_completed = (
        RunEventType.STEP_COMPLETED,
        {"step": step.index, "kind": StepKind.MODEL, "finish_reason": result.finish_reason, "text": result.text,
         "input_tokens": result.input_tokens, "output_tokens": result.output_tokens, "tool_calls": len(calls)},
    )
    return assistant, step_completed


def _turn_changes(run: Run, result: StreamResult) -> dict:
    return {"tokens_used": run.tokens_used + result.tokens, "invalid_outputs": 0}


def _commit_turn_at_once(*, cp: Checkpoint, lease: Lease, step: Step, result: StreamResult, manifest: dict,
                         calls: list[ProposedCall]) -> bool:
    """`_commit_turn` for a turn of reads only, or a final answer, as one statement; False when
    it is not taken (then nothing was written and the general path commits the turn)."""
    run = cp.run
    assistant, step_completed = _turn_record(run=run, step=step, result=result, calls=calls)
    changes = _turn_changes(run, result)
    if not calls:
        return state.turn_answered(cp=cp, lease=lease, step=step, result=result, manifest=manifest,
                                   assistant=assistant, events=[step_completed], changes=changes)
    rows = tool_call_rows(run=run, step=None, proposed=calls, lease=lease)
    if rows is None:
        return False  # writes: their idempotency keys and reuse go the general way
    phase, phase_events = run_phase_values(run=run, phase=RunPhase.EXECUTING_TOOLS, announce_unchanged=True)
    events = [
        step_completed,
        (RunEventType.STEP_STARTED, {"step": run.step_count, "kind": StepKind.TOOLS}),
        *phase_events,
        *(tool_call_event(row) for row in rows),
    ]
    changes |= {**phase, "step_count": run.step_count + 1}
    return cp.carry(state.turn_with_reads(cp=cp, lease=lease, step=step, result=result, manifest=manifest,
                                          rows=rows, assistant=assistant, events=events, changes=changes))
