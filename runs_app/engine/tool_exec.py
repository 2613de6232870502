"""Executing a model turn's tool calls behind the side-effect barrier (SPEC §6, §7, §10).

Reads run (concurrently within a batch) and are retried with backoff; writes never are.
A write's idempotency key is committed when the call is created — before any network I/O —
and a write that may have reached the downstream system but gave no clear answer becomes
`unknown` and waits for reconciliation.
"""

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs_app.engine.faults import fault_point
from runs_app.engine.lease import Heartbeat, Lease
from runs_app.engine.state import Checkpoint, StopDriving
from runs_app.models import Run, RunPhase, RunStatus, Step, StepKind, StepStatus, WaitReason
from runs_app.services import run_transition, run_write
from sessions_app.models import Message, MessageRole
from sessions_app.services import messages_append
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect
from tools_app.registry import ApprovalRequirement, ToolContext, ToolError, ToolOutcomeUnknown, tool_get
from tools_app.services import tool_call_event_payload

logger = logging.getLogger("warden.tools")


@dataclass
class Outcome:
    call: ToolCall
    status: str
    result: Any = None
    error_code: str = ""
    error_detail: str = ""
    attempts: int = 0


def tool_message_content(*, status: str, result: Any, error_code: str, error_detail: str) -> str:
    if status == ToolCallStatus.SUCCEEDED:
        return json.dumps(result, default=str)
    return json.dumps({"error": {"code": error_code or status, "detail": error_detail}})


def tool_message(call: ToolCall) -> Message:
    return Message(
        role=MessageRole.TOOL,
        run_id=call.run_id,
        step_id=call.step_id,
        tool_call_id=call.tool_call_id,
        tool_name=call.tool_name,
        content=tool_message_content(
            status=call.status, result=call.result, error_code=call.error_code, error_detail=call.error_detail
        ),
    )


def tool_calls_create(*, run: Run, step: Step, proposed: list, lease: Lease) -> list[tuple[str, dict]]:
    """Rows for a model turn's tool calls, in the caller's transaction. Writes get their
    idempotency key now; a write the run already made (same key) points at the original
    instead of getting a second call. The leading reads are marked running at once."""
    has_writes = any(tool_get(c.name).effect == ToolEffect.WRITE for c in proposed)
    existing = {
        c.idempotency_key: c
        for c in ToolCall.objects.filter(run_id=run.id, effect=ToolEffect.WRITE, idempotency_key__isnull=False)
    } if has_writes else {}
    rows: list[ToolCall] = []
    for position, call in enumerate(proposed):
        tool = tool_get(call.name)
        row = ToolCall(
            run_id=run.id, step=step, index=position, tool_call_id=call.id, tool_name=call.name,
            arguments=call.arguments, effect=tool.effect,
        )
        if tool.effect == ToolEffect.WRITE:
            key = tool.idempotency_key_for(run_id=run.id, arguments=tool.arguments.model_validate(call.arguments))
            if key in existing:
                row.reused_from = existing[key]
            else:
                row.idempotency_key = key
                existing[key] = row
        rows.append(row)
    head_reads = _leading_reads(rows)
    for row in head_reads:
        row.status = ToolCallStatus.RUNNING
        row.lease_token = lease.token
        row.started_at = timezone.now()
    ToolCall.objects.bulk_create(rows)
    return [("tool_call", tool_call_event_payload(row)) for row in rows]


def _leading_reads(calls: list[ToolCall]) -> list[ToolCall]:
    batch = []
    for call in calls:
        if call.effect != ToolEffect.READ or call.reused_from_id or call.status not in (ToolCallStatus.PENDING, ToolCallStatus.RUNNING):
            break
        batch.append(call)
    return batch


def tools_advance(*, cp: Checkpoint, lease: Lease, heartbeat: Heartbeat) -> str | None:
    from runs_app.engine.interjections import inputs_at_safe_point

    run = cp.run
    head = cp.open_tool_calls[0]  # never a dead worker's `running` call or an `unknown` one: Driver.advance saw to those
    if head.status == ToolCallStatus.PENDING and inputs_at_safe_point(run=run, lease=lease, before="tool"):
        return None
    if head.reused_from_id:
        return _reuse_outcome(cp=cp, lease=lease, call=head)
    if head.effect == ToolEffect.READ:
        batch = _leading_reads(cp.open_tool_calls)
        outcomes = _reads_execute(run=run, lease=lease, batch=batch)
        _finish(cp=cp, lease=lease, outcomes=outcomes)
        return None
    tool = tool_get(head.tool_name)
    if tool.approval != ApprovalRequirement.NONE and not _approved(cp=cp, lease=lease, call=head, tool=tool):
        return None
    outcome = _write_execute(run=run, lease=lease, call=head, tool=tool)
    if outcome.status == ToolCallStatus.UNKNOWN:
        with transaction.atomic():
            _apply_outcome(outcome)
            run_write(run_id=run.id, events=[("tool_call", tool_call_event_payload(outcome.call))], lease_token=lease.token)
            wait_for_reconciliation(run=run, lease=lease, call=outcome.call, raise_stop=False)
        raise StopDriving("reconciliation")
    _finish(cp=cp, lease=lease, outcomes=[outcome])
    return None


def recover_interrupted(*, run: Run, lease: Lease, call: ToolCall) -> None:
    """A call a dead (or stalled) worker had started (SPEC §10): a read runs again; a write
    may have reached the downstream system, so it becomes `unknown` — never replayed."""
    to = ToolCallStatus.PENDING if call.effect == ToolEffect.READ else ToolCallStatus.UNKNOWN
    with transaction.atomic():
        ToolCall.objects.filter(pk=call.pk, status=ToolCallStatus.RUNNING).update(
            status=to,
            error_code="" if to == ToolCallStatus.PENDING else "interrupted",
            error_detail="" if to == ToolCallStatus.PENDING else "worker lost while the write was in flight",
            finished_at=None if to == ToolCallStatus.PENDING else timezone.now(),
        )
        call.status = to
        payload = tool_call_event_payload(call) | {"recovered": True, "previous_lease_token": call.lease_token}
        run_write(run_id=run.id, events=[("tool_call", payload)], lease_token=lease.token)
    return None


def wait_for_reconciliation(*, run: Run, lease: Lease, call: ToolCall, raise_stop: bool = True) -> None:
    with transaction.atomic():
        run_transition(
            run=run,
            to=RunStatus.WAITING,
            wait_reason=WaitReason.RECONCILIATION,
            lease_token=lease.token,
            event_payload={"tool_call": str(call.id), "tool": call.tool_name},
            wait_type="tool_call",
            request_id=str(call.id),
            resume_target=str(call.id),
        )
        ToolCall.objects.filter(pk=call.pk, status=ToolCallStatus.UNKNOWN, next_attempt_at__isnull=True).update(
            next_attempt_at=timezone.now()
        )
    if raise_stop:
        raise StopDriving("reconciliation")


def _approved(*, cp: Checkpoint, lease: Lease, call: ToolCall, tool) -> bool:
    """True when a recorded human decision lets this call run. Otherwise suspends the run (or
    closes the call) and returns False. Nothing the model wrote is consulted here."""
    from approvals_app.models import Approval, ApprovalStatus
    from approvals_app.services import approval_expire, approval_request

    approval = Approval.objects.filter(tool_call=call).first()
    if approval is None:
        approval_request(run=cp.run, tool_call=call, policy=tool.approval, lease_token=lease.token)
        raise StopDriving("approval")
    if approval.status == ApprovalStatus.APPROVED:
        return True
    if approval.status == ApprovalStatus.PENDING:
        if approval.expires_at <= timezone.now():
            approval_expire(approval=approval, lease_token=lease.token)
            return False
        with transaction.atomic():
            run_transition(
                run=cp.run, to=RunStatus.WAITING, wait_reason=WaitReason.APPROVAL, lease_token=lease.token,
                wait_type="approval", request_id=str(approval.id), expires_at=approval.expires_at, resume_target=str(call.id),
            )
        raise StopDriving("approval")
    # Rejected, expired or withdrawn but the call is still open (the deciding transaction closes it; this
    # is the belt to those braces).
    from approvals_app.services import tool_call_close_for_decision

    tool_call_close_for_decision(approval=approval, lease_token=lease.token)
    return False


def _reuse_outcome(*, cp: Checkpoint, lease: Lease, call: ToolCall) -> None:
    """The model asked again for a write this run already made: reuse its outcome, never call twice."""
    original = ToolCall.objects.get(pk=call.reused_from_id)
    if original.status == ToolCallStatus.UNKNOWN:
        wait_for_reconciliation(run=cp.run, lease=lease, call=original)
    if original.status in (ToolCallStatus.PENDING, ToolCallStatus.RUNNING):
        # Same turn, earlier index: it is processed first, so this only happens if the original
        # is waiting (approval); wait with it.
        raise StopDriving("waiting-for-original")
    detail = f"same request as tool call {original.id}; its outcome is reused, it was not executed again"
    if original.status == ToolCallStatus.SUCCEEDED:
        outcome = Outcome(call=call, status=ToolCallStatus.SUCCEEDED, result=original.result, error_detail=detail)
    else:
        code = original.error_code or f"duplicate_of_{original.status}"
        outcome = Outcome(call=call, status=ToolCallStatus.FAILED, error_code=code, error_detail=detail)
    _finish(cp=cp, lease=lease, outcomes=[outcome])
    return None


def _context(run: Run, call: ToolCall, tool) -> ToolContext:
    return ToolContext(
        run_id=str(run.id), session_id=str(run.session_id), tool_call_id=str(call.id),
        idempotency_key=call.idempotency_key, timeout=tool.timeout,
    )


def _read_once(run: Run, call: ToolCall) -> Outcome:
    tool = tool_get(call.tool_name)
    arguments = tool.arguments.model_validate(call.arguments)
    attempts = call.attempts
    delay = tool.retry_backoff
    while True:
        attempts += 1
        try:
            result = tool.execute(_context(run, call, tool), arguments)
            return Outcome(call=call, status=ToolCallStatus.SUCCEEDED, result=result, attempts=attempts)
        except Exception as error:  # noqa: BLE001 - a read has no side effect: any failure may be retried
            retryable = error.retryable if isinstance(error, ToolError) else True
            if not retryable or attempts >= tool.max_attempts:
                return Outcome(
                    call=call, status=ToolCallStatus.FAILED, attempts=attempts,
                    error_code=getattr(error, "code", type(error).__name__), error_detail=str(error)[:2000],
                )
            time.sleep(delay)
            delay *= 2


def _reads_execute(*, run: Run, lease: Lease, batch: list[ToolCall]) -> list[Outcome]:
    pending = [c for c in batch if c.status == ToolCallStatus.PENDING]
    if pending:
        with transaction.atomic():
            now = timezone.now()
            for call in pending:
                ToolCall.objects.filter(pk=call.pk, status=ToolCallStatus.PENDING).update(
                    status=ToolCallStatus.RUNNING, lease_token=lease.token, started_at=now
                )
                call.status = ToolCallStatus.RUNNING
            run_write(
                run_id=run.id,
                changes={"phase": RunPhase.EXECUTING_TOOLS},
                events=[*_phase_event(run), *(("tool_call", tool_call_event_payload(c)) for c in pending)],
                lease_token=lease.token,
            )
            run.phase = RunPhase.EXECUTING_TOOLS
    if len(batch) == 1:
        return [_read_once(run, batch[0])]
    with ThreadPoolExecutor(max_workers=min(8, len(batch))) as pool:
        return list(pool.map(lambda c: _read_once(run, c), batch))


def _phase_event(run: Run) -> list[tuple[str, dict]]:
    """A phase change is a lifecycle event (SPEC §3): a run resumed straight into a tool call
    must show `running / executing_tools` in its event log, not only in its row."""
    if run.phase == RunPhase.EXECUTING_TOOLS:
        return []
    return [("run_status", {"status": RunStatus.RUNNING, "phase": RunPhase.EXECUTING_TOOLS, "wait_reason": ""})]


def _write_execute(*, run: Run, lease: Lease, call: ToolCall, tool) -> Outcome:
    with transaction.atomic():
        updated = ToolCall.objects.filter(pk=call.pk, status=ToolCallStatus.PENDING).update(
            status=ToolCallStatus.RUNNING, lease_token=lease.token, started_at=timezone.now(), attempts=call.attempts + 1
        )
        assert updated == 1, f"tool call {call.id} changed under the lease holder"
        call.status = ToolCallStatus.RUNNING
        call.attempts += 1
        run_write(
            run_id=run.id,
            changes={"phase": RunPhase.EXECUTING_TOOLS},
            events=[*_phase_event(run), ("tool_call", tool_call_event_payload(call) | {"idempotency_key": call.idempotency_key})],
            lease_token=lease.token,
        )
        run.phase = RunPhase.EXECUTING_TOOLS
    fault_point("after_key_commit")
    arguments = tool.arguments.model_validate(call.arguments)
    try:
        result = tool.execute(_context(run, call, tool), arguments)
        outcome = Outcome(call=call, status=ToolCallStatus.SUCCEEDED, result=result, attempts=call.attempts)
    except ToolError as error:
        outcome = Outcome(call=call, status=ToolCallStatus.FAILED, error_code=error.code, error_detail=error.detail, attempts=call.attempts)
    except ToolOutcomeUnknown as error:
        outcome = Outcome(call=call, status=ToolCallStatus.UNKNOWN, error_code="outcome_unknown", error_detail=error.detail, attempts=call.attempts)
    except Exception as error:  # noqa: BLE001 - after sending, anything unexpected is "we don't know"
        logger.exception("write tool %s raised unexpectedly", call.tool_name)
        outcome = Outcome(call=call, status=ToolCallStatus.UNKNOWN, error_code="outcome_unknown", error_detail=repr(error)[:2000], attempts=call.attempts)
    fault_point("after_downstream_call")
    return outcome


def _apply_outcome(outcome: Outcome) -> None:
    call = outcome.call
    values = {
        "status": outcome.status, "result": outcome.result, "error_code": outcome.error_code,
        "error_detail": outcome.error_detail, "attempts": outcome.attempts, "finished_at": timezone.now(),
    }
    updated = ToolCall.objects.filter(pk=call.pk, status__in=[ToolCallStatus.RUNNING, ToolCallStatus.PENDING]).update(**values)
    assert updated == 1, f"tool call {call.id} changed under the lease holder"
    for field, value in values.items():
        setattr(call, field, value)


def _finish(*, cp: Checkpoint, lease: Lease, outcomes: list[Outcome]) -> None:
    """One commit: the outcomes and their tool messages, then the start of whatever comes
    next — the following reads marked running, or the next model step opened."""
    from runs_app.engine.model_step import budget_left

    run = cp.run
    done = {o.call.pk for o in outcomes}
    remaining = [c for c in cp.open_tool_calls if c.pk not in done]
    with transaction.atomic():
        for outcome in outcomes:
            _apply_outcome(outcome)
        messages_append(session_id=run.session_id, messages=[tool_message(o.call) for o in outcomes])
        events = [("tool_call", tool_call_event_payload(o.call)) for o in outcomes]
        # The lease is extended by the heartbeat, not here: keeping the indexed lease_expires_at
        # out of checkpoints lets PostgreSQL update the run row in place (HOT).
        changes: dict[str, Any] = {}
        if remaining:
            next_reads = _leading_reads(remaining)
            now = timezone.now()
            for call in next_reads:
                ToolCall.objects.filter(pk=call.pk, status=ToolCallStatus.PENDING).update(
                    status=ToolCallStatus.RUNNING, lease_token=lease.token, started_at=now
                )
                call.status = ToolCallStatus.RUNNING
                events.append(("tool_call", tool_call_event_payload(call)))
        else:
            Step.objects.filter(pk=cp.tools_step.pk).update(status=StepStatus.COMPLETED, finished_at=timezone.now())
            events.append(("step_completed", {"step": cp.tools_step.index, "kind": StepKind.TOOLS}))
            if budget_left(run) and run.cancel_requested_at is None:
                index = run.step_count
                Step.objects.create(run_id=run.id, index=index, kind=StepKind.MODEL, lease_token=lease.token)
                changes |= {"phase": RunPhase.CALLING_MODEL, "model_calls": run.model_calls + 1, "step_count": index + 1}
                events.append(("step_started", {"step": index, "kind": StepKind.MODEL}))
                events.append(("run_status", {"status": RunStatus.RUNNING, "phase": RunPhase.CALLING_MODEL, "wait_reason": ""}))
        run_write(run_id=run.id, changes=changes, events=events, lease_token=lease.token)
