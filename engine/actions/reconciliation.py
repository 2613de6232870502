"""Resolving `unknown` write calls (SPEC §6): ask the downstream system by idempotency key, or
let an operator record what happened, with evidence. Then the run resumes."""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from access import policy as access
from agents.selectors import run_agent_version, run_tool
from approvals_app.services import audit_record
from config.errors import WardenError
from engine.actions.runs import run_resume
from engine.state import run_event_append, tool_call_transition
from runs_app.events import RunEventType
from runs_app.models import Run, WaitReason
from sessions_app.services import messages_append, session_lock
from tools_app.errors import ToolCallRefusal
from tools_app.models import Resolution, ToolCall, ToolCallStatus
from tools_app.outcomes import code_text
from tools_app.registry import ToolContext
from tools_app.services import tool_call_event, tool_call_message

logger = logging.getLogger("warden.reconcile")

# Automatic reconciliation gives up after this many inconclusive lookups; then the call waits
# in the operators' unknown-calls queue.
RECONCILE_MAX_AUTO_ATTEMPTS = 8


def tool_call_reconcile_auto(*, tool_call: ToolCall, acting_user=None) -> str:
    """One lookup by idempotency key: by the sweeper, or by an operator ("query downstream
    now", permission and audit required). Returns 'resolved', 'unresolved' or 'manual'."""
    if acting_user is not None:
        _check_reconciler(acting_user, tool_call)
        audit_record(actor=acting_user, action="reconcile_query", obj=tool_call, run_id=tool_call.run_id,
                     before={"status": tool_call.status}, after={"requested": "downstream lookup"})
    run = Run.objects.only("session_id", "agent_version_id").get(pk=tool_call.run_id)
    tool = run_tool(run=run, name=tool_call.tool_name)
    if tool is None or tool.reconcile is None:
        _give_up(tool_call=tool_call, reason="the tool has no reconcile function", changes={})
        return "manual"
    version = run_agent_version(run)
    context = ToolContext(
        run_id=str(tool_call.run_id), session_id=str(run.session_id), tool_call_id=str(tool_call.id),
        idempotency_key=tool_call.idempotency_key, timeout=tool.timeout, agent=version.agent.slug if version else "",
    )
    try:
        verdict = tool.reconcile(context, tool.arguments.model_validate(tool_call.arguments))
    except Exception:  # noqa: BLE001 - an inconclusive lookup is retried later
        logger.warning("reconcile of %s failed", tool_call.id, exc_info=True)
        verdict = None
    premature = verdict is not None and not verdict.applied and _within_grace(tool_call)
    if premature:
        # "Not found" right after the timeout may only mean "not booked yet": the downstream
        # may still be processing the request we gave up waiting for. Only a "not applied"
        # seen after the grace period settles it (and such a look uses up no attempt).
        verdict = None
    if verdict is None:
        attempts = tool_call.reconcile_attempts + (0 if premature else 1)
        delay = min(300, 2**attempts) if not _within_grace(tool_call) else settings.WARDEN_RECONCILE_GRACE_SECONDS / 4
        if attempts >= RECONCILE_MAX_AUTO_ATTEMPTS:
            _give_up(tool_call=tool_call, reason=f"{attempts} inconclusive lookups by idempotency key",
                     changes={"reconcile_attempts": attempts})
            return "manual"
        ToolCall.objects.filter(pk=tool_call.pk, status=ToolCallStatus.UNKNOWN).update(
            reconcile_attempts=attempts, next_attempt_at=timezone.now() + timedelta(seconds=delay)
        )
        return "unresolved"
    detail = verdict.detail or ("downstream has the request under this key" if verdict.applied else "downstream has no such request")
    tool_call_resolve(
        tool_call=tool_call, applied=verdict.applied, result=verdict.result,
        evidence=f"automatic reconciliation by idempotency key {tool_call.idempotency_key}: {detail}", acting_user=None,
    )
    return "resolved"


def _give_up(*, tool_call: ToolCall, reason: str, changes: dict) -> None:
    """Automatic reconciliation stops: the call waits in the operators' unknown-calls queue. The
    first time (the call still had a next lookup planned) the run's log says so — a
    `reconciliation_escalated` event, which notifies whoever subscribed (notifications.outbox)."""
    with transaction.atomic():
        planned = (ToolCall.objects.select_for_update().filter(pk=tool_call.pk, status=ToolCallStatus.UNKNOWN)
                   .values_list("next_attempt_at", flat=True).first())
        ToolCall.objects.filter(pk=tool_call.pk, status=ToolCallStatus.UNKNOWN).update(next_attempt_at=None, **changes)
        if planned is None:
            return
        run_event_append(run_id=tool_call.run_id, events=[(RunEventType.RECONCILIATION_ESCALATED, {
            "tool_call": str(tool_call.id), "tool": tool_call.tool_name, "idempotency_key": tool_call.idempotency_key,
            "reconcile_attempts": changes.get("reconcile_attempts", tool_call.reconcile_attempts), "reason": reason,
        })])
    logger.warning("tool call %s (%s) needs a person to reconcile it: %s", tool_call.id, tool_call.tool_name, reason,
                   extra={"run_id": str(tool_call.run_id), "tool_call_id": str(tool_call.id)})


def _check_reconciler(acting_user, tool_call: ToolCall) -> None:
    """The policy's answer (permission, four eyes), then the call's state."""
    if refusal := access.why_not_a_reconciler(user=acting_user, tool_call=tool_call):
        raise WardenError(ToolCallRefusal.NOT_PERMITTED, refusal)
    if refusal := access.why_cannot_reconcile(user=acting_user, tool_call=tool_call):
        raise WardenError(ToolCallRefusal.NOT_UNKNOWN, refusal)


def _within_grace(tool_call: ToolCall) -> bool:
    since = tool_call.finished_at or tool_call.started_at or tool_call.created_at
    return timezone.now() - since < timedelta(seconds=settings.WARDEN_RECONCILE_GRACE_SECONDS)


def tool_call_resolve(*, tool_call: ToolCall, applied: bool, evidence: str, acting_user, result: dict | None = None) -> ToolCall:
    """Record the truth about an unknown call: applied → succeeded, not applied → failed. A human
    needs the permission, may not be the session's owner (four eyes) and must give evidence; the
    decision is audited. The run resumes once none of its calls is unknown."""
    if acting_user is not None and (refusal := access.why_not_a_reconciler(user=acting_user, tool_call=tool_call)):
        raise WardenError(ToolCallRefusal.NOT_PERMITTED, refusal)
    if not (evidence or "").strip():
        raise WardenError(ToolCallRefusal.EVIDENCE_REQUIRED, "Evidence is required to record an outcome.")
    to = ToolCallStatus.SUCCEEDED if applied else ToolCallStatus.FAILED
    now = timezone.now()
    values = {
        "resolution": Resolution.APPLIED if applied else Resolution.NOT_APPLIED,
        "resolved_by": acting_user,
        "resolved_at": now,
        "evidence": evidence.strip(),
        "next_attempt_at": None,
        # The call's execution ended when its outcome became unknown; resolved_at says when it was settled.
        "finished_at": tool_call.finished_at or now,
        "result": result if applied else None,
        "error_code": "" if applied else "not_applied",
        # What the model is told: plain words. The evidence stays on the call, the desk and the audit trail.
        "error_detail": "" if applied else code_text(tool_name=tool_call.tool_name, error_code="not_applied"),
    }
    with transaction.atomic():
        session_id = Run.objects.values_list("session_id", flat=True).get(pk=tool_call.run_id)
        session_lock(session_id=session_id)  # before the run's row, as every change from outside the worker
        if tool_call.status != ToolCallStatus.UNKNOWN or not tool_call_transition(tool_call=tool_call, to=to, **values):
            current = ToolCall.objects.get(pk=tool_call.pk)
            raise WardenError(ToolCallRefusal.NOT_UNKNOWN, f"This tool call is {current.status}, not unknown; nothing to reconcile.")
        messages_append(session_id=session_id, messages=[tool_call_message(tool_call)])
        run_event_append(run_id=tool_call.run_id, events=[
            tool_call_event(tool_call, resolution=values["resolution"], evidence=values["evidence"])])
        if acting_user is not None:
            audit_record(
                actor=acting_user, action="reconcile", obj=tool_call, run_id=tool_call.run_id,
                before={"status": ToolCallStatus.UNKNOWN}, after={"status": to, "resolution": values["resolution"]},
                note=evidence,
            )
        still_unknown = ToolCall.objects.filter(run_id=tool_call.run_id, status=ToolCallStatus.UNKNOWN).exists()
        if not still_unknown:
            run_resume(run_id=tool_call.run_id, wait_reasons=[WaitReason.RECONCILIATION], event_payload={"tool_call": str(tool_call.id)})
    return tool_call
