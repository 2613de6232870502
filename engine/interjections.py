"""User input that arrives while a run is busy, read only at safe points (SPEC §8)."""

from django.db import transaction

from agents.selectors import run_agent_version
from engine.context import context_build
from engine.state import (
    input_consume, input_resolve, run_cancel_request, run_event_append, run_seen_by_lease_holder, run_touched_by_others,
)
from runs_app.events import RunEventType
from runs_app.endpoints import run_endpoint
from runs_app.models import Run
from runs_app.providers import get_provider
from runs_app.providers.base import PermanentModelError
from runs_app.providers.rules import classify_input_by_rules
from sessions_app.models import InputDisposition, InputMode, Message, MessageRole, PendingInput
from sessions_app.services import messages_append


def inputs_at_safe_point(*, run: Run, lease, before: str) -> bool:
    """Apply pending input in arrival order. Supplements join the history (before a model call
    only); an intent switch requests this run's cancellation and stays pending, to start the
    next run; a queued input waits for the run to end and holds back those after it.
    Returns True when something changed and the checkpoint must be read again."""
    if not run_touched_by_others(run):
        return False  # nobody wrote to the run since our last write: no input can be waiting
    pending = list(PendingInput.objects.filter(session_id=run.session_id, consumed_at__isnull=True).order_by("id"))
    if not pending:
        # Input queued after this checkpoint was loaded bumps event_seq past what we saw.
        run_seen_by_lease_holder(run)
    changed = False
    for item in pending:
        mode = item.resolved_mode or item.mode
        if mode == InputMode.AUTO:
            mode = _classify(run=run, lease=lease, item=item)
        if mode == InputMode.QUEUE:
            break
        if mode == InputMode.NEW_INTENT:
            _request_cancel_for(run=run, lease=lease, item=item)
            return True
        if before != "model":
            break
        with transaction.atomic():
            (message,) = messages_append(
                session_id=run.session_id, messages=[Message(role=MessageRole.USER, content=item.content, run_id=run.id)]
            )
            input_consume(pending=item, run_id=run.id, disposition=InputDisposition.SUPPLEMENTED,
                          resolved_mode=InputMode.SUPPLEMENT, message=message)
            run_event_append(run_id=run.id, lease_token=lease.token, events=[(RunEventType.INPUT_APPLIED, {
                "pending_input": item.pk, "mode": InputMode.SUPPLEMENT, "message_seq": message.seq, "content": item.content,
            })])
        changed = True
    return changed


def _classify(*, run: Run, lease, item: PendingInput) -> str:
    """By the run's model, or — when its agent version chose `keywords` — by the run-time's
    keyword rules, with no model call."""
    version = run_agent_version(run)
    history = context_build(session_id=run.session_id,
                            instructions=version.instructions if version is not None else None).messages
    if version is not None and version.interjection_classifier == "keywords":
        verdict = classify_input_by_rules(history=history, text=item.content)
    else:
        verdict = _model_classification(run=run, history=history, text=item.content)
    mode = verdict.mode if verdict.mode in (InputMode.SUPPLEMENT, InputMode.NEW_INTENT) else InputMode.SUPPLEMENT
    with transaction.atomic():
        input_resolve(pending_id=item.pk, mode=mode, reason=verdict.reason)
        run_event_append(run_id=run.id, lease_token=lease.token, events=[
            (RunEventType.INPUT_CLASSIFIED, {"pending_input": item.pk, "mode": mode, "reason": verdict.reason})])
    item.resolved_mode = mode
    return mode


def _model_classification(*, run: Run, history: list[dict], text: str):
    """By the run's model; by the keyword rules when its endpoint cannot be called at all (gone, or
    its credential unreadable: the model step fails the run saying so)."""
    try:
        provider = get_provider(run.provider, endpoint=run_endpoint(run))
    except PermanentModelError:
        return classify_input_by_rules(history=history, text=text)
    return provider.classify_input(history=history, text=text)


def _request_cancel_for(*, run: Run, lease, item: PendingInput) -> None:
    """An intent switch the run read at its safe point: the input stays pending (it starts the next
    run) and this run's cancellation is requested — in the poster's name, since it is their ask."""
    with transaction.atomic():
        input_resolve(pending_id=item.pk, mode=InputMode.NEW_INTENT)
        run_cancel_request(run=run, by_id=item.submitted_by_id, by_username=None, lease_token=lease.token,
                           reason=f"intent switch: {item.content[:200]}", event_extra={"pending_input": item.pk})
