"""Reads about tool calls: the pages a user may see (sessions_app.access decides which), and the
facts about a run's writes that every interface shows — what took effect, what is in doubt."""

from django.db.models import QuerySet

from config.pagination import keyset_page
from sessions_app import access
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect


def tool_call_list(
    *, user, statuses: list[str] | None = None, run_id=None, tool_name: str | None = None, cursor: str | None = None, limit: int
) -> tuple[list[ToolCall], str | None]:
    """Newest first, keyset-paginated, one query per page."""
    queryset = access.visible_tool_calls(user=user).select_related("resolved_by", "approval")
    if statuses:
        queryset = queryset.filter(status__in=statuses)
    if run_id:
        queryset = queryset.filter(run_id=run_id)
    if tool_name:
        queryset = queryset.filter(tool_name=tool_name)
    return keyset_page(queryset, cursor=cursor, limit=limit, position_field="created_at")


def tool_call_get(*, user, tool_call_id) -> ToolCall | None:
    return access.visible_tool_calls(user=user).select_related("resolved_by", "approval", "run__session").filter(pk=tool_call_id).first()


def applied_effects(*, run_id) -> list[dict]:
    """Writes of this run that took effect downstream: what a cancelled or failed run must show."""
    return [
        {"tool_call": str(c.id), "tool": c.tool_name, "arguments": c.arguments, "result": c.result,
         "idempotency_key": c.idempotency_key, "finished_at": c.finished_at.isoformat() if c.finished_at else None}
        # A call answered from an earlier identical one (reused_from) did not write again.
        for c in ToolCall.objects.filter(run_id=run_id, effect=ToolEffect.WRITE, status=ToolCallStatus.SUCCEEDED,
                                         reused_from__isnull=True).order_by("finished_at")
    ]


def writes_in_doubt(*, run_id) -> QuerySet[ToolCall]:
    """Writes of the run that started and whose outcome is not known: `running` (possibly in a
    worker that died) or `unknown`. No run ends — cancelled or failed — while there is one
    (SPEC §9, §10): it is recovered and reconciled first."""
    return ToolCall.objects.filter(run_id=run_id, effect=ToolEffect.WRITE,
                                   status__in=[ToolCallStatus.RUNNING, ToolCallStatus.UNKNOWN])
