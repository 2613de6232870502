"""Writes about approvals and the audit trail."""

from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals_app.models import Approval, ApprovalStatus, AuditEntry
from approvals_app.transitions import check_approval_transition
from runs_app.services import run_write


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


def approval_transition(*, approval: Approval, to: str, decided_by=None, note: str = "") -> bool:
    """Record a decision (or expiry) exactly once: a conditional UPDATE on `status='pending'`
    decides who wins when two people click at the same moment."""
    check_approval_transition(approval.status, to)
    values: dict[str, Any] = {"status": to, "decided_at": timezone.now(), "decided_by": decided_by, "note": note}
    with transaction.atomic():
        updated = Approval.objects.filter(pk=approval.pk, status=approval.status).update(**values)
        if not updated:
            return False
        for field, value in values.items():
            setattr(approval, field, value)
        kind = "approval_decided" if to != ApprovalStatus.EXPIRED else "approval_expired"
        run_write(run_id=approval.run_id, events=[(kind, approval_event_payload(approval))], raise_on_miss=True)
    return True


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
