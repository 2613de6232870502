"""What a tool call says, to the run's event log and to the model (its tool message). Its status
changes only through engine.state.tool_call_transition (the one write path, fenced by the run's
lease)."""

import hashlib
import json
from typing import Any

from runs_app.events import RunEventType
from sessions_app.models import Message, MessageRole
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect
from tools_app.outcomes import tool_call_customer_text
from tools_app.registry import tool_get


def tool_call_event_payload(tool_call: ToolCall) -> dict:
    payload = {
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
    if tool_call.effect == ToolEffect.WRITE:
        tool = tool_get(tool_call.tool_name)
        money = tool.money_text(tool_call.arguments) if tool is not None else None
        if money:
            payload["money"] = money  # "9.00 EUR": the amount with its currency, on every surface
    if tool_call.proposed_arguments is not None:
        # An operator changed the arguments before approving: `arguments` is what executes.
        payload["proposed_arguments"] = tool_call.proposed_arguments
        payload["edited"] = edited_text(tool_call)
    if tool_call.business_key:
        payload["business_key"] = tool_call.business_key
    if tool_call.reused_from_id:
        # Answered by an earlier call with the same key (SPEC §18): the desk and the API link to it.
        payload["reused_from"] = str(tool_call.reused_from_id)
    return payload


def edited_text(tool_call: ToolCall) -> str:
    """What the console says of a call an operator changed before approving (SPEC §18); "" if none did."""
    if tool_call.proposed_arguments is None:
        return ""
    tool = tool_get(tool_call.tool_name)
    asked = tool.money_text(tool_call.proposed_arguments) if tool is not None else None
    now = tool.money_text(tool_call.arguments) if tool is not None else None
    if asked and now and asked != now:
        return f"An operator changed this request before approving it: {asked} was asked, {now} is what it is for."
    return "An operator changed the details of this request before approving it."


def tool_call_digest(tool_call: ToolCall) -> str:
    """What a human decision binds to (SPEC §18): a digest of the tool, the arguments and the
    idempotency key. The call executes only if it is still exactly what was approved."""
    canonical = json.dumps({"tool": tool_call.tool_name, "arguments": tool_call.arguments,
                            "idempotency_key": tool_call.idempotency_key}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def tool_call_event(tool_call: ToolCall, **extra: Any) -> tuple[str, dict]:
    return RunEventType.TOOL_CALL, tool_call_event_payload(tool_call) | extra


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


EDITED_TEXT = ("An operator changed this request before approving it: it was carried out with `executed_with`, "
               "not with what was asked. Tell the customer what was done.")


def _as_edited(content: str, tool_call: ToolCall) -> str:
    """The outcome of a call an operator edited (SPEC §18): the model is told what executed, so
    it tells the customer the truth, not what it had asked for."""
    edited = {"note": EDITED_TEXT, "asked": tool_call.proposed_arguments, "executed_with": tool_call.arguments}
    if tool_call.status == ToolCallStatus.SUCCEEDED:
        return json.dumps({"result": json.loads(content), **edited}, default=str)
    return json.dumps({**json.loads(content), **edited}, default=str)


def tool_call_message(tool_call: ToolCall) -> Message:
    """The history entry answering the model's call with its outcome (not yet appended)."""
    content = tool_message_content(
        status=tool_call.status, result=tool_call.result, error_code=tool_call.error_code,
        error_detail=tool_call.error_detail,
        message=tool_call_customer_text(tool_name=tool_call.tool_name, effect=tool_call.effect,
                                        status=tool_call.status, error_code=tool_call.error_code,
                                        error_detail=tool_call.error_detail),
    )
    if tool_call.proposed_arguments is not None:
        content = _as_edited(content, tool_call)
    return Message(
        role=MessageRole.TOOL,
        run_id=tool_call.run_id,
        step_id=tool_call.step_id,
        tool_call_id=tool_call.tool_call_id,
        tool_name=tool_call.tool_name,
        content=content,
    )
