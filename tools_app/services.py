"""Single-app writes about tool calls. `tool_call_transition` is the one write path of a tool
call's status: a conditional UPDATE, fenced by the run's lease, whose row count says whether it
happened. Its event rides the caller's run write (or, with `announce`, one of its own)."""

import json
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs_app.events import RunEventType
from runs_app.services import lease_fenced_update, require_transaction, run_write
from sessions_app.models import Message, MessageRole
from tools_app.models import FINAL_TOOL_CALL_STATUSES, ToolCall, ToolCallStatus
from tools_app.outcomes import tool_call_customer_text
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
        # Where the call stands in plain words: what the console shows the customer.
        "message": tool_call_customer_text(tool_name=tool_call.tool_name, effect=tool_call.effect,
                                           status=tool_call.status, error_code=tool_call.error_code,
                                           error_detail=tool_call.error_detail),
    }


def tool_call_event(tool_call: ToolCall, **extra: Any) -> tuple[str, dict]:
    return RunEventType.TOOL_CALL, tool_call_event_payload(tool_call) | extra


def tool_call_transition(
    *, tool_call: ToolCall, to: str, lease_token: int | None = None, announce: bool = False, **changes: Any
) -> bool:
    """Move a tool call from the status we read to `to`. False when someone else moved it
    first; IllegalTransition for a move TOOL_CALL_TRANSITIONS forbids; LeaseLost when
    `lease_token` is no longer the run's. With `announce` the `tool_call` event is written
    here (a write of its own on the run row); otherwise the caller's run write carries it, and
    re-checks the fence under the run row's lock, so a revocation committed meanwhile rolls
    the whole transaction back."""
    values = tool_call_transition_values(tool_call=tool_call, to=to, lease_token=lease_token, **changes)
    if announce:
        with transaction.atomic():
            return _tool_call_update(tool_call, values, lease_token=lease_token, announce=True)
    require_transaction("tool_call_transition without announce")
    return _tool_call_update(tool_call, values, lease_token=lease_token, announce=False)


def tool_call_transition_values(*, tool_call: ToolCall, to: str, lease_token: int | None = None,
                                **changes: Any) -> dict[str, Any]:
    """The columns a move of `tool_call` to `to` sets, after checking TOOL_CALL_TRANSITIONS
    (IllegalTransition otherwise). `tool_call_transition` writes them; the engine's one-statement
    step commits (engine/step_commit.py) write the same values under the same fence."""
    check_tool_call_transition(tool_call.status, to)
    now = timezone.now()
    values: dict[str, Any] = {"status": to, **changes}
    if to == ToolCallStatus.RUNNING:
        if tool_call.started_at is None:
            values.setdefault("started_at", now)
        if lease_token is not None:
            values["lease_token"] = lease_token  # the lease it runs under: a crash is recognised by it (SPEC §10)
    if to in FINAL_TOOL_CALL_STATUSES or to == ToolCallStatus.UNKNOWN:
        values.setdefault("finished_at", now)
    if to == ToolCallStatus.PENDING:
        values.setdefault("finished_at", None)
    return values


def _tool_call_update(tool_call: ToolCall, values: dict[str, Any], *, lease_token: int | None, announce: bool) -> bool:
    if not lease_fenced_update(ToolCall.objects.filter(pk=tool_call.pk, status=tool_call.status), run_id=tool_call.run_id,
                               lease_token=lease_token, values=values):
        return False
    for field, value in values.items():
        setattr(tool_call, field, value)
    if announce:
        run_write(run_id=tool_call.run_id, events=[tool_call_event(tool_call)], lease_token=lease_token, raise_on_miss=True)
    return True


def tool_message_content(*, status: str, result: Any, error_code: str, error_detail: str, message: str = "") -> str:
    """What the model is told. It talks to the customer, so a failure carries `message`, the
    plain-language sentence (tools_app.outcomes) it may pass on; `detail` never holds an
    operator's note or reconciliation evidence (engine/actions keep those on the desk)."""
    if status == ToolCallStatus.SUCCEEDED:
        return json.dumps(result, default=str)
    error = {"code": error_code or status, "detail": error_detail}
    if message:
        error["message"] = message
    return json.dumps({"error": error})


def tool_call_message(tool_call: ToolCall) -> Message:
    """The history entry answering the model's call with its outcome (not yet appended)."""
    return Message(
        role=MessageRole.TOOL,
        run_id=tool_call.run_id,
        step_id=tool_call.step_id,
        tool_call_id=tool_call.tool_call_id,
        tool_name=tool_call.tool_name,
        content=tool_message_content(
            status=tool_call.status, result=tool_call.result, error_code=tool_call.error_code,
            error_detail=tool_call.error_detail,
            message=tool_call_customer_text(tool_name=tool_call.tool_name, effect=tool_call.effect,
                                            status=tool_call.status, error_code=tool_call.error_code,
                                            error_detail=tool_call.error_detail),
        ),
    )
