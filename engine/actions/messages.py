"""The user says something (SPEC §8): a new run, or input for the active one."""

from dataclasses import dataclass

from django.db import transaction

from access import policy as access
from approvals_app.services import audit_record
from config.errors import WardenError
from agents.selectors import agent_current_version
from engine.actions.cancel import run_cancel_request
from engine.actions.runs import run_resume, run_start
from engine.state import input_resolve, run_event_append, run_row_lock, tool_call_transition
from runs_app.events import RunEventType
from runs_app.models import ACTIVE_STATUSES, Run, RunStatus, WaitReason
from runs_app.services import RunBudgetsOverCap, run_budgets_over_caps
from sessions_app.models import InputDisposition, InputMode, Message, MessageRole, PendingInput, Session
from sessions_app.errors import SessionRefusal
from sessions_app.services import (
    held_input_drop as held_input_drop_record, held_input_lock, held_input_sent, message_text_checked, messages_append,
    session_lock,
)
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.services import tool_call_event, tool_call_message


@dataclass
class PostResult:
    disposition: str  # "started_run", "answered" (the run's question) or "pending"
    run: Run
    message: Message | None = None
    pending_input: PendingInput | None = None


def message_post(
    *,
    session: Session,
    content: str,
    mode: str = InputMode.AUTO,
    acting_user,
    budgets: dict | None = None,
    provider_options: dict | None = None,
) -> PostResult:
    """With no active run the message starts one (queued, enqueued after commit); while a run
    is active the input is stored as pending — never lost, never a second concurrent run — and
    the run reads it at its next safe point. A run waiting for the user's answer to its question
    takes the message as the answer and resumes (`auto` or `supplement`). An intent switch for a
    run nobody is driving (it waits for a person, or is queued) cancels it at once; the input
    then starts the next run. Requested `budgets` above the deployment's caps are refused
    (RunBudgetsOverCap) unless the poster may exceed them; the run records who set them."""
    content = message_text_checked(content=content, mode=mode)
    budgets = budgets or None
    if budgets and not access.may_exceed_budget_caps(acting_user):
        if over := run_budgets_over_caps(budgets=budgets, agent_version=agent_current_version(agent_id=session.agent_id)):
            raise RunBudgetsOverCap(over)
    with transaction.atomic():
        # Lock the session: two posts at once must not both see "no active run".
        session_lock(session_id=session.pk)
        active = Run.objects.filter(session_id=session.pk, status__in=ACTIVE_STATUSES).first()
        if active is None:
            run, message = run_start(session=session, content=content, acting_user=acting_user, budgets=budgets,
                                     provider_options=provider_options)
            return PostResult(disposition="started_run", run=run, message=message)
        if (active.status == RunStatus.WAITING and active.wait_reason == WaitReason.WAITING_INPUT
                and mode in (InputMode.AUTO, InputMode.SUPPLEMENT)):
            message = _answer(run=active, content=content)
            if message is not None:
                return PostResult(disposition="answered", run=active, message=message)
        pending = PendingInput.objects.create(session=session, content=content, mode=mode, submitted_by=acting_user)
        run_event_append(run_id=active.id, events=[
            (RunEventType.INPUT_QUEUED, {"pending_input": pending.id, "mode": mode, "content": content})])
        if mode == InputMode.NEW_INTENT and active.status != RunStatus.RUNNING:
            input_resolve(pending_id=pending.pk, mode=InputMode.NEW_INTENT)
            run_cancel_request(run=active, acting_user=acting_user, reason=f"intent switch: {content[:200]}")
        return PostResult(disposition="pending", run=active, pending_input=pending)


def held_input_send(*, pending: PendingInput, acting_user) -> PostResult:
    """The user chose to send input held from a cancelled run as a new request: posted again as
    a queued request through message_post — it starts a run now, or waits for the active one to
    end — and the held input records it. Audited. Refused (409) once sent or dropped."""
    with transaction.atomic():
        session_lock(session_id=pending.session_id)
        held = _held(pending)
        session = Session.objects.get(pk=held.session_id)
        result = message_post(session=session, content=held.content, mode=InputMode.QUEUE, acting_user=acting_user)
        started = result.disposition == "started_run"
        held_input_sent(pending=held, run_id=result.run.id if started else None, message=result.message if started else None)
        audit_record(actor=acting_user, action="input_send", obj=held, run_id=held.held_from_id,
                     before={"disposition": InputDisposition.HELD},
                     after={"disposition": InputDisposition.NEW_RUN, "run": str(result.run.id), "started": started})
    return result


def held_input_drop(*, pending: PendingInput, acting_user) -> PendingInput:
    """The user chose to drop input held from a cancelled run: nothing starts, and the input stays
    in the session's record as discarded. Audited. Refused (409) once sent or dropped."""
    with transaction.atomic():
        session_lock(session_id=pending.session_id)
        held = _held(pending)
        held_input_drop_record(pending=held)
        audit_record(actor=acting_user, action="input_drop", obj=held, run_id=held.held_from_id,
                     before={"disposition": InputDisposition.HELD}, after={"disposition": InputDisposition.DISCARDED})
    held.refresh_from_db()
    return held


def _held(pending: PendingInput) -> PendingInput:
    held = held_input_lock(pending_id=pending.pk)
    if held is None:
        raise WardenError(SessionRefusal.INPUT_NOT_HELD, "This input was already sent or dropped.")
    return held


def _answer(*, run: Run, content: str) -> Message | None:
    """The user's reply to the question the run waits on: it closes the ask_user call (the tool
    message the model reads) and is kept as the user's own message; the same run resumes. None
    when the question is no longer open (answered or expired meanwhile)."""
    run = run_row_lock(run_id=run.pk)
    if run.status != RunStatus.WAITING or run.wait_reason != WaitReason.WAITING_INPUT:
        return None
    call = ToolCall.objects.filter(pk=run.request_id, status=ToolCallStatus.PENDING).first()
    if call is None or not tool_call_transition(tool_call=call, to=ToolCallStatus.SUCCEEDED, result={"answer": content}):
        return None
    # The tool message first: it must follow the assistant message that asked.
    _, message = messages_append(session_id=run.session_id, messages=[
        tool_call_message(call), Message(role=MessageRole.USER, content=content, run_id=run.id),
    ])
    run_event_append(run_id=run.id, events=[
        tool_call_event(call),
        (RunEventType.INPUT_ANSWERED, {"tool_call": str(call.id), "question": call.arguments.get("question", ""),
                                       "message_seq": message.seq, "content": content}),
    ])
    run_resume(run_id=run.id, wait_reasons=[WaitReason.WAITING_INPUT], event_payload={"tool_call": str(call.id)})
    return message


def input_wait_expire(*, run_id) -> bool:
    """Nobody answered the run's question in time: the ask_user call fails as `input_expired`
    (the model is told, and answers without it) and the same run resumes."""
    with transaction.atomic():
        session_id = Run.objects.values_list("session_id", flat=True).get(pk=run_id)
        session_lock(session_id=session_id)  # as posting the answer does: the two never cross
        run = run_row_lock(run_id=run_id)
        if run.status != RunStatus.WAITING or run.wait_reason != WaitReason.WAITING_INPUT:
            return False
        call = ToolCall.objects.filter(pk=run.request_id, status=ToolCallStatus.PENDING).first()
        if call is not None and tool_call_transition(
            tool_call=call, to=ToolCallStatus.FAILED, error_code="input_expired",
            error_detail=f"the user did not answer before {run.expires_at.isoformat() if run.expires_at else 'the question expired'}",
        ):
            messages_append(session_id=run.session_id, messages=[tool_call_message(call)])
            run_event_append(run_id=run.id, events=[tool_call_event(call)])
        return run_resume(run_id=run.id, wait_reasons=[WaitReason.WAITING_INPUT],
                          event_payload={"tool_call": str(call.id) if call else None, "expired": True})
