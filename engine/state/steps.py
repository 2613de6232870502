"""Steps and tool calls: their one write path each (STEP_TRANSITIONS, TOOL_CALL_TRANSITIONS), fenced
by the run's lease; a step discarded (the named change: its output is never acted on); a model
turn's tool calls inserted; an approval closed and logged on its run.

A change under a lease checks the token in its own statement; the transaction's run write (which
every step boundary has, to log its events) checks it again under the run row's lock, so a
revocation committed in between rolls the whole step back.
"""

from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from approvals_app.ledger import ledger_tool_call_outcome
from approvals_app.models import Approval
from approvals_app.services import APPROVAL_OUTCOME_EVENTS, approval_event_payload, approval_transition
from config.tracing import span_record
from engine.state.runs import _run_update, require_transaction
from runs_app.events import RunEventType
from runs_app.models import Run, Step, StepStatus
from runs_app.transitions import STEP_TRANSITIONS, LeaseLost, check_transition
from tools_app.models import FINAL_TOOL_CALL_STATUSES, ToolCall, ToolCallStatus
from tools_app.services import tool_call_event
from tools_app.transitions import check_tool_call_transition


def _lease_fenced_update(rows: QuerySet, *, run_id, lease_token: int | None, values: dict[str, Any]) -> bool:
    """UPDATE `rows` — one row of a run's (a step, a tool call), filtered by the status it was read
    in — only while `lease_token`, when given, is still the run's. False when the row had moved
    on; LeaseLost when the lease is gone (then nothing was written)."""
    if lease_token is not None:
        rows = rows.filter(Exists(Run.objects.filter(pk=OuterRef("run_id"), lease_token=lease_token)))
    if rows.update(**values):
        return True
    if lease_token is not None and not Run.objects.filter(pk=run_id, lease_token=lease_token).exists():
        raise LeaseLost(f"run {run_id}: lease token {lease_token} no longer current")
    return False


# --- steps ----------------------------------------------------------------------------------------

def step_create(*, run_id, index: int, kind: str, lease_token: int) -> Step:
    """A new step, `running` from the start (its model call or tool batch has begun). The
    caller's transaction also carries the run write that counts it (step_count)."""
    require_transaction("step_create")
    return Step.objects.create(run_id=run_id, index=index, kind=kind, status=StepStatus.RUNNING, lease_token=lease_token)


def step_transition_values(*, step: Step, to: str, **changes: Any) -> dict[str, Any]:
    """The columns a move of `step` to `to` sets, after checking STEP_TRANSITIONS (IllegalTransition
    otherwise). `step_transition` writes them; the one-statement commits (engine/state/fast.py)
    write the same values under the same fence, composed into one statement."""
    check_transition(STEP_TRANSITIONS, "step", step.status, to)
    values: dict[str, Any] = {"status": to, **changes}
    if to != StepStatus.RUNNING:
        values.setdefault("finished_at", timezone.now())
    return values


def step_transition(*, step: Step, to: str, lease_token: int | None = None, **changes: Any) -> bool:
    """Move `step` from the status we read to `to`: one conditional UPDATE, fenced (with
    `lease_token`) by the run's lease. False when someone else moved the step first;
    IllegalTransition for a move STEP_TRANSITIONS forbids; LeaseLost when the lease is gone."""
    require_transaction("step_transition")
    values = step_transition_values(step=step, to=to, **changes)
    if not _lease_fenced_update(Step.objects.filter(pk=step.pk, status=step.status), run_id=step.run_id,
                                lease_token=lease_token, values=values):
        return False
    for field, value in values.items():
        setattr(step, field, value)
    return True


def step_discard(*, step: Step, reason: str, lease_token: int | None, **recorded: Any) -> tuple[str, dict]:
    """Throw a running step's output away (SPEC §3, §10: truncated or malformed output, a worker
    lost mid-stream, a slice that ended before the model was called, a run that ended): the step
    becomes `discarded` with its reason and what was `recorded` of it (tokens, text, manifest).
    Returns its `step_discarded` event, which the caller's run write carries."""
    step_transition(step=step, to=StepStatus.DISCARDED, lease_token=lease_token, discard_reason=reason[:300], **recorded)
    return RunEventType.STEP_DISCARDED, {"step": step.index, "reason": reason, "previous_lease_token": step.lease_token}


# --- tool calls -----------------------------------------------------------------------------------

def tool_call_transition_values(*, tool_call: ToolCall, to: str, lease_token: int | None = None,
                                **changes: Any) -> dict[str, Any]:
    """The columns a move of `tool_call` to `to` sets, after checking TOOL_CALL_TRANSITIONS
    (IllegalTransition otherwise). `tool_call_transition` writes them; the one-statement commits
    (engine/state/fast.py) write the same values under the same fence."""
    check_tool_call_transition(tool_call.status, to)
    now = timezone.now()
    values: dict[str, Any] = {"status": to, **changes}
    if to == ToolCallStatus.RUNNING:
        if tool_call.started_at is None:
            values.setdefault("started_at", now)
        if lease_token is not None:
            values["lease_token"] = lease_token  # the lease it runs under: a crash is recognised by it (SPEC §10)
    if to in FINAL_TOOL_CALL_STATUSES or to == ToolCallStatus.UNKNOWN:
        values.setdefault("finished_at", now)
    if to == ToolCallStatus.PENDING:
        values.setdefault("finished_at", None)
    return values


def tool_call_transition(
    *, tool_call: ToolCall, to: str, lease_token: int | None = None, announce: bool = False, **changes: Any
) -> bool:
    """Move a tool call from the status we read to `to`. False when someone else moved it
    first; IllegalTransition for a move TOOL_CALL_TRANSITIONS forbids; LeaseLost when
    `lease_token` is no longer the run's. With `announce` the `tool_call` event is written
    here (a write of its own on the run row); otherwise the caller's run write carries it, and
    re-checks the fence under the run row's lock, so a revocation committed meanwhile rolls
    the whole transaction back."""
    values = tool_call_transition_values(tool_call=tool_call, to=to, lease_token=lease_token, **changes)
    if not announce:
        require_transaction("tool_call_transition without announce")
    was = tool_call.status
    with transaction.atomic(savepoint=announce):
        if not _lease_fenced_update(ToolCall.objects.filter(pk=tool_call.pk, status=tool_call.status),
                                    run_id=tool_call.run_id, lease_token=lease_token, values=values):
            return False
        for field, value in values.items():
            setattr(tool_call, field, value)
        # A write's outcome (and its reconciliation, its reuse of an earlier call's) goes on the
        # ledger in this transaction: every status change of a write passes here (fast.py takes
        # reads only).
        ledger_tool_call_outcome(tool_call=tool_call, was=was, acting_user=values.get("resolved_by"))
        if announce:
            _run_update(run_id=tool_call.run_id, events=[tool_call_event(tool_call)], lease_token=lease_token,
                        raise_on_miss=True)
    return True


def tool_calls_start(*, calls: list[ToolCall], lease_token: int) -> None:
    """Mark new (not yet saved) calls `running` under `lease_token`: the leading reads of a model
    turn, begun in the commit that creates them (one commit per step)."""
    now = timezone.now()
    for call in calls:
        for field, value in tool_call_transition_values(tool_call=call, to=ToolCallStatus.RUNNING,
                                                        lease_token=lease_token, started_at=now).items():
            setattr(call, field, value)


def business_keys_lock(keys) -> None:
    """Hold, until the caller's transaction ends, the lock of each key (in one order, so two turns
    never wait on each other crosswise): a business key's — whoever holds it decides alone
    whether the key is new, already answered or to be tried again (the unique idempotency key is
    the backstop) — or a limit's scope (agents.limits), so that two runs never both pass its last
    unit. A turn takes its business keys' locks before its limits'."""
    require_transaction("business_keys_lock")
    with connection.cursor() as cursor:
        for key in sorted(set(keys)):
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [BUSINESS_KEY_LOCK_SPACE, key])


# The first half of the two-number advisory locks on business keys.
BUSINESS_KEY_LOCK_SPACE = 26
# The one lock between freezes and writes starting (SPEC §18).
FREEZE_GATE = (27, 0)


def freeze_gate(*, setting: bool = False) -> None:
    """Until the caller's transaction ends: a write about to start holds the gate shared, a freeze
    being set holds it alone. So a write that starts after a freeze's commit sees it, and a freeze
    commits only once the writes already starting have been marked running."""
    require_transaction("freeze_gate")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_advisory_xact_lock{'' if setting else '_shared'}(%s, %s)", list(FREEZE_GATE))


def tool_calls_insert(*, calls: list[ToolCall]) -> list[ToolCall]:
    """A model turn's calls, in the caller's transaction (the turn's commit): `pending`, or
    `running` as `tool_calls_start` marked them."""
    require_transaction("tool_calls_insert")
    return ToolCall.objects.bulk_create(calls)


# --- approvals: closed, and logged on their run --------------------------------------------------

def approval_close(*, approval: Approval, to: str, decided_by, note: str, lease_token: int | None = None,
                   customer_message: str = "") -> bool:
    """Close a pending approval as `to` (approvals_app.services.approval_transition) and log it on
    its run, in one transaction under the run's fence. False when someone else closed it first
    (nothing is written then); with `lease_token`, LeaseLost when the run's lease is gone."""
    with transaction.atomic():
        if not approval_transition(approval=approval, to=to, decided_by=decided_by, note=note,
                                   customer_message=customer_message):
            return False
        _run_update(run_id=approval.run_id, events=[(APPROVAL_OUTCOME_EVENTS[to], approval_event_payload(approval))],
                    lease_token=lease_token, raise_on_miss=True)
        transaction.on_commit(lambda: _approval_span(approval))
    return True


def _approval_span(approval: Approval) -> None:
    """The human decision's span (docs/OPERATIONS.md, "Traces"): from the request to its outcome,
    with the tier, the wait, and when the deciders were notified, reminded and escalated to."""
    requested, decided = approval.requested_at, approval.decided_at or timezone.now()
    span_record(
        "approval.decision", start=requested, end=decided,
        events=[("requested", requested), ("notified", approval.notified_at), ("reminded", approval.reminded_at),
                ("escalated", approval.escalated_at), (str(approval.status), decided)],
        approval=approval.pk, run_id=approval.run_id, tool_call=approval.tool_call_id, tier=approval.policy,
        required_approvals=approval.required_approvals, outcome=approval.status,
        decided_by=approval.decided_by.get_username() if approval.decided_by_id else None,
        wait_seconds=round((decided - requested).total_seconds(), 3), escalated_to=approval.escalated_to or None,
    )
