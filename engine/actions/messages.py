"""The user says something (SPEC §8): a new run, or input for the active one."""

from dataclasses import dataclass

from django.db import transaction

from engine.actions.cancel import run_cancel_request
from engine.actions.runs import run_start
from runs_app.events import RunEventType
from runs_app.models import ACTIVE_STATUSES, Run, RunStatus
from runs_app.services import RunBudgetsOverCap, run_budgets_over_caps, run_event_append
from sessions_app import access
from sessions_app.models import InputMode, Message, PendingInput, Session
from sessions_app.services import message_text_checked, session_lock


@dataclass
class PostResult:
    disposition: str  # "started_run" or "pending"
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
    the run reads it at its next safe point. An intent switch for a run nobody is driving (it
    waits for a person, or is queued) cancels it at once; the input then starts the next run.
    Requested `budgets` above the deployment's caps are refused (RunBudgetsOverCap) unless the
    poster may exceed them; the run records who set them."""
    content = message_text_checked(content=content, mode=mode)
    budgets = budgets or None
    if budgets and not access.may_exceed_budget_caps(acting_user):
        if over := run_budgets_over_caps(budgets=budgets):
            raise RunBudgetsOverCap(over)
    with transaction.atomic():
        # Lock the session: two posts at once must not both see "no active run".
        session_lock(session_id=session.pk)
        active = Run.objects.filter(session_id=session.pk, status__in=ACTIVE_STATUSES).first()
        if active is None:
            run, message = run_start(session=session, content=content, acting_user=acting_user, budgets=budgets,
                                     provider_options=provider_options)
            return PostResult(disposition="started_run", run=run, message=message)
        pending = PendingInput.objects.create(session=session, content=content, mode=mode, submitted_by=acting_user)
        run_event_append(run_id=active.id, kind=RunEventType.INPUT_QUEUED,
                         payload={"pending_input": pending.id, "mode": mode, "content": content})
        if mode == InputMode.NEW_INTENT and active.status != RunStatus.RUNNING:
            PendingInput.objects.filter(pk=pending.pk).update(resolved_mode=InputMode.NEW_INTENT)
            run_cancel_request(run=active, acting_user=acting_user, reason=f"intent switch: {content[:200]}")
        return PostResult(disposition="pending", run=active, pending_input=pending)
