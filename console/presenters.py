"""What the console shows about a run: the view-model its templates render (messages, steps,
tool cards with their approvals, applied effects, the timeline), and what of a live event the
socket passes on.

Two views of the same run: the customer's (the session's owner) and an operator's
(access.policy.reads_desk_notes). The customer reads plain words only — no discarded step, no
name of a tool nobody registered, no error code; an operator watching sees them all."""

import json
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from approvals_app.models import Approval, ApprovalPolicy, ApprovalStatus
from runs_app.models import ACTIVE_STATUSES, TERMINAL_STATUSES, Run, RunErrorCode, RunEvent, RunOutcome, RunStatus, Step, StepKind, StepStatus
from runs_app.events import RunEventType
from runs_app.selectors import run_wait_clock
from access import policy as access
from runs_app.timeline import duration_text, run_state_key
from sessions_app.models import Message, MessageRole
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect
from tools_app.outcomes import ALREADY_DONE, tool_call_customer_text
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
# A completed run's one badge says what became of what was asked for (its outcome).
OUTCOME_LABELS = {
    RunOutcome.APPLIED: "done",
    RunOutcome.NOT_APPLIED: "not done",
    RunOutcome.REJECTED: "declined",
    RunOutcome.EXPIRED: "expired",
}
# A running run's badge: what it is doing (its phase).
PHASE_LABELS = {
    "preparing_context": "preparing",
    "calling_model": "thinking",
    "executing_tools": "running tools",
    "waiting_worker": "queued",
}
# A waiting run's badge: what it waits for — said once.
WAIT_LABELS = {
    "waiting_input": "waiting for your answer",
    "approval": "waiting for approval",
    "retry_backoff": "retrying shortly",
    "reconciliation": "checking the outcome",
    "frozen": "paused by a freeze",
}
# An ask_user call's badge (the question card), by the call's status.
QUESTION_STATUS_LABELS = {  # the run's badge says what it waits for; the card only whether it is open
    ToolCallStatus.PENDING: "to answer",
    ToolCallStatus.RUNNING: "to answer",
    ToolCallStatus.SUCCEEDED: "answered",
    ToolCallStatus.FAILED: "not answered",
    ToolCallStatus.CANCELLED: "withdrawn",
    ToolCallStatus.UNKNOWN: "to answer",
}
QUESTION_TEXTS = {
    ToolCallStatus.PENDING: "Answer below to go on.",
    ToolCallStatus.RUNNING: "Answer below to go on.",
    ToolCallStatus.SUCCEEDED: "",  # the answer is right below, in the customer's own words
    ToolCallStatus.FAILED: "No answer came in time.",
    ToolCallStatus.CANCELLED: "The question was withdrawn.",
}
# A succeeded call whose tool declares no summary (tools_app.registry.Tool.summary).
READ_DONE_TEXT = "Answered."
WRITE_DONE_TEXT = "Done."
# Fields of a live event that carry internals: the customer's socket never gets them.
INTERNAL_FIELDS = ("error_code", "error_detail", "discard_reason")


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
    badge_label: str = ""
    cancel_note: str = ""
    desk_view: bool = False


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


def tool_card_text(*, tool_name: str, effect: str, status: str, arguments: dict | None, result, error_code: str = "",
                   error_detail: str = "") -> str:
    """The card's one line, in plain words: a succeeded call's business result as its tool
    declares it ("Refunded 120.00 EUR, ref re_…"), a question's state, or where the call stands."""
    if tool_name == ASK_USER:
        return QUESTION_TEXTS.get(status, "")
    if status == ToolCallStatus.SUCCEEDED and error_code != ALREADY_DONE:
        tool = tool_get(tool_name)
        summary = tool.summary_text(arguments, result) if tool is not None else None
        return summary or (READ_DONE_TEXT if effect == ToolEffect.READ else WRITE_DONE_TEXT)
    return tool_call_customer_text(tool_name=tool_name, effect=effect, status=status, error_code=error_code,
                                   error_detail=error_detail)


def tool_status_label(*, tool_name: str, status: str) -> str:
    labels = QUESTION_STATUS_LABELS if tool_name == ASK_USER else TOOL_STATUS_LABELS
    return labels.get(status, status)


def _tool_card(call: ToolCall, approval: dict | None, *, desk_view: bool = False) -> dict:
    question = call.tool_name == ASK_USER
    return {
        "id": str(call.id),
        "call_id": call.tool_call_id,
        "tool": call.tool_name,
        "label": ("Question for the customer" if desk_view else "Question for you") if question else tool_label(call.tool_name),
        "effect": call.effect,
        "status": call.status,
        "status_label": tool_status_label(tool_name=call.tool_name, status=call.status),
        "attempts": call.attempts,
        "arguments": _json_text(call.arguments, pretty=False),
        "money": _money(call.tool_name, call.arguments),
        "edited": edited_text(call),
        "result": _json_text(call.result),
        # Plain words for everyone; codes and details are the desk's.
        "message": tool_card_text(tool_name=call.tool_name, effect=call.effect, status=call.status,
                                  arguments=call.arguments, result=call.result, error_code=call.error_code,
                                  error_detail=call.error_detail),
        "is_question": question,
        "question": call.arguments.get("question", "") if question else "",
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


def run_badge_label(*, status: str, phase: str = "", wait_reason: str = "", outcome: str = "") -> str:
    """The run's one badge: what it is doing, what it waits for, or what became of it."""
    if status == RunStatus.RUNNING:
        return PHASE_LABELS.get(phase, "running")
    if status == RunStatus.WAITING:
        return WAIT_LABELS.get(wait_reason, "waiting")
    if status == RunStatus.COMPLETED:
        return OUTCOME_LABELS.get(outcome, "completed")
    return status


def run_state_detail(*, status: str, ends_at=None, deadline_paused: bool = False) -> str:
    """Beside the badge, only what it does not say: until when a wait lasts, and the paused deadline."""
    if status != RunStatus.WAITING:
        return ""
    until = f"until {timezone.localtime(ends_at):%Y-%m-%d %H:%M}" if ends_at else ""
    paused = "the run's deadline is paused" if deadline_paused else ""
    return " · ".join(part for part in (until, paused) if part)


def _state_label_of(run: Run) -> str:
    clock = run_wait_clock(run)
    return run_state_detail(status=run.status, ends_at=clock.ends_at if clock else None,
                            deadline_paused=clock.deadline_paused if clock else False)


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
    if not desk_view:
        # A model turn thrown away (malformed, an unknown tool) is the run-time's business, not the customer's.
        steps = [step for step in steps if step.status != StepStatus.DISCARDED]
    for step in steps:
        item = {"kind": step.kind, "at": step.started_at, "step": step}
        if step.kind == StepKind.TOOLS:
            item["calls"] = [_tool_card(c, approval_cards.pop(str(c.id), None), desk_view=desk_view)
                             for c in calls_by_step.get(step.pk, [])]
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
        timeline=console_timeline(run=run, events=events, steps=steps, calls=calls, now=now, desk_view=desk_view),
        is_active=run.status in ACTIVE_STATUSES,
        can_cancel=access.can_cancel_run(user=viewer, run=run),
        error=run_failure_text(run, desk_view=desk_view) if run.status == RunStatus.FAILED else "",
        state_label=_state_label_of(run),
        badge_label=run_badge_label(status=run.status, phase=run.phase, wait_reason=run.wait_reason, outcome=run.outcome),
        cancel_note=cancel_note_text(run, desk_view=desk_view, viewer=viewer),
        desk_view=desk_view,
    )


def run_failure_text(run: Run, *, desk_view: bool) -> str:
    """Why the run stopped: the error's label (RunErrorCode) for the customer; the code and the
    detail too for an operator."""
    label = ERROR_LABELS.get(run.error_code, "Something went wrong")
    return f"{label} ({run.error_code}: {run.error_detail})" if desk_view else f"{label}."


# --- the timeline ------------------------------------------------------------------------------

# The console's timeline is drawn in fractions of the run's duration, so it fits any screen; the
# page moves its bars along while the run is active (console.js, timelineTick).
TIMELINE_ROW_HEIGHT = 22
TIMELINE_AXIS_HEIGHT = 20
TIMELINE_MAX_TOOL_ROWS = 6
TIMELINE_TICKS = (0, 0.25, 0.5, 0.75, 1)
# What each part of the run is called on the timeline and in its legend, by bar class.
TIMELINE_STATE_WORDS = {
    "queued": "queued",
    "running": "running",
    "preparing_context": "preparing",
    "calling_model": "thinking",
    "executing_tools": "running tools",
    **{f"waiting_{reason}": words for reason, words in WAIT_LABELS.items()},
}
TIMELINE_LEGEND = (
    ("thinking", "thinking"),
    ("tools", "running a tool"),
    ("waiting-person", "waiting for a person"),
    ("waiting-other", "waiting"),
    ("queued", "queued"),
    ("failed", "failed"),
    ("discarded", "thrown away"),
)


def _legend_kind(key: str) -> str:
    """Which legend colour a state bar takes."""
    if key in ("calling_model", "preparing_context", "running"):
        return "thinking"
    if key == "executing_tools":
        return "tools"
    if key in ("waiting_waiting_input", "waiting_approval", "waiting_reconciliation", "waiting_frozen"):
        return "waiting-person"
    if key.startswith("waiting_"):
        return "waiting-other"
    return "queued"


def console_timeline(*, run: Run, events: list[dict], steps: list[Step], calls: list, now: datetime,
                     desk_view: bool) -> dict:
    """Where the run's time went: its states, its steps (numbered 1, 2, 3… as shown) and its tool
    calls as bars on one axis from its creation to its end (or now), positioned in percent of that
    duration, with a legend of the colours used. `steps` are the steps this viewer sees."""
    start = run.created_at
    end = run.finished_at or now
    total = max((end - start).total_seconds(), 0.001)
    ongoing = run.finished_at is None

    def bar(begin: datetime, finish: datetime | None, *, label: str, title: str, kind: str, css: str, row: int) -> dict:
        begin_s = min(max((begin - start).total_seconds(), 0.0), total)
        end_s = None if finish is None else min(max((finish - start).total_seconds(), begin_s), total)
        seconds = (end_s if end_s is not None else total) - begin_s
        return {
            "begin": round(begin_s, 3), "end": "" if end_s is None else round(end_s, 3),
            "x": round(begin_s / total * 100, 2), "width": round(max(seconds / total * 100, 0.5), 2),
            "y": row * TIMELINE_ROW_HEIGHT + 3, "label": label, "title": f"{title} · {duration_text(seconds)}",
            "kind": kind, "css": f"kind-{kind} {css}",
        }

    marks = [(e["created_at"], run_state_key(e["payload"])) for e in events if e["type"] == "run_status"]
    bars, kinds = [], set()
    for position, (moment, key) in enumerate(marks):
        if key in TERMINAL_STATUSES:
            break
        finish = marks[position + 1][0] if position + 1 < len(marks) else (run.finished_at if not ongoing else None)
        words = TIMELINE_STATE_WORDS.get(key, key.replace("_", " "))
        bars.append(bar(moment, finish, label=words, title=words, kind=_legend_kind(key), css=f"state-{key}", row=0))

    questions = {call.step_id for call in calls if call.tool_name == ASK_USER}
    others = {call.step_id for call in calls if call.tool_name != ASK_USER}
    for number, step in enumerate(steps, start=1):
        discarded = step.status == StepStatus.DISCARDED
        failed = step.status == StepStatus.FAILED
        asking = step.kind == StepKind.TOOLS and step.pk in questions and step.pk not in others
        kind = ("discarded" if discarded else "failed" if failed else "thinking" if step.kind == StepKind.MODEL
                else "waiting-person" if asking else "tools")
        what = "thinking" if step.kind == StepKind.MODEL else "a question for you" if asking else "tools"
        title = f"Step {number}: {what}" + (" (thrown away)" if discarded else " (failed)" if failed else "")
        finish = step.finished_at or (None if ongoing else end)
        bars.append(bar(step.started_at, finish, label=str(number), title=title, kind=kind,
                        css=f"step-{step.kind} step-{step.status}", row=1))

    shown_calls = calls[:TIMELINE_MAX_TOOL_ROWS]
    rows = [{"label": "run", "title": "The run's state"}, {"label": "steps", "title": "Steps, numbered in order"}]
    for position, call in enumerate(shown_calls):
        row = 2 + position
        name = "question" if call.tool_name == ASK_USER else tool_label(call.tool_name)
        rows.append({"label": name, "title": name})
        closed = call.finished_at or (None if ongoing else end)
        if call.tool_name == ASK_USER:
            # Never executed: open from the moment it was asked until the answer (or its expiry).
            bars.append(bar(call.created_at, closed, label="your answer", title=f"{name}: waiting for your answer",
                            kind="waiting-person", css=f"tool-question tool-{call.status}", row=row))
            continue
        if call.started_at and call.started_at > call.created_at:
            waited = "waiting for your answer" if call.tool_name == ASK_USER else "waiting to run"
            bars.append(bar(call.created_at, call.started_at, label=waited, title=f"{name}: {waited}",
                            kind="waiting-person", css="tool-pending", row=row))
        if call.started_at:
            failed = call.status in (ToolCallStatus.FAILED, ToolCallStatus.UNKNOWN)
            bars.append(bar(call.started_at, closed, label=name, title=name, kind="failed" if failed else "tools",
                            css=f"tool-{call.status}", row=row))
        elif call.status == ToolCallStatus.SUCCEEDED:  # answered by an earlier call under the same key
            bars.append(bar(call.created_at, closed, label=name, title=f"{name}: done earlier", kind="tools",
                            css=f"tool-{call.status}", row=row))
        else:
            waiting = call.status == ToolCallStatus.PENDING
            words = "waiting to run" if waiting else "not run"
            bars.append(bar(call.created_at, closed, label=words, title=f"{name}: {words}",
                            kind="waiting-person" if waiting else "queued", css=f"tool-pending tool-{call.status}", row=row))
    for position, row in enumerate(rows):
        row["rule_y"] = position * TIMELINE_ROW_HEIGHT
    kinds = {item["kind"] for item in bars}
    plot_height = len(rows) * TIMELINE_ROW_HEIGHT
    return {
        "rows": rows,
        "bars": bars,
        "row_height": TIMELINE_ROW_HEIGHT - 6,
        "plot_height": plot_height,
        "height": plot_height + TIMELINE_AXIS_HEIGHT,
        "axis_y": plot_height + 2,
        "tick_y": plot_height + 16,
        "ticks": [{"fraction": fraction, "x": fraction * 100, "label": duration_text(total * fraction),
                   "anchor": "start" if fraction == 0 else ("end" if fraction == 1 else "middle")}
                  for fraction in TIMELINE_TICKS],
        "legend": [{"kind": kind, "label": label} for kind, label in TIMELINE_LEGEND if kind in kinds],
        "total": duration_text(total),
        "total_seconds": round(total, 3),
        "ongoing": ongoing,
        "start_ms": int(start.timestamp() * 1000),
        "now_ms": int(now.timestamp() * 1000),
    }


# --- live events ---------------------------------------------------------------------------------


def console_event(event: dict, *, desk_view: bool) -> dict:
    """A run event as the console's socket passes it on: a tool call carries the card's words
    (with its tool's result summary) and badge; for the customer, what names internals is blanked —
    a discarded step's reason (an unknown tool's name among them), error codes and details."""
    kind, payload = event.get("type"), event.get("payload") or {}
    if kind == RunEventType.TOOL_CALL and payload.get("tool"):
        tool_name, status = payload["tool"], payload.get("status", "")
        if status == ToolCallStatus.SUCCEEDED or tool_name == ASK_USER:
            message = tool_card_text(tool_name=tool_name, effect=payload.get("effect", ""), status=status,
                                     arguments=payload.get("arguments"), result=payload.get("result"),
                                     error_code=payload.get("error_code") or "")
        else:
            message = payload.get("message", "")  # the run-time's plain words (tools_app.outcomes)
        payload = {**payload, "message": message, "status_label": tool_status_label(tool_name=tool_name, status=status)}
    if not desk_view:
        hidden = INTERNAL_FIELDS + (("reason",) if kind == RunEventType.STEP_DISCARDED else ())
        if any(payload.get(field) for field in hidden):
            payload = {key: ("" if key in hidden else value) for key, value in payload.items()}
    return {**event, "payload": payload}


def draft_call_shown(name) -> bool:
    """Whether a customer may see a draft tool call (streamed before its turn is checked): only
    calls of tools that exist; the turn asking for anything else is thrown away unseen."""
    return isinstance(name, str) and tool_get(name) is not None


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
