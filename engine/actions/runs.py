"""Starting, resuming and ending runs: the changes that touch a run, its session's history and
pending input, its tool calls and approvals at once. `run_end` is the one way any run ends."""

from datetime import timedelta
from typing import Any, Iterable

from django.db import transaction
from django.utils import timezone

from access import policy as access
from agents.selectors import agent_current_version
from approvals_app.models import Approval, ApprovalStatus
from approvals_app.selectors import run_outcome
from approvals_app.services import audit_record
from config.errors import WardenError
from engine.guards import retried_runs
from engine.queue import run_enqueue
from engine.state import (
    approval_close, input_consume, run_create, run_ending_outcome, run_event_append, run_row_lock, run_transition,
    step_discard, tool_call_transition,
)
from runs_app.errors import RunRefusal
from runs_app.events import RunEventType
from runs_app.models import ACTIVE_STATUSES, DEADLINE_PAUSED_WAITS, TERMINAL_STATUSES, Run, RunStatus, Step, StepStatus
from runs_app.services import RunBudgetsOverCap, run_budgets_over_caps
from sessions_app.models import InputDisposition, Message, MessageRole, PendingInput, Session
from sessions_app.selectors import pending_inputs_meant_for_the_active_run
from sessions_app.services import messages_append, pending_inputs_hold, session_create, session_lock
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect
from tools_app.selectors import applied_effects, writes_in_doubt
from tools_app.services import tool_call_message


class WriteInDoubt(RuntimeError):
    """A run may not fail or be cancelled while one of its writes may have reached the
    downstream system unrecorded: it is recovered and reconciled first (SPEC §9, §10)."""


def run_start(*, session: Session, content: str, acting_user, budgets=None, provider_options=None) -> tuple[Run, Message]:
    """A new queued run whose first message is the user's `content`, enqueued after commit.
    The caller holds the session lock; the database's partial unique index refuses a second
    active run in the session whatever happens."""
    run = run_create(session=session, created_by=acting_user, budgets=budgets, provider_options=provider_options,
                     budgets_set_by=acting_user if budgets else None, agent_version=agent_current_version(agent_id=session.agent_id))
    (message,) = messages_append(session_id=session.pk, messages=[Message(role=MessageRole.USER, content=content, run=run)])
    run_enqueue(run.id)
    return run, message


def run_start_next(*, session_id) -> Run | None:
    """After a run ends, the oldest unconsumed input (queued, or arrived too late for the run)
    starts the next run, in arrival order — in the same transaction as the end, so an input can
    never fall between two runs."""
    pending = (
        PendingInput.objects.select_for_update().filter(session_id=session_id, consumed_at__isnull=True).order_by("id").first()
    )
    if pending is None:
        return None
    session = Session.objects.get(pk=session_id)
    run, message = run_start(session=session, content=pending.content, acting_user=pending.submitted_by)
    input_consume(pending=pending, run_id=run.id, disposition=InputDisposition.NEW_RUN,
                  resolved_mode=pending.resolved_mode or pending.mode, message=message)
    return run


def run_retry(*, run: Run, acting_user, budgets: dict | None = None, reason: str = "") -> Run:
    """Try a failed or cancelled run again from its last checkpoint, as a new run in the same
    session (SPEC §16): it starts from the session's history — what the old run learnt is there —
    and a write the old run applied is reused by its idempotency key, never made again
    (engine.tool_exec.tool_calls_create). The new run links to the old one; the retry is
    audited, naming who asked. The budgets are the old run's unless given; given ones are held to
    the deployment's caps (RunBudgetsOverCap) unless the caller may exceed them, as when posting a
    message, and the new run records who set them."""
    if budgets and not access.may_exceed_budget_caps(acting_user):
        if over := run_budgets_over_caps(budgets=budgets):
            raise RunBudgetsOverCap(over)
    with transaction.atomic():
        session_lock(session_id=run.session_id)
        run = run_row_lock(run_id=run.pk)
        if run.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise WardenError(RunRefusal.NOT_RETRYABLE, f"Only a failed or cancelled run can be retried; this one is {run.status}.")
        if Run.objects.filter(session_id=run.session_id, status__in=ACTIVE_STATUSES).exists():
            raise WardenError(RunRefusal.NOT_RETRYABLE, "The session has an active run; retry once it has ended.")
        limits = {"max_model_calls": run.max_model_calls, "max_tokens": run.max_tokens, **(budgets or {})}
        # The retry goes on with what the run was started with: its agent version too.
        retry = run_create(session=run.session, created_by=acting_user, provider=run.provider,
                           provider_options=run.provider_options, budgets=limits, agent_version=run.agent_version,
                           budgets_set_by=acting_user if budgets else run.budgets_set_by, retry_of=run)
        run_event_append(run_id=run.id, events=[(RunEventType.RUN_RETRIED, {"retry": str(retry.id),
                                                                            "by": getattr(acting_user, "username", None)})])
        run_event_append(run_id=retry.id, events=[(RunEventType.RUN_RETRIED, {"retry_of": str(run.id),
                                                                              "by": getattr(acting_user, "username", None)})])
        audit_record(actor=acting_user, action="retry", obj=run, run_id=run.id, before={"status": run.status},
                     after={"retry": str(retry.id)}, note=reason)
        run_enqueue(retry.id)
    return retry


def run_fork(*, run: Run, acting_user, reason: str = "") -> Run:
    """Run an ended run's conversation again from the input that started it, as a new run in a new
    session of the same customer (SPEC §18): the session gets the history before that input and the
    input itself, and the run its agent version, provider and budgets. It starts afresh — nothing of
    the old run's steps is reused — except what the deployment knows: a write with a business key the
    old run (or anyone) asked for is answered with that call's outcome, never made again; a write
    without one is the fork's own. The fork links to the old run, both runs say so, and it is
    audited, naming who forked it and why."""
    with transaction.atomic():
        session_lock(session_id=run.session_id)
        run = run_row_lock(run_id=run.pk)
        if not run.is_terminal:
            raise WardenError(RunRefusal.NOT_FORKABLE, f"Only an ended run can be forked; this one is {run.status}.")
        origin = _input_of(run)
        if origin is None:
            raise WardenError(RunRefusal.NOT_FORKABLE, "This run has no message of the customer's to start a fork from.")
        source = Session.objects.select_related("owner", "agent").get(pk=run.session_id)
        session = session_create(owner=source.owner, title=f"{source.title or 'Session'} (fork)"[:200], agent=source.agent)
        fork = run_create(session=session, created_by=acting_user, provider=run.provider, provider_options=run.provider_options,
                          budgets={"max_model_calls": run.max_model_calls, "max_tokens": run.max_tokens},
                          agent_version=run.agent_version, budgets_set_by=run.budgets_set_by, forked_from=run)
        history = Message.objects.filter(session_id=source.pk, seq__lt=origin.seq).order_by("seq")
        messages_append(session_id=session.pk, messages=[
            Message(role=m.role, content=m.content, tool_calls=m.tool_calls, tool_call_id=m.tool_call_id,
                    tool_name=m.tool_name) for m in history
        ] + [Message(role=MessageRole.USER, content=origin.content, run=fork)])
        by = getattr(acting_user, "username", None)
        run_event_append(run_id=run.id, events=[(RunEventType.RUN_FORKED, {"fork": str(fork.id), "session": str(session.pk),
                                                                           "by": by})])
        run_event_append(run_id=fork.id, events=[(RunEventType.RUN_FORKED, {"fork_of": str(run.id), "by": by})])
        audit_record(actor=acting_user, action="fork", obj=run, run_id=run.id, before={"status": run.status},
                     after={"fork": str(fork.id), "session": str(session.pk)}, note=reason)
        run_enqueue(fork.id)
    return fork


def _input_of(run: Run) -> Message | None:
    """The customer's message that started `run` — or the run it retries, and so on back."""
    ids = [run.pk, *(parent.pk for parent in retried_runs(run))]
    return Message.objects.filter(run_id__in=ids, role=MessageRole.USER).order_by("seq").first()


def run_resume(*, run_id, wait_reasons: Iterable[str], event_payload: dict | None = None) -> bool:
    """Wake a suspended run (approval decided, question answered, reconciliation done, backoff
    over): it goes back to the queue — the same run, never a new one — and a worker is asked for
    after commit. Time spent waiting for a person is given back to the run's deadline."""
    with transaction.atomic():
        run = run_row_lock(run_id=run_id)
        if run is None or run.status != RunStatus.WAITING or run.wait_reason not in set(wait_reasons):
            return False
        changes = {}
        if run.wait_reason in DEADLINE_PAUSED_WAITS and run.wait_started_at is not None:
            waited = max(timezone.now() - run.wait_started_at, timedelta(0))
            changes["deadline"] = run.deadline + waited
        run_transition(run=run, to=RunStatus.QUEUED, event_payload={
            "resumed_from": run.wait_reason, **(event_payload or {}),
            **({"deadline": changes["deadline"].isoformat()} if changes else {}),
        }, **changes)
        run_enqueue(run.id)
    return True


def run_end(
    *,
    run: Run,
    to: str,
    lease_token: int | None,
    error_code: str = "",
    error_detail: str = "",
    changes: dict[str, Any] | None = None,
    events_before: Iterable[tuple[str, dict]] = (),
) -> bool:
    """End `run` as completed, failed or cancelled — the one way any run ends. One transaction:
    the session's lock (taken before the run's row, as posting input takes it, so input posted
    at this moment either sees the run ended or is seen here), everything that will never start
    closed (a failed or cancelled run), the terminal transition with the writes that took
    effect, and the next run started from pending input. Input meant for a cancelled run (its
    supplements) is held for its user to choose — send it as a new request or drop it — never
    started out of context; queued requests and an intent switch start as before. False when the run had already moved
    on (someone else ended it, or the lease is gone without `lease_token`). The run's outcome
    (tools_app.selectors.run_outcome) is stored with the terminal status and told in its event."""
    if to not in TERMINAL_STATUSES:
        raise ValueError(f"run_end ends runs; {to!r} is not a terminal status")
    values: dict[str, Any] = dict(changes or {})
    payload: dict[str, Any] = {}
    with transaction.atomic(savepoint=False):  # all or nothing with the caller's commit
        session_lock(session_id=run.session_id)
        if to != RunStatus.COMPLETED:
            if writes_in_doubt(run_id=run.id).exists():
                raise WriteInDoubt(f"run {run.id} has a write in doubt; it is reconciled before the run ends")
            _close_unstarted(run=run, lease_token=lease_token, ending=to)
            payload["applied_effects"] = applied_effects(run_id=run.id)
        if to == RunStatus.FAILED:
            values |= {"error_code": error_code, "error_detail": error_detail[:2000]}
        held: list[int] = []
        if to == RunStatus.CANCELLED:
            payload["reason"] = run.cancel_reason
            # Read under the session's lock: no input can be posted between this and the hold.
            held = [item.pk for item in pending_inputs_meant_for_the_active_run(session_id=run.session_id)]
            if held:
                payload["held_inputs"] = held
        run_ending_outcome(values, payload, outcome=run_outcome(run_id=run.id))
        ended = run_transition(run=run, to=to, lease_token=lease_token, event_payload=payload,
                               events_before=events_before, **values)
        if ended:
            if held:
                pending_inputs_hold(pending_ids=held, run_id=run.id)
            run_start_next(session_id=run.session_id)
    return ended


def _close_unstarted(*, run: Run, lease_token: int | None, ending: str) -> None:
    """A run is ending early: open approval requests are withdrawn (nobody decided them, so
    they are neither rejected in the name of whoever cancelled nor expired), calls that never
    started are cancelled with tool messages (the history holds no dangling call), running
    steps are discarded."""
    code = "run_cancelled" if ending == RunStatus.CANCELLED else "run_failed"
    why = "the run was cancelled" if ending == RunStatus.CANCELLED else "the run failed"
    withdrawn_by = run.cancel_requested_by if ending == RunStatus.CANCELLED else None
    for approval in Approval.objects.filter(run_id=run.id, status=ApprovalStatus.PENDING):
        approval_close(approval=approval, to=ApprovalStatus.WITHDRAWN, decided_by=withdrawn_by,
                       note=code.replace("_", " "), lease_token=lease_token)
    closed = []
    for call in ToolCall.objects.filter(run_id=run.id, status__in=[ToolCallStatus.PENDING, ToolCallStatus.RUNNING]):
        if call.status == ToolCallStatus.RUNNING and call.effect == ToolEffect.WRITE:
            continue  # unreachable past run_end's check; never pretend a started write did not start
        if tool_call_transition(tool_call=call, to=ToolCallStatus.CANCELLED, lease_token=lease_token, announce=True,
                                error_code=code, error_detail=f"{why} before this call started"):
            closed.append(call)
    if closed:
        messages_append(session_id=run.session_id, messages=[tool_call_message(c) for c in closed])
    for step in Step.objects.filter(run_id=run.id, status=StepStatus.RUNNING):
        # Its step_discarded event is not logged: the run's ending says it all.
        step_discard(step=step, reason=code.replace("_", " "), lease_token=lease_token)
