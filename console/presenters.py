"""What the console shows about a run: the view-model its templates render (messages, steps,
tool cards with their approvals, applied effects, the timeline)."""

import json
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from approvals_app.models import Approval, ApprovalPolicy, ApprovalStatus
from runs_app.models import ACTIVE_STATUSES, Run, RunErrorCode, RunEvent, RunOutcome, RunStatus, Step, StepKind
from runs_app.selectors import run_wait_clock
from access import policy as access
from runs_app.timeline import run_timeline
from sessions_app.models import Message, MessageRole
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.outcomes import tool_call_customer_text
from tools_app.registry import ASK_USER, tool_get
from tools_app.selectors import applied_effects
from tools_app.services import edited_text

# What a tool call's status is called in the console (the status itself stays in the markup).
TOOL_STATUS_LABELS = {
    ToolCallStatus.PENDING: "waiting",
    ToolCallStatus.RUNNING: "in progress",
    ToolCallStatus.SUCCEEDED: "done",
    ToolCallStatus.FAILED: "failed",
    ToolCallStatus.UNKNOWN: "checking",
    ToolCallStatus.CANCELLED: "not done",
}
ERROR_LABELS = {code.value: code.label for code in RunErrorCode}
# A run's outcome beside its status, for the customer: what became of what they asked for.
OUTCOME_LABELS = {
    RunOutcome.APPLIED: "done",
    RunOutcome.NOT_APPLIED: "not done",
    RunOutcome.REJECTED: "declined",
    RunOutcome.EXPIRED: "expired",
}


@dataclass
class RunView:
    run: Run
    last_seq: int
    items: list[dict]
    approvals: list[dict]
    effects: list[dict]
    timeline: dict
    is_active: bool
    can_cancel: bool
    error: str = ""
    state_label: str = ""
    outcome_label: str = ""
    cancel_note: str = ""


def _json_text(value, *, pretty: bool = True) -> str:
    if value is None or value == "":
        return ""
    return json.dumps(value, indent=2 if pretty else None, sort_keys=True, ensure_ascii=False)


def tool_label(name: str) -> str:
    """`query_order` → "Query order"."""
    return name.replace("_", " ").strip().capitalize()


def _money(tool_name: str, arguments: dict) -> str:
    tool = tool_get(tool_name)
    return (tool.money_text(arguments) or "") if tool is not None else ""


def _tool_card(call: ToolCall, approval: dict | None) -> dict:
    return {
        "id": str(call.id),
        "call_id": call.tool_call_id,
        "tool": call.tool_name,
        "label": tool_label(call.tool_name),
        "effect": call.effect,
        "status": call.status,
        "status_label": TOOL_STATUS_LABELS.get(call.status, call.status),
        "attempts": call.attempts,
        "arguments": _json_text(call.arguments, pretty=False),
        "money": _money(call.tool_name, call.arguments),
        "edited": edited_text(call),
        "result": _json_text(call.result),
        # Plain words for everyone; codes and details are the desk's.
        "message": tool_call_customer_text(tool_name=call.tool_name, effect=call.effect, status=call.status,
                                           error_code=call.error_code, error_detail=call.error_detail),
        "question": call.arguments.get("question", "") if call.tool_name == ASK_USER else "",
        "approval": approval,
    }


def approval_state_text(*, policy: str, status: str, decided_by: str, note: str, customer_message: str,
                        desk_view: bool, viewer_name: str) -> str:
    """How a decided request reads in the console. The customer learns who decided in general
    terms and what the decider chose to tell them; an operator watching also sees who and the note."""
    if status == ApprovalStatus.EXPIRED:
        return "Nobody approved it in time."
    if status == ApprovalStatus.WITHDRAWN:
        return "Withdrawn: the request ended before anyone decided."
    verb = {ApprovalStatus.APPROVED: "Approved", ApprovalStatus.REJECTED: "Declined"}.get(status, status.capitalize())
    if desk_view:
        text = f"{verb} by {decided_by or 'nobody'}" + (f": {note}" if note else "")
    elif decided_by and decided_by == viewer_name:
        text = f"{verb} by you" + (f": {note}" if note else "")
    else:
        text = f"{verb} by {'an operator' if policy == ApprovalPolicy.OPERATOR else 'the session owner'}"
    text = text.rstrip(".") + "."
    return f"{text} “{customer_message}”" if customer_message else text


def _approval_card(approval: Approval, *, viewer, desk_view: bool) -> dict:
    decided_by = approval.decided_by.get_username() if approval.decided_by_id else ""
    return {
        "id": str(approval.id),
        "tool": approval.tool_call.tool_name,
        "label": tool_label(approval.tool_call.tool_name),
        "arguments": _json_text(approval.tool_call.arguments, pretty=False),
        "policy": approval.policy,
        "status": approval.status,
        "state_text": approval_state_text(
            policy=approval.policy, status=approval.status, decided_by=decided_by, note=approval.note,
            customer_message=approval.customer_message, desk_view=desk_view, viewer_name=viewer.get_username(),
        ),
        "expires_at": approval.expires_at,
        "can_decide": approval.policy == ApprovalPolicy.USER and access.can_decide_approval(user=viewer, approval=approval),
    }


def cancel_note_text(run: Run, *, desk_view: bool, viewer) -> str:
    """Who asked the run to stop and why; an operator's reason is for the desk."""
    if not run.cancel_requested_at:
        return ""
    by = run.cancel_requested_by
    if by is None:
        who, reason = "", run.cancel_reason
    elif by.pk == viewer.pk:
        who, reason = " by you", run.cancel_reason
    elif desk_view:
        who, reason = f" by {by.get_username()}", run.cancel_reason
    else:
        who, reason = " by an operator" if by.pk != run.session.owner_id else " by the session owner", ""
    if run.status in ACTIVE_STATUSES:
        return f"cancel requested{who}…"
    return f"cancelled{who}" + (f": {reason}" if reason else "")


def state_label(*, status: str, phase: str, wait_reason: str, ends_at=None, deadline_paused: bool = False) -> str:
    if status == RunStatus.RUNNING and phase:
        return phase.replace("_", " ")
    if status == RunStatus.WAITING and wait_reason:
        what = "waiting for your answer" if wait_reason == "waiting_input" else f"for {wait_reason.replace('_', ' ')}"
        until = f" until {timezone.localtime(ends_at):%Y-%m-%d %H:%M}" if ends_at else ""
        paused = " · the run's deadline is paused" if deadline_paused else ""
        return what + until + paused
    if status == RunStatus.QUEUED:
        return "waiting for a worker"
    return ""


def _state_label_of(run: Run) -> str:
    clock = run_wait_clock(run)
    return state_label(status=run.status, phase=run.phase, wait_reason=run.wait_reason,
                       ends_at=clock.ends_at if clock else None, deadline_paused=clock.deadline_paused if clock else False)


def console_run_view(*, run: Run, viewer, now: datetime | None = None) -> RunView:
    """Everything the console shows about one run. Call inside `consistent_snapshot()` so the
    state shown and `last_seq` belong to the same moment: the client then applies only
    events after `last_seq`."""
    now = now or timezone.now()
    events = list(RunEvent.objects.filter(run_id=run.id).order_by("seq").values("seq", "type", "payload", "created_at"))
    steps = list(Step.objects.filter(run_id=run.id).order_by("index"))
    calls = list(ToolCall.objects.filter(run_id=run.id).order_by("step__index", "index"))
    approvals = list(Approval.objects.filter(run_id=run.id).select_related("tool_call", "decided_by", "run__session").order_by("requested_at"))
    desk_view = access.reads_desk_notes(user=viewer, session_owner_id=run.session.owner_id)
    user_messages = list(Message.objects.filter(run_id=run.id, role=MessageRole.USER).order_by("seq"))

    calls_by_step: dict[int, list[ToolCall]] = {}
    for call in calls:
        calls_by_step.setdefault(call.step_id, []).append(call)
    # An approval is shown on the card of the tool call it is about.
    approval_cards = {str(a.tool_call_id): _approval_card(a, viewer=viewer, desk_view=desk_view) for a in approvals}
    items = [{"kind": "user", "at": m.created_at, "content": m.content, "seq": m.seq} for m in user_messages]
    for step in steps:
        item = {"kind": step.kind, "at": step.started_at, "step": step}
        if step.kind == StepKind.TOOLS:
            item["calls"] = [_tool_card(c, approval_cards.pop(str(c.id), None)) for c in calls_by_step.get(step.pk, [])]
        items.append(item)
    # A message and the step it led to share a moment; the message comes first.
    items.sort(key=lambda item: (item["at"], 0 if item["kind"] == "user" else 1))

    effects = applied_effects(run_id=run.id) if run.status in (RunStatus.CANCELLED, RunStatus.FAILED) else []
    for effect in effects:
        effect["arguments_text"] = _json_text(effect["arguments"], pretty=False)
        effect["result_text"] = _json_text(effect["result"], pretty=False)
    return RunView(
        run=run,
        last_seq=events[-1]["seq"] if events else 0,
        items=items,
        approvals=list(approval_cards.values()),  # any whose card is not shown
        effects=effects,
        timeline=run_timeline(run=run, events=events, steps=steps, calls=calls, now=now),
        is_active=run.status in ACTIVE_STATUSES,
        can_cancel=access.can_cancel_run(user=viewer, run=run),
        error=run_failure_text(run, desk_view=desk_view) if run.status == RunStatus.FAILED else "",
        state_label=_state_label_of(run),
        outcome_label=OUTCOME_LABELS.get(run.outcome, ""),
        cancel_note=cancel_note_text(run, desk_view=desk_view, viewer=viewer),
    )


def run_failure_text(run: Run, *, desk_view: bool) -> str:
    """Why the run stopped: the error's label (RunErrorCode) for the customer; the code and the
    detail too for an operator."""
    label = ERROR_LABELS.get(run.error_code, "Something went wrong")
    return f"{label} ({run.error_code}: {run.error_detail})" if desk_view else f"{label}."


class consistent_snapshot:
    """One REPEATABLE READ transaction: every query inside sees the same committed state.
    (Inside an enclosing transaction the isolation level is already fixed; it is kept.)"""

    def __enter__(self):
        outermost = not connection.in_atomic_block
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        if outermost:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return self

    def __exit__(self, *exc):
        return self._atomic.__exit__(*exc)
