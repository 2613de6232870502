"""Writes about tool calls. Each transition is one conditional UPDATE plus its event, in the
same transaction as the run write that fences it."""

from typing import Any

from django.db import transaction
from django.utils import timezone

from runs_app.services import run_write
from tools_app.models import FINAL_TOOL_CALL_STATUSES, ToolCall, ToolCallStatus
from tools_app.transitions import check_tool_call_transition


def tool_call_event_payload(tool_call: ToolCall) -> dict:
    return {
        "tool_call": str(tool_call.id),
        "tool_call_id": tool_call.tool_call_id,
        "tool": tool_call.tool_name,
        "effect": tool_call.effect,
        "status": tool_call.status,
        "attempts": tool_call.attempts,
        "arguments": tool_call.arguments,
        "result": tool_call.result,
        "error_code": tool_call.error_code,
    }


def tool_call_transition(
    *, tool_call: ToolCall, to: str, lease_token: int | None = None, **changes: Any
) -> bool:
    """Move a tool call from the status we read to `to`; False if someone changed it first.
    With `lease_token`, the write is fenced by the run's lease (LeaseLost if it is gone)."""
    check_tool_call_transition(tool_call.status, to)
    values: dict[str, Any] = {"status": to, **changes}
    now = timezone.now()
    if to == ToolCallStatus.RUNNING and tool_call.started_at is None:
        values.setdefault("started_at", now)
    if to in FINAL_TOOL_CALL_STATUSES or to == ToolCallStatus.UNKNOWN:
        values.setdefault("finished_at", now)
    with transaction.atomic():
        updated = ToolCall.objects.filter(pk=tool_call.pk, status=tool_call.status).update(**values)
        if not updated:
            return False
        for field, value in values.items():
            setattr(tool_call, field, value)
        run_write(
            run_id=tool_call.run_id,
            events=[("tool_call", tool_call_event_payload(tool_call))],
            lease_token=lease_token,
            raise_on_miss=True,
        )
    return True
