"""Allowed approval transitions (SPEC §7): a decision is made once and never changes."""

from approvals_app.models import ApprovalStatus
from runs_app.transitions import check_transition

A = ApprovalStatus
APPROVAL_TRANSITIONS: dict[str, frozenset[str]] = {
    A.PENDING: frozenset({A.APPROVED, A.REJECTED, A.EXPIRED, A.WITHDRAWN}),
    A.APPROVED: frozenset(),
    A.REJECTED: frozenset(),
    A.EXPIRED: frozenset(),
    A.WITHDRAWN: frozenset(),
}


def check_approval_transition(from_status: str, to_status: str) -> None:
    check_transition(APPROVAL_TRANSITIONS, "approval", from_status, to_status)
