"""Reads about tool calls, scoped to what a user may see: the calls of their own runs; with
the reconcile permission also every unknown (or reconciled) call — the operators' queue;
with view_run everything."""

from django.db.models import Q, QuerySet

from config.api_base import keyset_page
from runs_app.selectors import VIEW_ANY_RUN
from tools_app.models import ToolCall, ToolCallStatus

RECONCILE = "tools_app.reconcile_toolcall"


def tool_call_visible(*, user) -> QuerySet[ToolCall]:
    if user.has_perm(VIEW_ANY_RUN):
        return ToolCall.objects.all()
    visible = Q(run__session__owner=user)
    if user.has_perm(RECONCILE):
        visible |= Q(status=ToolCallStatus.UNKNOWN) | ~Q(resolution="")
    return ToolCall.objects.filter(visible)


def tool_call_can_reconcile(*, user) -> bool:
    return user.has_perm(RECONCILE)


def tool_call_list(
    *, user, statuses: list[str] | None = None, run_id=None, tool_name: str | None = None, cursor: str | None = None, limit: int
) -> tuple[list[ToolCall], str | None]:
    """Newest first, keyset-paginated, one query per page."""
    queryset = tool_call_visible(user=user).select_related("resolved_by", "approval")
    if statuses:
        queryset = queryset.filter(status__in=statuses)
    if run_id:
        queryset = queryset.filter(run_id=run_id)
    if tool_name:
        queryset = queryset.filter(tool_name=tool_name)
    return keyset_page(queryset, cursor=cursor, limit=limit, position_field="created_at")


def tool_call_get(*, user, tool_call_id) -> ToolCall | None:
    return tool_call_visible(user=user).select_related("resolved_by", "approval").filter(pk=tool_call_id).first()
