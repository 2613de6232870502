"""The live console's pages (SPEC §13): server-rendered, kept live by console.js over the
websocket (console.consumer). Checks and actions are console.actions,
shared with the socket; what a run looks like is console.presenters."""

import math
import uuid
from pathlib import Path

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import SuspiciousFileOperation
from django.db.models import OuterRef, Subquery
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.static import serve

from config.errors import CommonRefusal, WardenError
from agents.errors import AgentRefusal
from approvals_app.models import Approval
from runs_app.models import ACTIVE_STATUSES, Run
from agents.selectors import agent_get, agent_list
from access import policy as access
from console.actions import (
    console_approval_decide,
    console_held_input_choose,
    console_message_post,
    console_run_cancel,
    console_run_get,
    console_session_create,
    console_session_get,
)
from console.cancel_preview import cancel_preview
from console.presenters import console_run_view, consistent_snapshot
from engine.actions.messages import PostResult
from sessions_app.models import InputMode, PendingInput, Session
from sessions_app.selectors import held_input_list

LOGIN_URL = reverse_lazy("console:login")
# Where console.js opens its socket (console.routing mounts the consumer here).
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


class ConsoleLoginView(auth_views.LoginView):
    """Customers are not staff, so the admin's login (staff only) cannot let them in."""

    template_name = "console/login.html"
    redirect_authenticated_user = True

    def get_default_redirect_url(self):
        return reverse("console:home")


class ConsoleLogoutView(auth_views.LogoutView):
    next_page = LOGIN_URL


def login_locked_out(request, original_response=None, credentials=None):
    """django-axes' answer to a login while logins are locked (settings.AXES_LOCKOUT_CALLABLE), on the
    console's and the admin's login alike: 429, how long, and Retry-After. The attempt that got
    here started the lockout again, so it ends one lockout period from now."""
    lockout = settings.AXES_COOLOFF_TIME
    ends_at = timezone.now() + lockout
    minutes = max(1, math.ceil(lockout.total_seconds() / 60))
    response = render(request, "console/locked_out.html", {
        "minutes": minutes, "ends_at": ends_at, "login_url": request.path,
    }, status=429)
    response["Retry-After"] = str(math.ceil(lockout.total_seconds()))
    return response


# The sidebar lists this many of the user's most recent sessions.
SIDEBAR_SESSIONS = 50


def _session_list(user):
    active_status = Run.objects.filter(session=OuterRef("pk"), status__in=ACTIVE_STATUSES).values("status")[:1]
    return list(Session.objects.filter(owner_id=user.pk).annotate(active_status=Subquery(active_status))[:SIDEBAR_SESSIONS])


def _page_context(request, *, session: Session | None) -> dict:
    return {
        "sessions": _session_list(request.user),
        "session": session,
        "interjection_modes": INTERJECTION_MODES,
        # The "New session" agent picker, the deployment's default first.
        "agents": agent_list() if access.can_see_agents(user=request.user) else [],
        "default_agent": settings.WARDEN_DEFAULT_AGENT,
    }


@require_GET
@login_required(login_url=LOGIN_URL)
def console_home(request):
    return render(request, "console/home.html", _page_context(request, session=None))


@require_POST
@login_required(login_url=LOGIN_URL)
def console_session_new(request):
    agent = None
    if request.POST.get("agent"):
        agent = agent_get(slug=request.POST["agent"]) if access.can_see_agents(user=request.user) else None
        if agent is None:
            _flash_error(request, WardenError(AgentRefusal.UNKNOWN_AGENT, "There is no such agent; pick one from the list."))
            return redirect("console:home")
    try:
        session = console_session_create(user=request.user, title=request.POST.get("title"), agent=agent)
    except WardenError as error:
        _flash_error(request, error)
        return redirect("console:home")
    return redirect("console:session", session_id=session.pk)


@require_GET
@login_required(login_url=LOGIN_URL)
def console_session(request, session_id):
    try:
        session = console_session_get(user=request.user, session_id=session_id)
    except WardenError as error:
        raise Http404(error.message) from error
    viewer = request.user
    session_runs = Run.objects.filter(session=session) if access.can_see_runs_of(user=viewer, session=session) else Run.objects.none()
    with consistent_snapshot():
        runs = list(session_runs.select_related("session", "cancel_requested_by").order_by("-created_at")[:RUNS_PER_PAGE])[::-1]
        run_views = [console_run_view(run=run, viewer=viewer) for run in runs]
        pending = list(PendingInput.objects.filter(session=session, consumed_at__isnull=True).order_by("id"))
        held = held_input_list(session=session)
    is_owner = access.can_post_in_session(user=viewer, session=session)
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
            # An operator watching sees decisions' notes; the customer sees the customer's view.
            "desk_view": access.reads_desk_notes(user=viewer, session_owner_id=session.owner_id),
            "admin_approvals_url": reverse("admin:approvals_app_approval_changelist") if viewer.is_staff else "",
        },
    }
    context = _page_context(request, session=session) | {
        "run_views": run_views,
        "pending_inputs": pending,
        "held_inputs": held,
        "is_owner": is_owner,
        "has_active_run": any(v.is_active for v in run_views),
        "older_runs_hidden": session_runs.count() > len(run_views),
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
    except WardenError as error:
        raise Http404(error.message) from error
    with consistent_snapshot():
        run = Run.objects.select_related("session", "cancel_requested_by").get(pk=run.pk)
        view = console_run_view(run=run, viewer=request.user)
        pending = list(PendingInput.objects.filter(session_id=run.session_id, consumed_at__isnull=True).order_by("id"))
        held = held_input_list(session=run.session)
    return render(request, "console/run_fragment.html", {
        "view": view,
        "pending_inputs": pending,
        "held_inputs": held,
        "is_owner": access.can_post_in_session(user=request.user, session=run.session),
        "admin_approvals_url": reverse("admin:approvals_app_approval_changelist") if request.user.is_staff else "",
    })


@require_GET
@login_required(login_url=LOGIN_URL)
def console_session_states(request):
    """The sidebar's badges: each listed session's active run status (null when idle). console.js
    asks now and then; the session on screen is kept live by its socket."""
    states = {str(item.pk): item.active_status for item in _session_list(request.user)}
    response = JsonResponse({"sessions": states})
    response["Cache-Control"] = "no-store"
    return response


@require_GET
def console_favicon(request):
    """/favicon.ico, asked for by every browser on every page: the console's icon (SVG)."""
    response = serve(request, "favicon.svg", document_root=ASSETS_DIR)
    response["Content-Type"] = "image/svg+xml"
    response["Cache-Control"] = "public, max-age=86400"
    return response


def _flash_error(request, error: WardenError) -> None:
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
    except WardenError as error:
        if error.code is CommonRefusal.NOT_FOUND:
            raise Http404(error.message) from error
        _flash_error(request, error)
    return redirect("console:session", session_id=session_id)


@require_http_methods(["GET", "POST"])
@login_required(login_url=LOGIN_URL)
def console_run_cancel_view(request, run_id):
    """GET: what cancelling would leave done, wait for, stop and hold, and the question — a page
    of its own without JavaScript, a fragment (`?fragment=1`) console.js shows in the run. POST:
    cancel (through the cancel protocol)."""
    if request.method == "GET":
        return _cancel_confirmation(request, run_id)
    try:
        run = console_run_cancel(user=request.user, run_id=run_id, reason=request.POST.get("reason", ""))
    except WardenError as error:
        if error.code is CommonRefusal.NOT_FOUND:
            raise Http404(error.message) from error
        _flash_error(request, error)
        run = Run.objects.get(pk=run_id)
    return redirect("console:session", session_id=run.session_id)


def _cancel_confirmation(request, run_id):
    try:
        run = console_run_get(user=request.user, run_id=run_id)
    except WardenError as error:
        raise Http404(error.message) from error
    if not access.can_cancel_run(user=request.user, run=run, even_if_ended=True):
        raise Http404("No such run.")
    with consistent_snapshot():
        preview = cancel_preview(run=Run.objects.select_related("session").get(pk=run.pk))
    context = {"preview": preview, "run": preview.run}
    if request.GET.get("fragment"):
        response = render(request, "console/_cancel_confirm.html", context)
    else:
        response = render(request, "console/cancel_confirm.html", _page_context(request, session=run.session) | context)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@login_required(login_url=LOGIN_URL)
def console_held_input_view(request, pending_id):
    """"Send as a new request" or "Drop it" for input held from a cancelled run. A plain form post
    is answered with the session page; console.js (Accept: application/json) gets JSON, its
    refusals as the API's body with their status."""
    wants_json = "application/json" in request.headers.get("Accept", "")
    try:
        result = console_held_input_choose(user=request.user, pending_id=pending_id, choice=request.POST.get("choice", ""))
    except WardenError as error:
        if wants_json:
            return JsonResponse({"code": error.code.value, "message": error.message}, status=error.code.status)
        if error.code is CommonRefusal.NOT_FOUND:
            raise Http404(error.message) from error
        _flash_error(request, error)
        pending = PendingInput.objects.filter(pk=pending_id).first()
        return redirect("console:session", session_id=pending.session_id) if pending else redirect("console:home")
    if isinstance(result, PostResult):
        session_id, body = result.run.session_id, {"choice": "send", "disposition": result.disposition,
                                                   "run_id": str(result.run.id)}
    else:
        session_id, body = result.session_id, {"choice": "drop", "disposition": result.disposition}
    if wants_json:
        return JsonResponse(body)
    return redirect("console:session", session_id=session_id)


@require_POST
@login_required(login_url=LOGIN_URL)
def console_approval_decide_view(request, approval_id):
    try:
        approval = console_approval_decide(
            user=request.user, approval_id=approval_id, decision=request.POST.get("decision", ""),
            note=request.POST.get("note", ""),
        )
    except WardenError as error:
        if error.code is CommonRefusal.NOT_FOUND:
            raise Http404(error.message) from error
        _flash_error(request, error)
        approval = Approval.objects.select_related("run").get(pk=approval_id)
    return redirect("console:session", session_id=approval.run.session_id)


@require_GET
def console_asset(request, path):
    """The console's own JS and CSS. daphne serves no /static/ when DEBUG is off, and the
    console must work in exactly that configuration. A path that leaves the folder is a 404
    like any missing file."""
    try:
        response = serve(request, path, document_root=ASSETS_DIR)
    except SuspiciousFileOperation as error:
        raise Http404("No such asset.") from error
    response["Cache-Control"] = "no-cache"
    return response
