"""Single-app writes about approvals and the audit trail (SPEC §7). `approval_transition` is the
one write path of an approval's status: a decision is made once — a conditional UPDATE on
`pending`, whoever comes first. Logging it on its run, under the run's fence, is
engine.state.approval_close; what a decision then does to the tool call and the run is the
orchestration layer's (engine/actions/approvals.py)."""

from typing import Any

from django.utils import timezone

from approvals_app.models import Approval, ApprovalDecision, ApprovalStatus, AuditEntry, SavedView
from approvals_app.transitions import check_approval_transition
from runs_app.events import RunEventType
from tools_app.services import tool_call_digest


# The event each outcome writes on the approval's run.
APPROVAL_OUTCOME_EVENTS = {
    ApprovalStatus.APPROVED: RunEventType.APPROVAL_DECIDED,
    ApprovalStatus.REJECTED: RunEventType.APPROVAL_DECIDED,
    ApprovalStatus.EXPIRED: RunEventType.APPROVAL_EXPIRED,
    ApprovalStatus.WITHDRAWN: RunEventType.APPROVAL_WITHDRAWN,
}


def approval_event_payload(approval: Approval) -> dict:
    return {
        "approval": str(approval.id),
        "tool_call": str(approval.tool_call_id),
        "policy": approval.policy,
        "status": approval.status,
        "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
        "decided_by": approval.decided_by.get_username() if approval.decided_by_id else None,
        "note": approval.note,
        "customer_message": approval.customer_message,
        "required_approvals": approval.required_approvals,
        "approved_by": approval_approvers(approval=approval),
        "rule": approval.rule,
        "rule_reason": approval.rule_reason,
    }


def approval_approvers(*, approval: Approval) -> list[str]:
    """Who has approved so far, in order (a quorum approval collects several); a stand-in's approval
    reads "bob for alice"."""
    if approval._state.adding:
        return []
    rows = (ApprovalDecision.objects.filter(approval_id=approval.pk, decision="approve", voided_at__isnull=True)
            .order_by("id").values_list("decided_by__username", "on_behalf_of__username"))
    return [f"{who} for {principal}" if principal else who for who, principal in rows]


def approval_decision_record(*, approval: Approval, decided_by, decision: str, note: str,
                             on_behalf_of=None) -> ApprovalDecision:
    """One person's decision (in the caller's transaction, which holds the session's lock), bound to
    the digest of the call it was about — with whom they stood in for, if anyone: the database
    refuses a second one by the same person."""
    return ApprovalDecision.objects.create(approval=approval, decided_by=decided_by, decision=decision, note=note,
                                           digest=tool_call_digest(approval.tool_call), on_behalf_of=on_behalf_of)


def audit_record(*, actor, action: str, obj=None, object_type: str = "", object_id: str = "", run_id=None,
                 before: dict, after: dict, note: str = "") -> AuditEntry:
    """A human decision about `obj` (or, for what is no row of ours — a fault armed in the
    simulated gateway — about `object_type` / `object_id`)."""
    return AuditEntry.objects.create(
        actor=actor,
        action=action,
        object_type=obj._meta.model_name if obj is not None else object_type,
        object_id=str(obj.pk) if obj is not None else object_id,
        run_id=run_id,
        before=before,
        after=after,
        note=note,
    )


def approval_create(*, run, tool_call, policy: str, expires_at, required_approvals: int = 1, rule: str = "",
                    rule_reason: str = "") -> Approval:
    """A pending request. The caller's transaction suspends the run on it."""
    return Approval.objects.create(tool_call=tool_call, run=run, policy=policy, expires_at=expires_at,
                                   required_approvals=required_approvals, rule=rule[:300], rule_reason=rule_reason[:500],
                                   digest=tool_call_digest(tool_call))


def approval_transition(*, approval: Approval, to: str, decided_by, note: str, customer_message: str = "") -> bool:
    """Close a pending approval as `to`, in the caller's transaction. False when someone else closed
    it first (nothing is written then); IllegalTransition for a move APPROVAL_TRANSITIONS forbids."""
    check_approval_transition(approval.status, to)
    values: dict[str, Any] = {"status": to, "decided_at": timezone.now(), "decided_by": decided_by, "note": note,
                              "customer_message": customer_message}
    if not Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(**values):
        return False
    for field, value in values.items():
        setattr(approval, field, value)
    return True


def approval_assignment_set(*, approval: Approval, assignee) -> bool:
    """Who works a pending request (`assignee`, or None: nobody), in the caller's transaction, which
    checked who may. False when it is no longer pending: a decided request keeps who worked it."""
    assigned_at = timezone.now() if assignee is not None else None
    if not Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
            assigned_to=assignee, assigned_at=assigned_at):
        return False
    approval.assigned_to, approval.assigned_at = assignee, assigned_at
    return True


SAVED_VIEW_NAME_CHARS = 80
SAVED_VIEW_URL_CHARS = 500


def saved_view_create(*, owner, name: str, url: str) -> SavedView:
    """One operator's named view; saving a name again replaces what it points at."""
    saved, _ = SavedView.objects.update_or_create(owner=owner, name=name, defaults={"url": url})
    return saved


def saved_view_delete(*, owner, saved_view_id: int) -> bool:
    """False when `owner` has no such view (someone else's is never theirs to delete)."""
    deleted, _ = SavedView.objects.filter(owner=owner, pk=saved_view_id).delete()
    return bool(deleted)
