"""The live console (SPEC §13): server-rendered pages that console.js keeps live over the
websocket (sessions_app.consumers).

The checks and actions here are shared with the consumer, so a page and a socket never
disagree about who may see or do what; every write goes through the apps' services.
"""

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.contrib import messages as flash
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.db import connection, transaction
from django.db.models import OuterRef, Subquery
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django.views.static import serve

from approvals_app.models import Approval, ApprovalPolicy, ApprovalStatus
from config.api_base import storable_text
from approvals_app.services import ApprovalError, approval_can_decide, approval_decide
from runs_app.engine.cancel import RunNotCancellable, applied_effects, run_cancel_request
from runs_app.models import ACTIVE_STATUSES, TERMINAL_STATUSES, Run, RunEvent, RunStatus, Step, StepKind
from sessions_app.models import InputMode, Message, MessageRole, PendingInput, Session
from sessions_app.services import MAX_MESSAGE_CHARS, PostResult, SessionError, message_post, session_create
from tools_app.models import ToolCall

LOGIN_URL = reverse_lazy("console:login")
# Where console.js opens its socket (sessions_app.routing mounts the consumer here).
CONSOLE_WS_PATH = "ws/console/"
ASSETS_DIR = Path(__file__).resolve().parent / "static" / "console"
# The page renders this many of a session's most recent runs; older ones stay in the admin.
RUNS_PER_PAGE = 30

INTERJECTION_MODES = [
    (InputMode.AUTO, "Let Warden decide"),
    (InputMode.SUPPLEMENT, "Add to the current request"),
    (InputMode.NEW_INTENT, "Switch: cancel it and ask this instead"),
    (InputMode.QUEUE, "Queue for after this run"),
]


# --- who may see and do what ---------------------------------------------------------------


def console_text(value, *, field: str, limit: int) -> str:
    """Text from a console form or the socket, held to what the API accepts for the same field
    (length, no NUL, valid Unicode): a refusal, not a database error after the fact."""
    text = str(value or "").strip()
    if len(text) > limit:
        raise ConsoleError("bad_request", f"The {field} may hold at most {limit} characters.")
    try:
        return storable_text(text)
    except ValueError as error:
        raise ConsoleError("bad_request", f"The {field} {error}.") from error


# As the API's: a cancel reason and a decision note.
CANCEL_REASON_CHARS = 300
DECISION_NOTE_CHARS = 2000


class ConsoleError(Exception):
    """A refused console action, with a machine-readable code (sent as JSON on the socket,
    shown as a message on the page)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def console_may_watch_any(user) -> bool:
    """Operators with the run view permission may watch any session; everyone else only their own."""
    return bool(user.is_active and user.is_staff and user.has_perm("runs_app.view_run"))


def uuid_or_none(value) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except (TypeError, ValueError, AttributeError):
        return None


def console_session_get(*, user, session_id) -> Session:
    """The session if `user` may see it. Someone else's session is reported exactly like a
    missing one, so its existence does not leak."""
    pk = uuid_or_none(session_id)
    sessions = Session.objects.filter(pk=pk) if pk else Session.objects.none()
    if not console_may_watch_any(user):
        sessions = sessions.filter(owner_id=user.pk)
    session = sessions.select_related("owner").first()
    if session is None:
        raise ConsoleError("not_found", "No such session.")
    return session


def console_run_get(*, user, run_id) -> Run:
    pk = uuid_or_none(run_id)
    runs = Run.objects.filter(pk=pk) if pk else Run.objects.none()
    if not console_may_watch_any(user):
        runs = runs.filter(session__owner_id=user.pk)
    run = runs.select_related("session", "cancel_requested_by").first()
    if run is None:
        raise ConsoleError("not_found", "No such run.")
    return run


def console_message_post(*, user, session_id, content: str, mode: str) -> PostResult:
    session = console_session_get(user=user, session_id=session_id)
    if session.owner_id != user.pk:
        raise ConsoleError("forbidden", "Only the session's owner can write in it.")
    content = console_text(content, field="message", limit=MAX_MESSAGE_CHARS)
    try:
        return message_post(session=session, content=content, mode=mode or InputMode.AUTO, acting_user=user)
    except SessionError as error:
        raise ConsoleError(error.code, error.message) from error


def console_run_cancel(*, user, run_id, reason: str = "") -> Run:
    run = console_run_get(user=user, run_id=run_id)
    if run.session.owner_id != user.pk and not user.has_perm("runs_app.change_run"):
        raise ConsoleError("forbidden", "Only the session's owner or an operator can cancel this run.")
    reason = console_text(reason, field="reason", limit=CANCEL_REASON_CHARS)
    try:
        return run_cancel_request(run=run, acting_user=user, reason=reason or "cancelled from the console")
    except RunNotCancellable as error:
        raise ConsoleError(error.code, error.message) from error


def console_approval_decide(*, user, approval_id, decision: str, note: str = "") -> Approval:
    pk = uuid_or_none(approval_id)
    approval = Approval.objects.select_related("run").filter(pk=pk).first() if pk else None
    if approval is None:
        raise ConsoleError("not_found", "No such approval.")
    console_session_get(user=user, session_id=approval.run.session_id)  # not_found for strangers
    if decision not in ("approve", "reject"):
        raise ConsoleError("bad_request", "decision must be 'approve' or 'reject'.")
    note = console_text(note, field="note", limit=DECISION_NOTE_CHARS)
    try:
        return approval_decide(approval=approval, decision=decision, note=note, acting_user=user)
    except ApprovalError as error:
        raise ConsoleError(error.code, error.message) from error


# --- what a run looks like -------------------------------------------------------------------


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
        "can_decide": approval.status == ApprovalStatus.PENDING
        and approval.policy == ApprovalPolicy.USER
        and approval_can_decide(user=viewer, approval=approval),
    }


def state_label(*, status: str, phase: str, wait_reason: str) -> str:
    if status == RunStatus.RUNNING and phase:
        return phase.replace("_", " ")
    if status == RunStatus.WAITING and wait_reason:
        return f"for {wait_reason.replace('_', ' ')}"
    if status == RunStatus.QUEUED:
        return "waiting for a worker"
    return ""


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
        can_cancel=run.status in ACTIVE_STATUSES
        and (run.session.owner_id == viewer.pk or viewer.has_perm("runs_app.change_run")),
        error=" — ".join(filter(None, [run.error_code, run.error_detail])) if run.status == RunStatus.FAILED else "",
        state_label=state_label(status=run.status, phase=run.phase, wait_reason=run.wait_reason),
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


# --- the timeline picture --------------------------------------------------------------------

TIMELINE_WIDTH = 720
TIMELINE_LABEL_WIDTH = 96
TIMELINE_PLOT_WIDTH = TIMELINE_WIDTH - TIMELINE_LABEL_WIDTH - 8
TIMELINE_MAX_TOOL_ROWS = 6


def duration_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} m {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} m"


def _state_key(payload: dict) -> str:
    status = payload.get("status", "")
    if status == RunStatus.RUNNING:
        return payload.get("phase") or "running"
    if status == RunStatus.WAITING:
        return f"waiting_{payload.get('wait_reason') or 'other'}"
    return status


def run_timeline(*, run: Run, events: list[dict], steps: list[Step], calls: list[ToolCall], now: datetime) -> dict:
    """Where the run's time went: its states (from the run_status events), its steps and its
    tool calls, as bars on one time axis from creation to the end (or now)."""
    start = run.created_at
    end = run.finished_at or now
    total = max((end - start).total_seconds(), 0.001)

    def x_of(moment: datetime) -> float:
        offset = min(max((moment - start).total_seconds(), 0.0), total)
        return TIMELINE_LABEL_WIDTH + offset / total * TIMELINE_PLOT_WIDTH

    def bar(begin: datetime, finish: datetime, *, label: str, css: str, row: int) -> dict:
        seconds = max((finish - begin).total_seconds(), 0.0)
        x = x_of(begin)
        width = max(x_of(finish) - x, 1.5)
        text = f"{label} {duration_text(seconds)}"
        return {"x": round(x, 1), "text_x": round(x + 3, 1), "width": round(width, 1), "css": css, "row": row, "title": text,
                "label": text if width >= 8 * len(text) * 0.75 else (label if width >= 7 * len(label) else "")}

    marks = [(e["created_at"], _state_key(e["payload"])) for e in events if e["type"] == "run_status"]
    states, totals = [], {}
    for position, (moment, key) in enumerate(marks):
        if key in TERMINAL_STATUSES:
            break
        finish = marks[position + 1][0] if position + 1 < len(marks) else end
        label = key.replace("waiting_", "waiting: ").replace("_", " ")
        states.append(bar(moment, finish, label=label, css=f"state-{key}", row=0))
        totals[label] = totals.get(label, 0.0) + max((finish - moment).total_seconds(), 0.0)

    step_bars = [
        bar(step.started_at, step.finished_at or end, label=f"{step.kind} #{step.index}",
            css=f"step-{step.kind} step-{step.status}", row=1)
        for step in steps
    ]
    tool_bars = []
    for position, call in enumerate(calls[: TIMELINE_MAX_TOOL_ROWS]):
        row = 2 + position
        if call.started_at and call.started_at > call.created_at:
            tool_bars.append(bar(call.created_at, call.started_at, label="pending", css="tool-pending", row=row))
        if call.started_at:
            tool_bars.append(bar(call.started_at, call.finished_at or end, label=call.tool_name,
                                 css=f"tool-{call.status}", row=row))
        else:
            tool_bars.append(bar(call.created_at, call.finished_at or end, label=f"{call.tool_name} (not started)",
                                 css=f"tool-pending tool-{call.status}", row=row))
    rows = [("state", 0), ("steps", 1)] + [
        (call.tool_name[:14], 2 + position) for position, call in enumerate(calls[: TIMELINE_MAX_TOOL_ROWS])
    ]
    row_height = 20
    height = len(rows) * row_height + 22
    ticks = [
        {"x": round(TIMELINE_LABEL_WIDTH + fraction * TIMELINE_PLOT_WIDTH, 1), "label": duration_text(total * fraction),
         "anchor": "start" if fraction == 0 else ("end" if fraction == 1 else "middle")}
        for fraction in (0, 0.25, 0.5, 0.75, 1)
    ]
    for item in states + step_bars + tool_bars:
        item["y"] = item["row"] * row_height + 2
        item["text_y"] = item["y"] + 12
    return {
        "width": TIMELINE_WIDTH,
        "height": height,
        "row_height": row_height - 4,
        "bars": states + step_bars + tool_bars,
        "rows": [{"label": label, "y": row * row_height + 14} for label, row in rows],
        "axis_y": len(rows) * row_height + 4,
        "ticks": ticks,
        "tick_y": len(rows) * row_height + 18,
        "plot_x": TIMELINE_LABEL_WIDTH,
        "plot_end": TIMELINE_LABEL_WIDTH + TIMELINE_PLOT_WIDTH,
        "total": duration_text(total),
        "ongoing": run.finished_at is None,
        "summary": [f"{label} {duration_text(seconds)}" for label, seconds in sorted(totals.items(), key=lambda kv: -kv[1])],
    }


# --- pages -----------------------------------------------------------------------------------


class ConsoleLoginView(auth_views.LoginView):
    """Customers are not staff, so the admin's login (staff only) cannot let them in."""

    template_name = "console/login.html"
    redirect_authenticated_user = True

    def get_default_redirect_url(self):
        return reverse("console:home")


class ConsoleLogoutView(auth_views.LogoutView):
    next_page = LOGIN_URL


def _session_list(user):
    active_status = Run.objects.filter(session=OuterRef("pk"), status__in=ACTIVE_STATUSES).values("status")[:1]
    return list(Session.objects.filter(owner_id=user.pk).annotate(active_status=Subquery(active_status))[:50])


def _page_context(request, *, session: Session | None) -> dict:
    return {
        "sessions": _session_list(request.user),
        "session": session,
        "interjection_modes": INTERJECTION_MODES,
    }


@require_GET
@login_required(login_url=LOGIN_URL)
def console_home(request):
    return render(request, "console/home.html", _page_context(request, session=None))


@require_POST
@login_required(login_url=LOGIN_URL)
def console_session_new(request):
    try:
        title = console_text(request.POST.get("title"), field="title", limit=Session._meta.get_field("title").max_length)
    except ConsoleError as error:
        _flash_error(request, error)
        return redirect("console:home")
    session = session_create(owner=request.user, title=title or "New session")
    return redirect("console:session", session_id=session.pk)


@require_GET
@login_required(login_url=LOGIN_URL)
def console_session(request, session_id):
    try:
        session = console_session_get(user=request.user, session_id=session_id)
    except ConsoleError as error:
        raise Http404(error.message) from error
    viewer = request.user
    with consistent_snapshot():
        runs = list(
            Run.objects.filter(session=session).select_related("session", "cancel_requested_by").order_by("-created_at")[:RUNS_PER_PAGE]
        )[::-1]
        run_views = [console_run_view(run=run, viewer=viewer) for run in runs]
        pending = list(PendingInput.objects.filter(session=session, consumed_at__isnull=True).order_by("id"))
    is_owner = session.owner_id == viewer.pk
    config = {
        "session": str(session.pk),
        "ws_path": "/" + CONSOLE_WS_PATH,
        "run_url": reverse("console:run", kwargs={"run_id": uuid.UUID(int=0)}),
        "approval_decide_url": reverse("console:approval_decide", kwargs={"approval_id": uuid.UUID(int=0)}),
        "runs": {str(v.run.id): v.last_seq for v in run_views},
        "viewer": {
            "username": viewer.get_username(),
            "is_owner": is_owner,
            "is_staff": bool(viewer.is_staff),
            "admin_approvals_url": reverse("admin:approvals_app_approval_changelist") if viewer.is_staff else "",
        },
    }
    context = _page_context(request, session=session) | {
        "run_views": run_views,
        "pending_inputs": pending,
        "is_owner": is_owner,
        "has_active_run": any(v.is_active for v in run_views),
        "older_runs_hidden": Run.objects.filter(session=session).count() > len(run_views),
        "console_config": config,
        "admin_approvals_url": config["viewer"]["admin_approvals_url"],
    }
    return render(request, "console/session.html", context)


@require_GET
@login_required(login_url=LOGIN_URL)
def console_run(request, run_id):
    """One run's section (and the session's queued inputs), for console.js to insert or
    refresh: a new run appeared, a run ended, or its timeline changed."""
    try:
        run = console_run_get(user=request.user, run_id=run_id)
    except ConsoleError as error:
        raise Http404(error.message) from error
    with consistent_snapshot():
        run = Run.objects.select_related("session", "cancel_requested_by").get(pk=run.pk)
        view = console_run_view(run=run, viewer=request.user)
        pending = list(PendingInput.objects.filter(session_id=run.session_id, consumed_at__isnull=True).order_by("id"))
    return render(request, "console/run_fragment.html", {
        "view": view,
        "pending_inputs": pending,
        "is_owner": run.session.owner_id == request.user.pk,
        "admin_approvals_url": reverse("admin:approvals_app_approval_changelist") if request.user.is_staff else "",
    })


def _flash_error(request, error: ConsoleError) -> None:
    flash.error(request, f"{error.message} ({error.code})")


@require_POST
@login_required(login_url=LOGIN_URL)
def console_message_post_view(request, session_id):
    """The composer without JavaScript; console.js sends the same over the socket."""
    try:
        console_message_post(
            user=request.user, session_id=session_id, content=request.POST.get("content", ""),
            mode=request.POST.get("mode") or InputMode.AUTO,
        )
    except ConsoleError as error:
        if error.code == "not_found":
            raise Http404(error.message) from error
        _flash_error(request, error)
    return redirect("console:session", session_id=session_id)


@require_POST
@login_required(login_url=LOGIN_URL)
def console_run_cancel_view(request, run_id):
    try:
        run = console_run_cancel(user=request.user, run_id=run_id, reason=request.POST.get("reason", ""))
    except ConsoleError as error:
        if error.code == "not_found":
            raise Http404(error.message) from error
        _flash_error(request, error)
        run = Run.objects.get(pk=run_id)
    return redirect("console:session", session_id=run.session_id)


@require_POST
@login_required(login_url=LOGIN_URL)
def console_approval_decide_view(request, approval_id):
    try:
        approval = console_approval_decide(
            user=request.user, approval_id=approval_id, decision=request.POST.get("decision", ""),
            note=request.POST.get("note", ""),
        )
    except ConsoleError as error:
        if error.code == "not_found":
            raise Http404(error.message) from error
        _flash_error(request, error)
        approval = Approval.objects.select_related("run").get(pk=approval_id)
    return redirect("console:session", session_id=approval.run.session_id)


@require_GET
def console_asset(request, path):
    """The console's own JS and CSS. daphne serves no /static/ when DEBUG is off, and the
    console must work in exactly that configuration."""
    response = serve(request, path, document_root=ASSETS_DIR)
    response["Cache-Control"] = "no-cache"
    return response
