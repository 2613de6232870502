"""Approvals and the audit trail (SPEC §7). Only a recorded decision by an authorized human
lets a write run; the decision is made exactly once, whoever clicks first."""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals_app.models import Approval, ApprovalPolicy, ApprovalStatus, AuditEntry
from approvals_app.transitions import check_approval_transition
from runs_app.models import Run, RunStatus, WaitReason
from runs_app.services import run_resume, run_transition, run_write


class ApprovalError(Exception):
    code = "approval_error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ApprovalNotPermitted(ApprovalError):
    code = "not_permitted"


class ApprovalAlreadyDecided(ApprovalError):
    code = "already_decided"


def approval_event_payload(approval: Approval) -> dict:
    return {
        "approval": str(approval.id),
        "tool_call": str(approval.tool_call_id),
        "policy": approval.policy,
        "status": approval.status,
        "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
        "decided_by": approval.decided_by.get_username() if approval.decided_by_id else None,
        "note": approval.note,
    }


def audit_record(*, actor, action: str, obj, run_id=None, before: dict, after: dict, note: str = "") -> AuditEntry:
    return AuditEntry.objects.create(
        actor=actor,
        action=action,
        object_type=obj._meta.model_name,
        object_id=str(obj.pk),
        run_id=run_id,
        before=before,
        after=after,
        note=note,
    )


def approval_request(*, run: Run, tool_call, policy: str, lease_token: int) -> Approval:
    """Suspend the run on a write that needs a human: the Approval row and `waiting / approval`
    in one commit."""
    expires_at = timezone.now() + timedelta(seconds=settings.WARDEN_APPROVAL_TTL_SECONDS)
    with transaction.atomic():
        approval = Approval.objects.create(
            tool_call=tool_call, run=run, policy=policy, expires_at=expires_at
        )
        run_transition(
            run=run,
            to=RunStatus.WAITING,
            wait_reason=WaitReason.APPROVAL,
            lease_token=lease_token,
            extra_events=[("approval_requested", approval_event_payload(approval) | {
                "tool": tool_call.tool_name, "arguments": tool_call.arguments,
            })],
            wait_type="approval",
            request_id=str(approval.id),
            expires_at=expires_at,
            resume_target=str(tool_call.id),
        )
    return approval


def approval_can_decide(*, user, approval: Approval) -> bool:
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    owner_id = approval.run.session.owner_id
    if approval.policy == ApprovalPolicy.USER:
        return user.pk == owner_id
    if not user.has_perm("approvals_app.decide_approval"):
        return False
    # Four eyes: an operator may not approve a refund raised in their own session.
    return not (settings.WARDEN_FOUR_EYES and user.pk == owner_id)


def _transition(*, approval: Approval, to: str, decided_by, note: str) -> bool:
    check_approval_transition(approval.status, to)
    values: dict[str, Any] = {"status": to, "decided_at": timezone.now(), "decided_by": decided_by, "note": note}
    updated = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(**values)
    if not updated:
        return False
    for field, value in values.items():
        setattr(approval, field, value)
    return True


def approval_decide(*, approval: Approval, decision: str, note: str = "", acting_user) -> Approval:
    """Approve or reject. Exactly one decision is recorded even when many people click at once
    (conditional UPDATE on `pending`); the others get ApprovalAlreadyDecided naming the winner.
    Approval resumes the same run; rejection cancels the tool call and tells the model why."""
    if decision not in ("approve", "reject"):
        raise ApprovalError(f"decision must be 'approve' or 'reject', not {decision!r}")
    approval = Approval.objects.select_related("run__session", "tool_call").get(pk=approval.pk)
    if not approval_can_decide(user=acting_user, approval=approval):
        raise ApprovalNotPermitted("You may not decide this approval.")
    to = ApprovalStatus.APPROVED if decision == "approve" else ApprovalStatus.REJECTED
    if approval.status == ApprovalStatus.PENDING and approval.expires_at <= timezone.now():
        # Past its expiry a request can no longer be approved, even if the sweeper has not
        # closed it yet: close it now and say so.
        approval_expire(approval=approval)
        raise ApprovalAlreadyDecided(f"This request expired at {approval.expires_at.isoformat()}.")
    with transaction.atomic():
        if approval.status != ApprovalStatus.PENDING or not _transition(
            approval=approval, to=to, decided_by=acting_user, note=note
        ):
            current = Approval.objects.select_related("decided_by").get(pk=approval.pk)
            who = current.decided_by.get_username() if current.decided_by_id else "the clock (expired)"
            when = current.decided_at.isoformat() if current.decided_at else "?"
            raise ApprovalAlreadyDecided(f"Already {current.status} by {who} at {when}.")
        run_write(
            run_id=approval.run_id,
            events=[("approval_decided", approval_event_payload(approval))],
            raise_on_miss=True,
        )
        audit_record(
            actor=acting_user, action=decision, obj=approval, run_id=approval.run_id,
            before={"status": ApprovalStatus.PENDING}, after={"status": to}, note=note,
        )
        if to == ApprovalStatus.REJECTED:
            tool_call_close_for_decision(approval=approval)
        run_resume(run_id=approval.run_id, wait_reasons=[WaitReason.APPROVAL], event_payload={"approval": str(approval.id)})
    return approval


def approval_expire(*, approval: Approval, lease_token: int | None = None) -> bool:
    """An approval past its expiry is closed by the clock; its tool call never runs."""
    with transaction.atomic():
        if not _transition(approval=approval, to=ApprovalStatus.EXPIRED, decided_by=None, note="expired without a decision"):
            return False
        run_write(
            run_id=approval.run_id,
            events=[("approval_expired", approval_event_payload(approval))],
            lease_token=lease_token,
            raise_on_miss=True,
        )
        tool_call_close_for_decision(approval=approval, lease_token=lease_token)
        if lease_token is None:
            run_resume(run_id=approval.run_id, wait_reasons=[WaitReason.APPROVAL], event_payload={"approval": str(approval.id)})
    return True


def approval_withdraw(*, approval: Approval, withdrawn_by, note: str, lease_token: int | None = None) -> bool:
    """The run is ending (cancelled, failed): its open request is withdrawn — nobody decided it,
    so it is neither rejected (which would put a decision in the name of whoever cancelled, who
    may not be allowed to decide it) nor expired — and logged, naming who cancelled when a
    person did. The caller closes the tool call and the run, so nothing here resumes the run."""
    with transaction.atomic():
        if not _transition(approval=approval, to=ApprovalStatus.WITHDRAWN, decided_by=withdrawn_by, note=note):
            return False
        run_write(run_id=approval.run_id, events=[("approval_withdrawn", approval_event_payload(approval))],
                  lease_token=lease_token, raise_on_miss=True)
    return True


def tool_call_close_for_decision(*, approval: Approval, lease_token: int | None = None) -> None:
    """Rejected or expired: the tool call is cancelled and a tool message tells the model why,
    so the history never holds a dangling tool call."""
    from runs_app.engine.tool_exec import tool_message
    from sessions_app.services import messages_append
    from tools_app.models import ToolCall, ToolCallStatus
    from tools_app.services import tool_call_transition

    call = ToolCall.objects.get(pk=approval.tool_call_id)
    if call.status != ToolCallStatus.PENDING:
        return
    reason = {ApprovalStatus.REJECTED: "approval_rejected", ApprovalStatus.WITHDRAWN: "approval_withdrawn"}.get(
        approval.status, "approval_expired")
    detail = approval.note or {"approval_expired": "the approval request expired", "approval_rejected": "rejected"}.get(
        reason, "the request was withdrawn")
    with transaction.atomic():
        if tool_call_transition(
            tool_call=call, to=ToolCallStatus.CANCELLED, lease_token=lease_token, error_code=reason, error_detail=detail
        ):
            messages_append(session_id=Run.objects.values_list("session_id", flat=True).get(pk=call.run_id), messages=[tool_message(call)])
