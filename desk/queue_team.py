"""The approval queue worked by a team on shift (issue 29): who has which request in hand (assign
to me, to someone, unassign — engine.actions.approvals.approval_assign), the views that follow from
it (mine, unassigned), the tier and waiting-time filters the dashboard's counts link to, and each
operator's saved views. The queue's ModelAdmin (desk/approvals.py) wires these in."""

from datetime import datetime, timezone as dt_timezone
from urllib.parse import urlsplit

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import Resolver404, resolve, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme

from access import policy as access
from approvals_app.models import Approval, ApprovalStatus
from approvals_app.selectors import APPROVAL_TIERS, WAIT_BANDS, approval_pending_counts, approval_wait_band, saved_view_list
from config.errors import WardenError
from desk.display import compact_arguments, countdown
from desk.panels import DeskPanel, desk_panel_add
from engine.actions.approvals import approval_assign
from engine.actions.desk_lists import saved_view_remove, saved_view_save
from notifications.notices import deciders_with_permission

# An assignment covers at most this many requests at once (two pages of the queue).
ASSIGN_LIMIT = 100


class AssignedFilter(admin.SimpleListFilter):
    """Whose hands a request is in: the caller's ("Mine"), nobody's, or a colleague's."""

    title = "assigned"
    parameter_name = "assigned"
    MINE, NOBODY, OTHERS = "mine", "none", "others"

    def lookups(self, request, model_admin):
        return [(self.MINE, "Mine"), (self.NOBODY, "Unassigned"), (self.OTHERS, "Someone else's")]

    def queryset(self, request, queryset):
        if self.value() == self.MINE:
            return queryset.filter(assigned_to_id=request.user.pk)
        if self.value() == self.NOBODY:
            return queryset.filter(assigned_to__isnull=True)
        if self.value() == self.OTHERS:
            return queryset.filter(assigned_to__isnull=False).exclude(assigned_to_id=request.user.pk)
        return queryset


class TierFilter(admin.SimpleListFilter):
    """Who must decide: the customer, one operator, or a quorum of operators."""

    title = "tier"
    parameter_name = "tier"

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _) in APPROVAL_TIERS.items()]

    def queryset(self, request, queryset):
        tier = APPROVAL_TIERS.get(self.value() or "")
        return queryset.filter(tier[1]) if tier else queryset


class WaitedFilter(admin.SimpleListFilter):
    """How long a request has waited. "gt1h@1764900000" counts at that moment (the dashboard's
    links carry the moment they were counted, so the list holds exactly the rows counted)."""

    title = "waited"
    parameter_name = "waited"

    def lookups(self, request, model_admin):
        return list(WAIT_BANDS.items())

    def queryset(self, request, queryset):
        band, _, moment = (self.value() or "").partition("@")
        if band not in WAIT_BANDS:
            return queryset
        try:
            now = datetime.fromtimestamp(float(moment), tz=dt_timezone.utc) if moment else timezone.now()
        except (ValueError, OverflowError):
            now = timezone.now()
        return queryset.filter(approval_wait_band(band=band, now=now))


def assignment_of(approval: Approval, user) -> str:
    """The queue's "assigned" column: "you", a colleague's name, or "—"."""
    if not approval.assigned_to_id:
        return "—"
    return "you" if approval.assigned_to_id == user.pk else approval.assigned_to.get_username()


def assign_action(model_admin, request, queryset, *, to_me: bool = False, unassign: bool = False):
    """"Assign to me" and "Unassign" at once; "Assign to…" through a page that asks to whom."""
    approvals = list(queryset.select_related("run__session__owner", "tool_call", "assigned_to")
                     .order_by("requested_at")[:ASSIGN_LIMIT + 1])
    if len(approvals) > ASSIGN_LIMIT:
        messages.error(request, f"Select at most {ASSIGN_LIMIT} requests at once.")
        return None
    if to_me or unassign:
        return _assigned(request, approvals, assignee=None if unassign else request.user)
    candidates = assignable_operators()
    chosen = request.POST.get("assignee", "") if request.POST.get("confirm") == "yes" else ""
    if chosen:
        assignee = candidates.filter(pk=chosen).first() if chosen.isdigit() else None
        if assignee is None:
            messages.error(request, "Choose an operator who may decide requests.")
        else:
            return _assigned(request, approvals, assignee=assignee)
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Assign {_requests(len(approvals))} to…",
        "opts": opts,
        "app_label": opts.app_label,
        "rows": [{"approval": approval, "arguments": compact_arguments(approval.tool_call.arguments),
                  "customer": approval.run.session.owner.get_username(), "assigned": assignment_of(approval, request.user),
                  "expiry": countdown(approval.expires_at) if approval.status == ApprovalStatus.PENDING else "—"}
                 for approval in approvals],
        "candidates": [(user, user.pk == request.user.pk) for user in candidates],
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/approvals_app/approval/assign.html", context)


def assignable_operators():
    """Who the "Assign to…" page offers: staff who may decide operator requests. Each request is
    still checked for the one chosen (four eyes, quorums) when it is assigned."""
    return deciders_with_permission().filter(is_staff=True)


def _assigned(request, approvals: list[Approval], *, assignee):
    try:
        changed = approval_assign(approvals=approvals, assignee=assignee, acting_user=request.user)
    except WardenError as error:
        messages.error(request, error.message)
        return None
    if assignee is None:
        what = "now unassigned"
    else:
        what = "assigned to you" if assignee.pk == request.user.pk else f"assigned to {assignee.get_username()}"
    unchanged = len(approvals) - len(changed)
    messages.success(request, f"{_requests(len(changed))} {what}" + (f"; {unchanged} already were." if unchanged else "."))
    return None


def _requests(count: int) -> str:
    return f"{count} request{'' if count == 1 else 's'}"


# --- saved views ---------------------------------------------------------------------------------

def is_desk_list(url: str) -> bool:
    """A path of one of the desk's lists (an admin changelist), its query string aside."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or not parts.path.startswith("/") or parts.path.startswith("//"):
        return False
    try:
        match = resolve(parts.path)
    except Resolver404:
        return False
    return match.namespace == "admin" and (match.url_name or "").endswith("_changelist")


def saved_view_save_view(request):
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    url = request.POST.get("url", "")
    back = url if is_desk_list(url) else reverse("admin:approvals_app_approval_changelist")
    if not is_desk_list(url):
        messages.error(request, "Only a list of the desk can be saved as a view.")
        return HttpResponseRedirect(back)
    try:
        saved = saved_view_save(owner=request.user, name=request.POST.get("name", ""), url=url)
    except WardenError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Saved as your view “{saved.name}”.")
    return HttpResponseRedirect(back)


def saved_view_delete_view(request, saved_view_id: int):
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        saved_view_remove(owner=request.user, saved_view_id=saved_view_id)
    except WardenError as error:
        raise Http404(error.message) from None
    messages.success(request, "Saved view deleted.")
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        back = reverse("admin:approvals_app_approval_changelist")
    return HttpResponseRedirect(back)


def queue_context(request) -> dict:
    """What the queue's template adds: the quick views, one's saved views, the keyboard's keys."""
    counts = approval_pending_counts(approvals=access.visible_approvals(user=request.user), user=request.user)
    current = request.GET.get(AssignedFilter.parameter_name, "")
    views = []
    for value, label, count in [("", "Everyone's", None), (AssignedFilter.MINE, "Mine", counts.mine),
                                (AssignedFilter.NOBODY, "Unassigned", counts.unassigned)]:
        # The same list otherwise (status, search, tier…), from its first page.
        params = request.GET.copy()
        params.pop("p", None)
        params.pop(AssignedFilter.parameter_name, None)
        if value:
            params[AssignedFilter.parameter_name] = value
        views.append({"id": f"view-{ {'': 'everyone', 'none': 'unassigned'}.get(value, value)}", "label": label, "count": count, "current": value == current,
                      "href": f"?{params.urlencode()}"})
    return {
        "queue_views": views,
        "saved_views": saved_view_list(owner=request.user),
        "current_url": request.get_full_path(),
        "pending_counts": counts,
    }


# --- the dashboard's counts ------------------------------------------------------------------------

def pending_counts_panel(request) -> dict | None:
    """The dashboard's counts of pending requests by tier and by waiting time, each a link to the
    queue filtered to exactly the rows counted (the waits at the moment they were counted)."""
    counts = approval_pending_counts(approvals=access.visible_approvals(user=request.user), user=request.user)
    queue = reverse("admin:approvals_app_approval_changelist")
    moment = f"{counts.now.timestamp():.6f}"
    return {
        "tiers": [(key, label, counts.by_tier[key], f"{queue}?status__exact=pending&tier={key}")
                  for key, (label, _) in APPROVAL_TIERS.items()],
        "waits": [(key, label, counts.by_wait[key], f"{queue}?status__exact=pending&waited={key}@{moment}")
                  for key, label in WAIT_BANDS.items()],
        "mine": (counts.mine, f"{queue}?status__exact=pending&assigned=mine"),
        "unassigned": (counts.unassigned, f"{queue}?status__exact=pending&assigned=none"),
    }


desk_panel_add(DeskPanel(template="admin/desk/pending_counts.html", context=pending_counts_panel))
