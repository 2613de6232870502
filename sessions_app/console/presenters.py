"""What the console shows about a run: the view-model its templates render (messages, steps,
tool cards with their approvals, applied effects, the timeline)."""

import json
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from approvals_app.models import Approval, ApprovalPolicy
from runs_app.models import ACTIVE_STATUSES, Run, RunEvent, RunStatus, Step, StepKind
from runs_app.selectors import run_wait_clock
from sessions_app import access
from sessions_app.console.timeline import run_timeline
from sessions_app.models import Message, MessageRole
from tools_app.models import ToolCall
from tools_app.registry import ASK_USER
from tools_app.selectors import applied_effects


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


def _json_text(value, *, pretty: bool = True) -> str:
    if value is None or value == "":
        return ""
    return json.dumps(value, indent=2 if pretty else None, sort_keys=True, ensure_ascii=False)


def _tool_card(call: ToolCall, approval: dict | None) -> dict:
    return {
        "id": str(call.id),
        "call_id": call.tool_call_id,
        "tool": call.tool_name,
        "effect": call.effect,
        "status": call.status,
        "attempts": call.attempts,
        "arguments": _json_text(call.arguments, pretty=False),
        "result": _json_text(call.result),
        "error": " ".join(filter(None, [call.error_code, call.error_detail])),
        "question": call.arguments.get("question", "") if call.tool_name == ASK_USER else "",
        "approval": approval,
    }


def _approval_card(approval: Approval, *, viewer) -> dict:
    return {
        "id": str(approval.id),
        "tool": approval.tool_call.tool_name,
        "arguments": _json_text(approval.tool_call.arguments, pretty=False),
        "policy": approval.policy,
        "status": approval.status,
        "decided_by": approval.decided_by.get_username() if approval.decided_by_id else "",
        "note": approval.note,
        "expires_at": approval.expires_at,
        "can_decide": approval.policy == ApprovalPolicy.USER and access.can_decide_approval(user=viewer, approval=approval),
    }


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
    user_messages = list(Message.objects.filter(run_id=run.id, role=MessageRole.USER).order_by("seq"))

    calls_by_step: dict[int, list[ToolCall]] = {}
    for call in calls:
        calls_by_step.setdefault(call.step_id, []).append(call)
    # An approval is shown on the card of the tool call it is about.
    approval_cards = {str(a.tool_call_id): _approval_card(a, viewer=viewer) for a in approvals}
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
        error=" — ".join(filter(None, [run.error_code, run.error_detail])) if run.status == RunStatus.FAILED else "",
        state_label=_state_label_of(run),
    )


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
