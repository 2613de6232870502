"""One model call: start the step, stream, validate, and commit the outcome (SPEC §3, §11)."""

import json
import logging
import random
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from config.logs import log_context
from config.tracing import span, span_set
from engine.actions.runs import run_end
from engine.checkpoint import Checkpoint, RunFailure, StopDriving
from engine.context import context_build
from engine.faults import fault_point
from engine.interjections import inputs_at_safe_point
from engine.lease import Heartbeat, Lease
from engine.tool_exec import tool_calls_create
from runs_app.events import RunEventType
from runs_app.live import StepDeltas
from runs_app.models import Run, RunErrorCode, RunPhase, RunStatus, Step, StepKind, StepStatus, WaitReason
from runs_app.providers import get_provider
from runs_app.providers.base import (
    Finish,
    ModelRequest,
    PermanentModelError,
    TextDelta,
    ToolCallDelta,
    TransientModelError,
    Usage,
)
from runs_app.services import run_transition, run_write, step_create, step_transition
from runs_app.transitions import LeaseLost
from sessions_app.models import Message, MessageRole
from sessions_app.services import messages_append
from tools_app.registry import tool_get, tool_schemas

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


def _budget_check(run: Run) -> None:
    if run.model_calls >= run.max_model_calls:
        raise RunFailure(RunErrorCode.MODEL_CALL_BUDGET, f"used all {run.max_model_calls} model calls")
    if run.tokens_used >= run.max_tokens:
        raise RunFailure(RunErrorCode.TOKEN_BUDGET, f"used {run.tokens_used} of {run.max_tokens} tokens")


def model_step_open(*, run: Run, lease: Lease, close_tools_step: Step | None = None) -> Step:
    """Start a model step: phase calling_model, one more model call counted (before the call,
    so a run that crashes its worker mid-call still runs out of budget). A tools step whose
    last call was closed elsewhere (a decision, a reconciliation) is completed with it."""
    index = run.step_count
    with transaction.atomic():
        if close_tools_step is not None:
            step_transition(step=close_tools_step, to=StepStatus.COMPLETED, lease_token=lease.token)
        run_write(
            run_id=run.id,
            changes={
                "phase": RunPhase.CALLING_MODEL,
                "model_calls": run.model_calls + 1,
                "step_count": index + 1,
            },
            events=[(RunEventType.STEP_STARTED, {"step": index, "kind": StepKind.MODEL}),
                    (RunEventType.RUN_STATUS, _running(RunPhase.CALLING_MODEL))],
            lease_token=lease.token,
        )
        step = step_create(run_id=run.id, index=index, kind=StepKind.MODEL, lease_token=lease.token)
    run.model_calls += 1
    run.step_count += 1
    run.phase = RunPhase.CALLING_MODEL
    return step


def _running(phase: str) -> dict:
    return {"status": RunStatus.RUNNING, "phase": phase, "wait_reason": ""}


def model_step_discard(*, cp: Checkpoint, lease: Lease, reason: str, step: Step | None = None) -> None:
    step = step or cp.latest_step
    with transaction.atomic():
        run_write(
            run_id=cp.run.id,
            events=[(RunEventType.STEP_DISCARDED, {"step": step.index, "reason": reason, "previous_lease_token": step.lease_token})],
            lease_token=lease.token,
        )
        step_transition(step=step, to=StepStatus.DISCARDED, lease_token=lease.token, discard_reason=reason[:300])


def model_turn(*, cp: Checkpoint, lease: Lease, heartbeat: Heartbeat) -> str | None:
    run = cp.run
    step = cp.latest_step
    own_open_step = (
        step is not None and step.kind == StepKind.MODEL and step.status == StepStatus.RUNNING and step.lease_token == lease.token
    )
    if inputs_at_safe_point(run=run, lease=lease, before="model"):
        return None  # input applied or a cancel requested: re-read the checkpoint
    if not own_open_step:
        _budget_check(run)
        step = model_step_open(run=run, lease=lease, close_tools_step=cp.tools_step)
    built = context_build(session_id=run.session_id)
    request = ModelRequest(
        messages=built.messages,
        tools=tool_schemas(),
        run_id=str(run.id),
        call_index=run.model_calls - 1,
        options=run.provider_options or {},
    )
    provider = get_provider(run.provider)
    try:
        with log_context(step=step.index), span(
            "model.call", run_id=run.id, session_id=run.session_id, step=step.index, step_id=step.pk,
            lease_token=lease.token, provider=run.provider, model_call=run.model_calls,
        ) as current:
            result = _stream(provider=provider, request=request, run=run, step=step, heartbeat=heartbeat)
            span_set(current, finish_reason=result.finish_reason, input_tokens=result.input_tokens,
                     output_tokens=result.output_tokens, tool_calls=len(result.calls), aborted=result.aborted or None)
    except TransientModelError as error:
        return _backoff(run=run, lease=lease, step=step, error=error)
    except PermanentModelError as error:
        _step_close(step=step, lease=lease, status=StepStatus.FAILED, reason=f"model error: {error}")
        raise RunFailure(RunErrorCode.MODEL_ERROR, f"{error} (status {error.status})") from error
    if result.aborted:
        model_step_discard(cp=cp, lease=lease, reason=f"stream aborted: {result.aborted}", step=step)
        return None
    problem = _validate(result)
    if problem:
        model_step_discard(cp=cp, lease=lease, reason=problem, step=step)
        if run.model_calls >= run.max_model_calls:
            raise RunFailure(RunErrorCode.INVALID_OUTPUT, f"the model's last output was rejected: {problem}")
        return None
    return _commit_turn(run=run, lease=lease, step=step, result=result, manifest=built.manifest)


def _stream(*, provider, request: ModelRequest, run: Run, step: Step, heartbeat: Heartbeat) -> StreamResult:
    result = StreamResult()
    out = StepDeltas(session_id=run.session_id, run_id=run.id, step=step.index)
    heartbeat.streaming(step_id=step.pk, text_getter=lambda: result.text)
    events = provider.stream(request)
    try:
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
                call = result.calls.setdefault(event.index, ProposedCall(index=event.index))
                call.id = call.id or (event.id or "")
                call.name = call.name or (event.name or "")
                call.arguments_text += event.arguments or ""
                out.call(index=event.index, id=call.id, name=call.name, arguments=call.arguments_text)
            elif isinstance(event, Usage):
                result.input_tokens += event.input_tokens
                result.output_tokens += event.output_tokens
            elif isinstance(event, Finish):
                result.finish_reason = event.reason
    except BaseException:
        out.abandon()  # lease lost, provider error: nothing more of this stream goes out
        raise
    finally:
        close = getattr(events, "close", None)
        if close:
            close()
        heartbeat.streaming(step_id=None, text_getter=None)
    out.close(result.text)
    return result


def _validate(result: StreamResult) -> str:
    """Why the output must not be acted on, or '' when it is sound (SPEC §3)."""
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
        try:
            parsed = json.loads(call.arguments_text or "{}")
        except json.JSONDecodeError as error:
            return f"arguments of {call.name} are not valid JSON: {error.msg}"
        if not isinstance(parsed, dict):
            return f"arguments of {call.name} are not a JSON object"
        try:
            call.arguments = tool.arguments.model_validate(parsed).model_dump(mode="json")
        except ValidationError as error:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) or "(root)" for e in error.errors())
            return f"arguments of {call.name} do not match its schema ({fields})"
        if not call.id:
            return f"tool call {call.index} has no id"
    return ""


def _step_close(*, step: Step, lease: Lease, status: str, reason: str = "") -> None:
    with transaction.atomic():
        step_transition(step=step, to=status, lease_token=lease.token, discard_reason=reason[:300])


def _backoff(*, run: Run, lease: Lease, step: Step, error: TransientModelError) -> str:
    """Transient model error: wait with exponential backoff and jitter, up to a limit."""
    retries = run.model_retries + 1
    if retries > settings.WARDEN_MAX_MODEL_RETRIES:
        _step_close(step=step, lease=lease, status=StepStatus.FAILED, reason=f"transient model error: {error}")
        raise RunFailure(RunErrorCode.MODEL_RETRIES, f"{retries - 1} transient model errors; last: {error}")
    delay = settings.WARDEN_RETRY_BASE_SECONDS * (2 ** (retries - 1))
    delay = min(delay, 300) * random.uniform(0.8, 1.2)
    if error.retry_after:
        delay = max(delay, error.retry_after)
    wake_at = timezone.now() + timedelta(seconds=delay)
    with transaction.atomic():
        step_transition(step=step, to=StepStatus.FAILED, lease_token=lease.token, discard_reason=f"transient: {error}"[:300])
        run_transition(
            run=run,
            to=RunStatus.WAITING,
            wait_reason=WaitReason.RETRY_BACKOFF,
            lease_token=lease.token,
            event_payload={"error": str(error), "status_code": error.status, "retry": retries, "wake_at": wake_at.isoformat()},
            model_retries=retries,
            wait_type="timer",
            expires_at=wake_at,
            resume_target="model",
        )
    raise StopDriving("retry-backoff")


def _commit_turn(*, run: Run, lease: Lease, step: Step, result: StreamResult, manifest: dict) -> str | None:
    """One transaction: the step's outcome, the assistant message, and either the tool calls
    (with the first batch of reads already marked running) or the run's completion."""
    calls = [result.calls[i] for i in sorted(result.calls)]
    tokens = result.input_tokens + result.output_tokens
    with transaction.atomic():
        step_transition(
            step=step, to=StepStatus.COMPLETED, lease_token=lease.token,
            input_tokens=result.input_tokens, output_tokens=result.output_tokens, finish_reason=result.finish_reason,
            context_manifest=manifest, streamed_text=result.text,
        )
        assistant = Message(
            role=MessageRole.ASSISTANT,
            content=result.text,
            run_id=run.id,
            step_id=step.pk,
            tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments_text} for c in calls],
        )
        messages_append(session_id=run.session_id, messages=[assistant])
        events = [
            (
                RunEventType.STEP_COMPLETED,
                {"step": step.index, "kind": StepKind.MODEL, "finish_reason": result.finish_reason, "text": result.text,
                 "input_tokens": result.input_tokens, "output_tokens": result.output_tokens, "tool_calls": len(calls)},
            )
        ]
        changes = {"tokens_used": run.tokens_used + tokens}
        if not calls:
            # A final answer: the run completes in the same commit.
            run_end(run=run, to=RunStatus.COMPLETED, lease_token=lease.token, changes=changes, events_before=events)
            return "completed"
        changes |= {"phase": RunPhase.EXECUTING_TOOLS, "step_count": run.step_count + 1}
        tools_step = step_create(run_id=run.id, index=run.step_count, kind=StepKind.TOOLS, lease_token=lease.token)
        created = tool_calls_create(run=run, step=tools_step, proposed=calls, lease=lease)
        events.append((RunEventType.STEP_STARTED, {"step": tools_step.index, "kind": StepKind.TOOLS}))
        events.append((RunEventType.RUN_STATUS, _running(RunPhase.EXECUTING_TOOLS)))
        events += created
        run_write(run_id=run.id, changes=changes, events=events, lease_token=lease.token)
    run.tokens_used += tokens
    run.step_count += 1
    return None
