"""Executing a model turn's tool calls behind the side-effect barrier (SPEC §6, §7, §10).

Reads run (concurrently within a batch) and are retried with backoff; writes never are.
A write's idempotency key is committed when the call is created — before any network I/O —
and a write that may have reached the downstream system but gave no clear answer becomes
`unknown` and waits for reconciliation.
"""

import contextlib
import contextvars
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from approvals_app.models import Approval, ApprovalStatus, Freeze, FreezeMode
from approvals_app.selectors import freeze_active
from config.logs import log_context
from config.tracing import span, span_set
from agents.definitions import RuleMatch, approval_requirement
from agents.limits import PER_RUN, PER_TURN, limit_scopes, limit_verdict, write_caps_of
from agents.selectors import run_agent_version
from engine import state
from engine.actions.approvals import approval_expire, approval_request, tool_call_close_for_decision
from engine.checkpoint import Checkpoint, CheckpointStale, StopDriving, budget_left
from engine.faults import fault_point
from engine.guards import RETRY_KEY_MARK, key_base, retried_runs, run_scoped_key, scope_spent, with_limits
from engine.interjections import inputs_at_safe_point
from engine.lease import RunBeat, connection_give_back
from engine.state import (
    Lease, run_phase_enter, run_transition, run_write, step_create, step_transition, tool_call_transition,
)
from runs_app.events import RunEventType
from runs_app.models import Run, RunPhase, RunStatus, Step, StepKind, StepStatus, WaitReason
from sessions_app.selectors import session_customer
from sessions_app.services import messages_append
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect
from tools_app.registry import ASK_USER, ApprovalRequirement, ToolContext, ToolError, ToolOutcomeUnknown, tool_get
from tools_app.outcomes import ALREADY_DONE, ALREADY_DONE_TEXT
from tools_app.services import tool_call_digest, tool_call_event, tool_call_message

logger = logging.getLogger("warden.tools")


class ToolTimedOut(Exception):
    """The tool did not answer within its declared timeout; it was abandoned (SPEC §16)."""

    code = "tool_timeout"

    def __init__(self, tool_name: str, timeout: float):
        super().__init__(f"{tool_name} gave no answer within its {timeout:g} s timeout")
        self.detail = str(self)


class _ToolThread(threading.Thread):
    """A thread that runs tool calls one after another and, between them, waits in `_IDLE` for
    the next: starting a thread per call cost a no-op read most of its time. A call abandoned at
    its timeout keeps its thread until it returns (or forever, if it hangs); the next call then
    takes another thread, never waits for it."""

    def __init__(self):
        super().__init__(name="tool-runner", daemon=True)
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            job()
            with _IDLE_LOCK:
                if len(_IDLE) >= max(_IDLE_MAX, settings.WARDEN_RUNS_PER_WORKER):
                    return
                _IDLE.append(self)


_IDLE: list[_ToolThread] = []
_IDLE_LOCK = threading.Lock()
_IDLE_MAX = 16  # or as many as the runs a process drives at once (engine/executor.py)


def _tool_thread() -> _ToolThread:
    with _IDLE_LOCK:
        if _IDLE:
            return _IDLE.pop()
    thread = _ToolThread()
    thread.start()
    return thread


def _within_timeout(tool, context: ToolContext, arguments):
    """Run the tool in a thread of its own and wait for it at most its declared timeout, so a
    hung tool never holds the worker (whose heartbeat keeps the lease meanwhile). An abandoned
    call's thread is left to finish or hang on its own; for a write that is why its outcome is
    `unknown`, never retried."""
    if not tool.timeout or tool.timeout <= 0:
        return tool.execute(context, arguments)
    box: dict[str, Any] = {}
    done = threading.Event()

    def call() -> None:
        try:
            box["result"] = tool.execute(context, arguments)
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread below
            box["error"] = error
        finally:
            connections.close_all()  # this thread's own database connections, if the tool opened any
            done.set()

    # In a copy of this thread's context: the tool's own spans and log lines stay the call's.
    context_copy = contextvars.copy_context()
    _tool_thread().jobs.put(lambda: context_copy.run(call))
    connection_give_back()  # the tool's thread may need one of the pool's connections meanwhile
    if not done.wait(tool.timeout):
        raise ToolTimedOut(tool.name, tool.timeout)
    if "error" in box:
        raise box["error"]
    return box["result"]


@dataclass
class Outcome:
    call: ToolCall
    status: str
    result: Any = None
    error_code: str = ""
    error_detail: str = ""
    attempts: int = 0


def tool_call_rows(*, run: Run, step: Step | None, proposed: list, lease: Lease) -> list[ToolCall] | None:
    """The rows a model turn of reads only would create (not saved; the leading reads marked
    running), for the one-statement commit (engine/state/fast.py); None when the turn asks for a
    write, whose idempotency key and reuse `tool_calls_create` decides."""
    if any(tool_get(c.name).effect == ToolEffect.WRITE for c in proposed):
        return None
    rows = [
        ToolCall(run_id=run.id, step=step, index=position, tool_call_id=call.id, tool_name=call.name,
                 arguments=call.arguments, effect=tool_get(call.name).effect)
        for position, call in enumerate(proposed)
    ]
    state.tool_calls_start(calls=_leading_reads(rows), lease_token=lease.token)
    return rows


def tool_calls_create(*, run: Run, step: Step, proposed: list, lease: Lease) -> list[tuple[str, dict]]:
    """Rows for a model turn's tool calls, in the caller's transaction. Writes get their
    idempotency key now. A write with a business key is a fact of the deployment: if any run or
    session already asked for it, the call points at that one (reused_from) and is answered
    with its outcome, never executed (`_business_key_decide`). A write without one is
    deduplicated within its run, and a retried run reuses what the runs it retries applied
    (SPEC §16, §18). The leading reads are marked running at once."""
    has_writes = any(tool_get(c.name).effect == ToolEffect.WRITE for c in proposed)
    lineage = retried_runs(run) if has_writes else []
    business = {}
    for position, call in enumerate(proposed):
        tool = tool_get(call.name)
        if tool.effect == ToolEffect.WRITE and tool.business_key is not None:
            business[position] = tool.business_key_for(tool.arguments.model_validate(call.arguments))
    asked_before: dict[str, list[ToolCall]] = {}
    if business:
        state.business_keys_lock(business.values())
        for earlier in ToolCall.objects.filter(business_key__in=set(business.values()),
                                               idempotency_key__isnull=False).order_by("created_at"):
            asked_before.setdefault(earlier.business_key, []).append(earlier)
    keyless = has_writes and len(business) < sum(tool_get(c.name).effect == ToolEffect.WRITE for c in proposed)
    existing = {
        c.idempotency_key: c
        for c in ToolCall.objects.filter(run_id=run.id, effect=ToolEffect.WRITE, idempotency_key__isnull=False,
                                         business_key__isnull=True)
    } if keyless else {}
    applied_before = {
        key_base(c.idempotency_key): c
        for c in ToolCall.objects.filter(run_id__in=[r.pk for r in lineage], effect=ToolEffect.WRITE,
                                         status=ToolCallStatus.SUCCEEDED, idempotency_key__isnull=False,
                                         business_key__isnull=True)
    } if lineage and keyless else {}
    rows: list[ToolCall] = []
    for position, call in enumerate(proposed):
        tool = tool_get(call.name)
        row = ToolCall(
            run_id=run.id, step=step, index=position, tool_call_id=call.id, tool_name=call.name,
            arguments=call.arguments, effect=tool.effect,
        )
        if position in business:
            row.business_key = business[position]
            _business_key_decide(row, asked_before.setdefault(row.business_key, []),
                                 retried_runs={r.pk for r in lineage})
        elif tool.effect == ToolEffect.WRITE:
            # A retry that makes a write its predecessor did not apply sends a key of its own.
            key = run_scoped_key(tool, tool.arguments.model_validate(call.arguments), run=run, lineage=lineage)
            base = key_base(key)
            if key in existing:
                row.reused_from = existing[key]
            elif base in applied_before:
                row.reused_from = applied_before[base]
            else:
                row.idempotency_key = key
                existing[key] = row
        rows.append(row)
    if has_writes:
        _guards_decide(run=run, rows=rows)
    state.tool_calls_start(calls=_leading_reads(rows), lease_token=lease.token)
    state.tool_calls_insert(calls=rows)
    return [tool_call_event(row) for row in rows]


def _guards_decide(*, run: Run, rows: list[ToolCall]) -> None:
    """The guards that see more than one call (SPEC §18), decided as the turn's writes are created
    and recorded on each (`ToolCall.guard`): the caps on writes per model turn and per run, then
    the agent's cumulative limits — with each limit's scope locked, so two runs of one customer
    never both pass its last unit. A write over a cap, or over a limit that refuses, never runs;
    over a limit that asks for a person, it goes to that tier. Writes answered by an earlier call
    (reused_from) are not new money and pass no guard."""
    writes = [row for row in rows if row.effect == ToolEffect.WRITE and row.reused_from is None]
    if not writes:
        return
    version = run_agent_version(run)
    caps = write_caps_of(version)
    earlier = (ToolCall.objects.filter(run_id=run.id, effect=ToolEffect.WRITE, reused_from__isnull=True)
               .exclude(guard__has_key="refused").count())
    limits_of = (version.limits or {}) if version is not None else {}
    customer_id = session_customer(str(run.session_id)).id  # kept per process
    agent_id = version.agent_id if version is not None else None
    scopes_of = {
        id(row): limit_scopes(tool=tool_get(row.tool_name), limits=limits_of[row.tool_name], arguments=row.arguments,
                              customer_id=customer_id, agent_id=agent_id)
        for row in writes if limits_of.get(row.tool_name)
    }
    if scopes_of:
        state.business_keys_lock([scope.lock_key() for scopes in scopes_of.values() for scope in scopes])
    this_turn: dict[str, tuple[Decimal, int]] = {}  # what the turn's admitted writes add to a scope
    admitted = 0
    for row in writes:
        _guard_one(row, caps=caps, earlier=earlier, admitted=admitted, scopes_of=scopes_of, limits_of=limits_of,
                   this_turn=this_turn)
        if row.guard and "refused" in row.guard:
            # Refused, it never holds its business key: asked for again later, it is a new request.
            row.idempotency_key = None
        else:
            admitted += 1
    if scopes_of:
        fault_point("after_limits_checked")


def _guard_one(row: ToolCall, *, caps, earlier: int, admitted: int, scopes_of, limits_of, this_turn) -> None:
    """One write's guards, in order: the turn's cap, the run's cap, the agent's limits."""
    tool = tool_get(row.tool_name)
    if admitted >= caps[PER_TURN]:
        row.guard = {"refused": {"code": "write_cap_turn", "detail": (
            f"a model turn may make {caps[PER_TURN]} write(s); this is one more, so it was not run — "
            "ask for it again in a turn of its own")}}
        return
    if earlier + admitted >= caps[PER_RUN]:
        row.guard = {"refused": {"code": "write_cap_run", "detail": (
            f"a run may make {caps[PER_RUN]} write(s) and this run has made them; this one was not run")}}
        return
    if id(row) in scopes_of:
        scopes = scopes_of[id(row)]

        def spent(scope, since, tool=tool):
            total, count = scope_spent(tool, scope, since)
            more_total, more_count = this_turn.get(scope.lock_key(), (Decimal("0"), 0))
            return total + more_total, count + more_count

        row.guard = limit_verdict(tool=tool, limits=limits_of[row.tool_name], scopes=scopes, arguments=row.arguments,
                                  spent=spent).guard(tool)
        if "refused" in row.guard:
            return
        amount, _ = tool.money_of(row.arguments)
        for scope in scopes:
            total, count = this_turn.get(scope.lock_key(), (Decimal("0"), 0))
            this_turn[scope.lock_key()] = (total + (amount or 0), count + 1)


def _business_key_decide(row: ToolCall, asked: list[ToolCall], *, retried_runs: set) -> None:
    """Whether `row` executes under its business key, given the calls that held the key before
    (oldest first; the caller holds the key's lock). A call that succeeded, or may still (pending
    approval, running, `unknown`), answers every later request for the key, in any run. When each
    of them definitely did not take effect (failed, cancelled), a retry of their run tries again
    under a key of its own (SPEC §16); any other request is answered with the latest failure."""
    standing = [c for c in asked if c.status not in (ToolCallStatus.FAILED, ToolCallStatus.CANCELLED)]
    if standing:
        row.reused_from = standing[-1]
        return
    if asked and not retried_runs & {c.run_id for c in asked}:
        row.reused_from = asked[-1]
        return
    row.idempotency_key = f"{row.business_key}{RETRY_KEY_MARK}{len(asked)}" if asked else row.business_key
    asked.append(row)  # a later call of the same turn with the same key is answered by this one


def _leading_reads(calls: list[ToolCall]) -> list[ToolCall]:
    batch = []
    for call in calls:
        if (call.effect != ToolEffect.READ or call.reused_from_id or call.tool_name == ASK_USER
                or call.status not in (ToolCallStatus.PENDING, ToolCallStatus.RUNNING)):
            break
        batch.append(call)
    return batch


def tools_advance(*, cp: Checkpoint, lease: Lease, heartbeat: RunBeat) -> str | None:
    run = cp.run
    head = cp.open_tool_calls[0]  # never a dead worker's `running` call or an `unknown` one: Driver.advance saw to those
    if head.status == ToolCallStatus.PENDING and inputs_at_safe_point(run=run, lease=lease, before="tool"):
        return None
    if head.reused_from_id:
        return _reuse_outcome(cp=cp, lease=lease, call=head)
    if head.tool_name == ASK_USER:
        _wait_for_answer(run=run, lease=lease, call=head)
    if head.effect == ToolEffect.READ:
        batch = _leading_reads(cp.open_tool_calls)
        outcomes = _reads_execute(run=run, lease=lease, batch=batch)
        _finish(cp=cp, lease=lease, outcomes=outcomes)
        return None
    tool = tool_get(head.tool_name)
    if head.guard and "refused" in head.guard:
        # Over a cap on writes or a limit that refuses (decided when the call was created): never run.
        refused = head.guard["refused"]
        _finish(cp=cp, lease=lease, outcomes=[Outcome(call=head, status=ToolCallStatus.FAILED, error_code=refused["code"],
                                                      error_detail=refused["detail"])])
        return None
    # The run's agent version's rules (or the tool's own policy) decide who approves: evaluated
    # here, by the run-time, on the validated arguments — nothing the model says counts — and the
    # agent's limits, as they stood when the call was created, may ask for more.
    requirement = with_limits(approval_requirement(version=run_agent_version(run), tool=tool, arguments=head.arguments),
                               head.guard, tool.name)
    if requirement.approval != ApprovalRequirement.NONE and not _approved(cp=cp, lease=lease, call=head,
                                                                          requirement=requirement):
        return None
    try:
        outcome = _write_execute(run=run, lease=lease, call=head, tool=tool, requirement=requirement)
    except Frozen as frozen:
        _frozen(cp=cp, lease=lease, call=head, freeze=frozen.freeze)
        return None
    if outcome.status == ToolCallStatus.UNKNOWN:
        with transaction.atomic():
            _apply_outcome(outcome, lease=lease)
            wait_for_reconciliation(run=run, lease=lease, call=outcome.call, raise_stop=False,
                                    events_before=[tool_call_event(outcome.call)])
        raise StopDriving("reconciliation")
    _finish(cp=cp, lease=lease, outcomes=[outcome])
    return None


def _frozen(*, cp: Checkpoint, lease: Lease, call: ToolCall, freeze: Freeze) -> None:
    """A freeze holds the write: the run waits until it is lifted, or the call is refused."""
    what = f"{freeze.scope} {freeze.target} is frozen by {freeze.created_by.get_username()}: {freeze.reason}"
    if freeze.mode == FreezeMode.REFUSE:
        _finish(cp=cp, lease=lease, outcomes=[Outcome(call=call, status=ToolCallStatus.FAILED, error_code="frozen",
                                                      error_detail=f"{what}; nothing was sent")])
        return
    with transaction.atomic():
        run_transition(
            run=cp.run, to=RunStatus.WAITING, wait_reason=WaitReason.FROZEN, lease_token=lease.token,
            event_payload={"tool_call": str(call.id), "tool": call.tool_name, "freeze": freeze.pk,
                           "frozen": f"{freeze.scope} {freeze.target}"},
            wait_type="freeze", request_id=str(freeze.pk), resume_target=str(call.id),
        )
    raise StopDriving("frozen")


def recover_interrupted(*, run: Run, lease: Lease, call: ToolCall) -> None:
    """A call a dead (or stalled) worker had started (SPEC §10): a read runs again; a write
    may have reached the downstream system, so it becomes `unknown` — never replayed."""
    previous_token = call.lease_token
    with transaction.atomic():
        if call.effect == ToolEffect.READ:
            tool_call_transition(tool_call=call, to=ToolCallStatus.PENDING, lease_token=lease.token, error_code="", error_detail="")
        else:
            tool_call_transition(tool_call=call, to=ToolCallStatus.UNKNOWN, lease_token=lease.token, error_code="interrupted",
                                 error_detail="worker lost while the write was in flight")
        event = tool_call_event(call, recovered=True, previous_lease_token=previous_token)
        run_write(run_id=run.id, events=[event], lease_token=lease.token)


def wait_for_reconciliation(*, run: Run, lease: Lease, call: ToolCall, raise_stop: bool = True,
                            events_before=()) -> None:
    with transaction.atomic():
        run_transition(
            run=run,
            to=RunStatus.WAITING,
            wait_reason=WaitReason.RECONCILIATION,
            lease_token=lease.token,
            event_payload={"tool_call": str(call.id), "tool": call.tool_name},
            events_before=events_before,
            wait_type="tool_call",
            request_id=str(call.id),
            resume_target=str(call.id),
        )
        ToolCall.objects.filter(pk=call.pk, status=ToolCallStatus.UNKNOWN, next_attempt_at__isnull=True).update(
            next_attempt_at=timezone.now()
        )
    if raise_stop:
        raise StopDriving("reconciliation")


def _wait_for_answer(*, run: Run, lease: Lease, call: ToolCall) -> None:
    """The model asked the user something only they can tell (SPEC §16): the run waits for the
    reply, which closes this call and resumes the same run (engine.actions.messages), or for the
    question to expire (the sweeper)."""
    now = timezone.now()
    expires_at = now + timedelta(seconds=settings.WARDEN_INPUT_TTL_SECONDS)
    question = call.arguments.get("question", "")
    with transaction.atomic():
        run_transition(
            run=run, to=RunStatus.WAITING, wait_reason=WaitReason.WAITING_INPUT, lease_token=lease.token,
            extra_events=[(RunEventType.INPUT_REQUESTED,
                           {"tool_call": str(call.id), "question": question, "expires_at": expires_at.isoformat()})],
            wait_type="input", request_id=str(call.id), expires_at=expires_at, resume_target=str(call.id),
        )
    raise StopDriving("waiting-input")


def _approved(*, cp: Checkpoint, lease: Lease, call: ToolCall, requirement: RuleMatch) -> bool:
    """True when a recorded human decision lets this call run. Otherwise suspends the run (or
    closes the call) and returns False. Nothing the model wrote is consulted here."""
    approval = Approval.objects.filter(tool_call=call).first()
    if approval is None:
        approval_request(run=cp.run, tool_call=call, policy=requirement.approval, lease_token=lease.token,
                         required_approvals=requirement.approvers, rule=requirement.rule, rule_reason=requirement.reason)
        raise StopDriving("approval")
    if approval.status == ApprovalStatus.APPROVED:
        mismatch = _approval_mismatch(approval=approval, call=call)
        if mismatch:
            # Bound to what they approved (SPEC §18): anything else is refused, nothing is sent.
            _finish(cp=cp, lease=lease, outcomes=[Outcome(call=call, status=ToolCallStatus.FAILED,
                                                          error_code="approval_mismatch", error_detail=mismatch)])
            return False
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
    tool_call_close_for_decision(approval=approval, lease_token=lease.token)
    return False


def _approval_mismatch(*, approval: Approval, call: ToolCall) -> str:
    """Why the approved call may not run ("" when it may): each approving decision, and the request
    put to the deciders, recorded a digest of the tool, arguments and key; the call about to run
    must match every one. (Approvals recorded before digests existed have none to compare.)"""
    expected = tool_call_digest(call)
    recorded = [("the request", approval.digest)] + [
        (f"the approval by {d.decided_by.get_username()}", d.digest)
        for d in approval.decisions.filter(decision="approve", voided_at__isnull=True).select_related("decided_by")
    ]
    differing = [who for who, digest in recorded if digest and digest != expected]
    if not differing:
        return ""
    return (f"the call about to run is not what was approved ({', '.join(differing)} recorded another tool, "
            f"arguments or key); nothing was sent")


def _reuse_outcome(*, cp: Checkpoint, lease: Lease, call: ToolCall) -> None:
    """The write was asked for before — by this run, or (its business key) by any other: answer
    with that call's outcome, never call twice."""
    original = ToolCall.objects.get(pk=call.reused_from_id)
    if original.run_id != call.run_id:
        _finish(cp=cp, lease=lease, outcomes=[_answered_by(call, original)])
        return None
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


def _answered_by(call: ToolCall, original: ToolCall) -> Outcome:
    """A request for a business fact another run already asked for (SPEC §18): the earlier
    call's outcome as it stands now — done, failed, or still open — and nothing sent."""
    where = f"tool call {original.id} of run {original.run_id}"
    if original.status == ToolCallStatus.SUCCEEDED:
        return Outcome(call=call, status=ToolCallStatus.SUCCEEDED, error_code=ALREADY_DONE, result={
            "already_done": True, "message": ALREADY_DONE_TEXT, "result": original.result,
        }, error_detail=f"already done by {where} (same business key {call.business_key}); not executed again")
    if original.status in (ToolCallStatus.FAILED, ToolCallStatus.CANCELLED):
        return Outcome(call=call, status=ToolCallStatus.FAILED,
                       error_code=original.error_code or f"duplicate_of_{original.status}",
                       error_detail=f"asked before by {where}, which did not take effect; not executed again")
    code = "already_in_doubt" if original.status == ToolCallStatus.UNKNOWN else "already_requested"
    return Outcome(call=call, status=ToolCallStatus.FAILED, error_code=code,
                   error_detail=f"asked before by {where}, which is {original.status}; not executed again")




def _context(run: Run, call: ToolCall, tool) -> ToolContext:
    version = run_agent_version(run)  # kept per process
    return ToolContext(
        run_id=str(run.id), session_id=str(run.session_id), tool_call_id=str(call.id),
        idempotency_key=call.idempotency_key, timeout=tool.timeout, agent=version.agent.slug if version else "",
    )


def _tool_span(run: Run, call: ToolCall, lease_token: int | None):
    """The tool call's span (a child of the run's slice) with its ids bound to log lines too."""
    stack = contextlib.ExitStack()
    stack.enter_context(log_context(tool_call_id=str(call.id)))
    current = stack.enter_context(span(
        "tool.call", run_id=run.id, session_id=run.session_id, step_id=call.step_id, tool_call=call.id,
        tool_call_id=call.tool_call_id, tool=call.tool_name, effect=call.effect, lease_token=lease_token,
        idempotency_key=call.idempotency_key,
    ))
    return stack, current


def _read_once(run: Run, call: ToolCall, lease_token: int | None = None) -> Outcome:
    stack, current = _tool_span(run, call, lease_token)
    with stack:
        outcome = _read_attempts(run, call)
        span_set(current, status=outcome.status, attempts=outcome.attempts, error_code=outcome.error_code or None)
    return outcome


def _read_attempts(run: Run, call: ToolCall) -> Outcome:
    tool = tool_get(call.tool_name)
    arguments = tool.arguments.model_validate(call.arguments)
    attempts = call.attempts
    delay = tool.retry_backoff
    while True:
        attempts += 1
        try:
            result = _within_timeout(tool, _context(run, call, tool), arguments)
            return Outcome(call=call, status=ToolCallStatus.SUCCEEDED, result=result, attempts=attempts)
        except Exception as error:  # noqa: BLE001 - a read has no side effect: any failure may be retried
            retryable = error.retryable if isinstance(error, ToolError) else True
            if not retryable or attempts >= tool.max_attempts:
                return Outcome(
                    call=call, status=ToolCallStatus.FAILED, attempts=attempts,
                    error_code=getattr(error, "code", type(error).__name__), error_detail=str(error)[:2000],
                )
            connection_give_back()
            time.sleep(delay)
            delay *= 2


def _reads_execute(*, run: Run, lease: Lease, batch: list[ToolCall]) -> list[Outcome]:
    pending = [c for c in batch if c.status == ToolCallStatus.PENDING]
    if pending:
        with transaction.atomic():
            now = timezone.now()
            for call in pending:
                tool_call_transition(tool_call=call, to=ToolCallStatus.RUNNING, lease_token=lease.token, started_at=now)
            run_phase_enter(run=run, phase=RunPhase.EXECUTING_TOOLS, lease_token=lease.token,
                            events_after=[tool_call_event(c) for c in pending])
    if len(batch) == 1:
        return [_read_once(run, batch[0], lease.token)]
    with ThreadPoolExecutor(max_workers=min(8, len(batch))) as pool:
        # Each read in a copy of this thread's context: its span is the slice's child, its log
        # lines carry the run's ids.
        contexts = [contextvars.copy_context() for _ in batch]
        return list(pool.map(lambda c, ctx: ctx.run(_read_once, run, c, lease.token), batch, contexts))


class Frozen(Exception):
    """A freeze stops this write (SPEC §18); nothing was written or sent."""

    def __init__(self, freeze: Freeze):
        super().__init__(f"{freeze.scope} {freeze.target} is frozen")
        self.freeze = freeze


def _write_execute(*, run: Run, lease: Lease, call: ToolCall, tool, requirement: RuleMatch | None = None) -> Outcome:
    with transaction.atomic():
        # Under the freeze gate (shared): a freeze committed before this point stops the write.
        state.freeze_gate()
        version = run_agent_version(run)
        customer = session_customer(str(run.session_id))
        freeze = freeze_active(tool_name=call.tool_name, agent_slug=version.agent.slug if version else "",
                               customer_username=customer.username if customer else "")
        if freeze is not None:
            raise Frozen(freeze)
        if not tool_call_transition(tool_call=call, to=ToolCallStatus.RUNNING, lease_token=lease.token,
                                    started_at=timezone.now(), attempts=call.attempts + 1):
            raise CheckpointStale(f"tool call {call.id} is no longer {call.status}")
        # A phase change is a lifecycle event (SPEC §3): a run resumed straight into a tool call
        # shows `running / executing_tools` in its event log, not only in its row.
        run_phase_enter(run=run, phase=RunPhase.EXECUTING_TOOLS, lease_token=lease.token, events_after=[tool_call_event(
            call, idempotency_key=call.idempotency_key,
            # A write an agent's rule let through unapproved says which rule, and why.
            **({"approval_rule": requirement.rule, "approval_reason": requirement.reason}
               if requirement is not None and requirement.rule and requirement.approval == ApprovalRequirement.NONE else {}),
        )])
    fault_point("after_key_commit")
    arguments = tool.arguments.model_validate(call.arguments)
    stack, current = _tool_span(run, call, lease.token)
    with stack:
        try:
            result = _within_timeout(tool, _context(run, call, tool), arguments)
            outcome = Outcome(call=call, status=ToolCallStatus.SUCCEEDED, result=result, attempts=call.attempts)
        except ToolError as error:
            outcome = Outcome(call=call, status=ToolCallStatus.FAILED, error_code=error.code, error_detail=error.detail, attempts=call.attempts)
        except ToolOutcomeUnknown as error:
            outcome = Outcome(call=call, status=ToolCallStatus.UNKNOWN, error_code="outcome_unknown", error_detail=error.detail, attempts=call.attempts)
        except ToolTimedOut as error:
            outcome = Outcome(call=call, status=ToolCallStatus.UNKNOWN, error_code=error.code, error_detail=error.detail, attempts=call.attempts)
        except Exception as error:  # noqa: BLE001 - after sending, anything unexpected is "we don't know"
            logger.exception("write tool %s raised unexpectedly", call.tool_name)
            outcome = Outcome(call=call, status=ToolCallStatus.UNKNOWN, error_code="outcome_unknown", error_detail=repr(error)[:2000], attempts=call.attempts)
        span_set(current, status=outcome.status, attempts=outcome.attempts, error_code=outcome.error_code or None)
    fault_point("after_downstream_call")
    return outcome


def _apply_outcome(outcome: Outcome, *, lease: Lease) -> None:
    call = outcome.call
    if not tool_call_transition(
        tool_call=call, to=outcome.status, lease_token=lease.token, result=outcome.result, error_code=outcome.error_code,
        error_detail=outcome.error_detail, attempts=outcome.attempts, finished_at=timezone.now(),
    ):
        # Only this lease holder moves an open call of its run; a miss means the checkpoint was stale.
        raise CheckpointStale(f"tool call {call.id} changed under the lease holder")


def _finish(*, cp: Checkpoint, lease: Lease, outcomes: list[Outcome]) -> None:
    """One commit: the outcomes and their tool messages, then the start of whatever comes
    next — the following reads marked running, or the next model step opened."""
    run = cp.run
    done = {o.call.pk for o in outcomes}
    remaining = [c for c in cp.open_tool_calls if c.pk not in done]
    if (not remaining and budget_left(run) and run.cancel_requested_at is None
            and all(o.call.effect == ToolEffect.READ for o in outcomes)
            and cp.carry(state.reads_finished(cp=cp, lease=lease, outcomes=outcomes))):
        return  # the hot path: one statement (engine/state/fast.py)
    with transaction.atomic():
        for outcome in outcomes:
            _apply_outcome(outcome, lease=lease)
        messages_append(session_id=run.session_id, messages=[tool_call_message(o.call) for o in outcomes])
        events = [tool_call_event(o.call) for o in outcomes]
        # The lease is extended by the heartbeat, not here: keeping the indexed lease_expires_at
        # out of checkpoints lets PostgreSQL update the run row in place (HOT).
        if remaining:
            now = timezone.now()
            for call in _leading_reads(remaining):
                if call.status == ToolCallStatus.PENDING:
                    tool_call_transition(tool_call=call, to=ToolCallStatus.RUNNING, lease_token=lease.token, started_at=now)
                    events.append(tool_call_event(call))
            run_write(run_id=run.id, events=events, lease_token=lease.token)
            return
        step_transition(step=cp.tools_step, to=StepStatus.COMPLETED, lease_token=lease.token)
        events.append((RunEventType.STEP_COMPLETED, {"step": cp.tools_step.index, "kind": StepKind.TOOLS}))
        if not budget_left(run) or run.cancel_requested_at is not None:
            run_write(run_id=run.id, events=events, lease_token=lease.token)
            return
        # The same commit opens the next model step (one commit per step).
        index = run.step_count
        step_create(run_id=run.id, index=index, kind=StepKind.MODEL, lease_token=lease.token)
        events.append((RunEventType.STEP_STARTED, {"step": index, "kind": StepKind.MODEL}))
        run_phase_enter(run=run, phase=RunPhase.CALLING_MODEL, lease_token=lease.token, events_before=events,
                        changes={"model_calls": run.model_calls + 1, "step_count": index + 1}, announce_unchanged=True)
    run.model_calls += 1
    run.step_count += 1
