"""Reads for the operators' desk: what an approver needs to see, and the overview of everything
waiting for a human."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count

from approvals_app.models import Approval, ApprovalStatus
from config.pagination import keyset_page
from runs_app.models import Run, RunStatus, WaitReason
from sessions_app import access
from sessions_app.models import Message
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect

CONVERSATION_MESSAGES = 20


def approval_conversation(*, approval: Approval, limit: int = CONVERSATION_MESSAGES) -> list[Message]:
    """The latest messages of the session the request came from, oldest first."""
    latest = Message.objects.filter(session_id=approval.run.session_id).order_by("-seq")[:limit]
    return list(reversed(latest))


def approval_read_results(*, approval: Approval) -> list[ToolCall]:
    """What the run's read tools found (e.g. query_order's answer): the facts the model based
    its request on, shown beside it so the approver can check them."""
    return list(
        ToolCall.objects.filter(run_id=approval.run_id, effect=ToolEffect.READ, status=ToolCallStatus.SUCCEEDED)
        .order_by("created_at", "index")
    )


@dataclass(frozen=True)
class WaitingItem:
    kind: str  # "approval" or "unknown tool call"
    pk: object
    label: str
    since: datetime


@dataclass(frozen=True)
class DeskOverview:
    pending_approvals: int
    unknown_calls: int
    runs_by_status: dict[str, int]
    runs_by_wait_reason: dict[str, int]
    oldest_waiting: WaitingItem | None


def desk_overview() -> DeskOverview:
    """The numbers on the admin index: what waits for an operator, and the state of all runs."""
    pending = Approval.objects.filter(status=ApprovalStatus.PENDING)
    unknown = ToolCall.objects.filter(status=ToolCallStatus.UNKNOWN)
    by_status = dict.fromkeys(RunStatus.values, 0)
    by_status |= dict(Run.objects.order_by().values_list("status").annotate(n=Count("pk")))
    by_wait_reason = dict.fromkeys(WaitReason.values, 0)
    by_wait_reason |= dict(
        Run.objects.filter(status=RunStatus.WAITING).order_by().values_list("wait_reason").annotate(n=Count("pk"))
    )
    candidates = []
    oldest_approval = pending.select_related("tool_call").order_by("requested_at").first()
    if oldest_approval is not None:
        candidates.append(
            WaitingItem("approval", oldest_approval.pk, f"approval of {oldest_approval.tool_call.tool_name}", oldest_approval.requested_at)
        )
    # An unknown call has waited since its outcome became unknown (finished_at is set then).
    oldest_unknown = unknown.order_by("finished_at", "created_at").first()
    if oldest_unknown is not None:
        candidates.append(
            WaitingItem(
                "unknown tool call", oldest_unknown.pk, f"unknown outcome of {oldest_unknown.tool_name}",
                oldest_unknown.finished_at or oldest_unknown.created_at,
            )
        )
    return DeskOverview(
        pending_approvals=pending.count(),
        unknown_calls=unknown.count(),
        runs_by_status=by_status,
        runs_by_wait_reason=by_wait_reason,
        oldest_waiting=min(candidates, key=lambda item: item.since, default=None),
    )


# ---------------------------------------------------------------------------
# The HTTP API's reads: approvals scoped to what a user may see and decide (sessions_app.access).
# ---------------------------------------------------------------------------


def approval_list(
    *, user, statuses: list[str] | None = None, decidable: bool = False, run_id=None, cursor: str | None = None, limit: int
) -> tuple[list[Approval], str | None]:
    """Oldest request first (the queue order), keyset-paginated, one query per page."""
    queryset = access.visible_approvals(user=user).select_related("run__session", "tool_call", "decided_by")
    if statuses:
        queryset = queryset.filter(status__in=statuses)
    if decidable:
        queryset = queryset.filter(access.decidable_approvals(user=user))
    if run_id:
        queryset = queryset.filter(run_id=run_id)
    return keyset_page(queryset, cursor=cursor, limit=limit, position_field="requested_at", descending=False)


def approval_get(*, user, approval_id) -> Approval | None:
    return access.visible_approvals(user=user).select_related("run__session", "tool_call", "decided_by").filter(pk=approval_id).first()
