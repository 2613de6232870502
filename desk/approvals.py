"""The approval queue and the audit trail of the operators' desk (SPEC §7, §13).

Both are read-only models in the admin: the only way to change an approval is a decision page —
one request, or several at once after a confirmation — which calls `approval_decide` like
every other interface, once per request (each checked and audited on its own)."""

from django.contrib import admin
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html, format_html_join

from desk.display import (
    age, badge, compact_arguments, countdown, expiry_line, money_of, pretty_json, request_label, table, waited,
)
from desk.approval_views import approval_decide_view, approval_edit_view, approvals_decide_action
from approvals_app.models import Approval, ApprovalDecision, ApprovalPolicy, ApprovalStatus, AuditEntry, SavedView
from approvals_app.services import approval_approvers
from approvals_app.selectors import approval_conversation, approval_read_results, approval_same_key_calls
from desk.base import BusinessKeySearch, EstimatedCountPaginator, PolicyScopedAdmin, ReadOnlyAdmin
from desk.export import CsvExportMixin
from desk.queue_team import (
    AssignedFilter, TierFilter, WaitedFilter, assign_action, assignment_of, queue_context, saved_view_delete_view,
    saved_view_save_view,
)
from tools_app.selectors import run_ids_matching
from access import policy as access
from tools_app.registry import tool_get



class QueueStatusFilter(admin.SimpleListFilter):
    """The queue is what is pending, oldest first — the default, and one range of the
    approval_pending_oldest index; the decided ones are a click away."""

    title = "status"
    parameter_name = "status__exact"
    ALL = "all"

    def lookups(self, request, model_admin):
        return [(self.ALL, "All"), *ApprovalStatus.choices]

    def choices(self, changelist):
        value = self.value() or ApprovalStatus.PENDING
        for lookup, title in self.lookup_choices:
            yield {"selected": value == lookup, "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                   "display": title}

    def queryset(self, request, queryset):
        value = self.value() or ApprovalStatus.PENDING
        return queryset if value == self.ALL else queryset.filter(status=value)


class EscalatedFilter(admin.SimpleListFilter):
    """Requests that outlived their agent's service level and were escalated to a second group."""

    title = "escalated"
    parameter_name = "escalated"

    def lookups(self, request, model_admin):
        return [("yes", "Escalated"), ("no", "Not escalated")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(escalated_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(escalated_at__isnull=True)
        return queryset


FOUR_EYES_SHORT = "Four eyes: raised in your own session — another operator decides."


def applicable_rule(approval: Approval) -> str:
    """Why this request needs this decider: the policy, the agent's rule (or the tool's policy)
    that asked for it and why — and for a quorum, how far it has got and who is still needed."""
    tool = tool_get(approval.tool_call.tool_name)
    who = "Operator approval" if approval.policy == ApprovalPolicy.OPERATOR else "Customer's confirmation"
    if approval.rule:
        scope = f"agent rule {approval.rule} ({approval.rule_reason})"
    else:
        scope = f"tool policy: every {approval.tool_call.tool_name}" if tool is not None else "tool no longer registered"
    if approval.policy == ApprovalPolicy.OPERATOR:
        scope += " · four eyes"
    if approval.required_approvals > 1:
        return format_html('{}<br><strong class="desk-quorum">{}</strong><br><small class="desk-muted">{}</small>',
                           who, quorum_progress(approval), scope)
    return format_html('{}<br><small class="desk-muted">{}</small>', who, scope)


def quorum_progress(approval: Approval) -> str:
    """ "1 of 2 approvals (by op1) — needs 1 more operator: not op1, nor alice, whose session it is"."""
    approvers = approval_approvers(approval=approval)
    text = f"{len(approvers)} of {approval.required_approvals} approvals"
    if approvers:
        text += f" (by {', '.join(approvers)})"
    missing = approval.required_approvals - len(approvers)
    if approval.status == ApprovalStatus.PENDING and missing > 0:
        barred = [*approvers, f"{approval.run.session.owner.get_username()}, whose session it is"]
        text += f" — needs {missing} more operator{'s' if missing > 1 else ''} with decide_approval: not {', nor '.join(barred)}"
    return text


@admin.register(Approval)
class ApprovalAdmin(CsvExportMixin, BusinessKeySearch, PolicyScopedAdmin):
    list_display = ("amount", "order", "customer", "waiting", "expiry", "rule_applied", "status_badge", "assigned",
                    "escalation")
    list_display_links = ("order",)  # the column says what the request is about, whatever the tool
    list_select_related = ("run__session__owner", "tool_call", "decided_by", "assigned_to")
    list_filter = (QueueStatusFilter, AssignedFilter, TierFilter, WaitedFilter, "policy", EscalatedFilter)
    change_list_template = "admin/approvals_app/approval/change_list.html"
    csv_exclude = ("decide",)  # buttons, not data
    search_help_text = "Order number or any tool argument, customer, session title, idempotency key, or an id."
    ordering = ("requested_at",)
    actions = ("approve_selected", "reject_selected", "assign_to_me", "assign_to", "unassign")
    list_per_page = 50
    show_full_result_count = False
    fieldsets = (
        ("Decision", {"fields": ("status", "expires", "rule_applied", "policy", "requested_at", "assigned_to", "assigned_at",
                                 "decided_by", "decided_at", "note", "customer_message")}),
        ("Service level", {"fields": ("notified_at", "reminded_at", "escalated_at", "escalated_to")}),
        ("What is asked", {"fields": ("tool", "arguments_pretty", "idempotency_key", "run_link", "session_link")}),
        ("Money over time", {"fields": ("limit_totals", "same_key_calls")}),
        ("What the run found (read tools)", {"fields": ("read_results",)}),
        ("Conversation (latest messages)", {"fields": ("conversation",)}),
    )
    readonly_fields = (
        "expiry", "expires", "rule_applied", "tool", "arguments_pretty", "idempotency_key", "run_link", "session_link", "read_results", "conversation",
        "limit_totals", "same_key_calls",
    )

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("saved-views/save/", wrap(saved_view_save_view), name="approvals_app_approval_view_save"),
            path("saved-views/<int:saved_view_id>/delete/", wrap(saved_view_delete_view), name="approvals_app_approval_view_delete"),
            path("<path:object_id>/approve/", wrap(self.approve_view), name="approvals_app_approval_approve"),
            path("<path:object_id>/reject/", wrap(self.reject_view), name="approvals_app_approval_reject"),
            path("<path:object_id>/edit-arguments/", wrap(self.edit_view), name="approvals_app_approval_edit"),
            *super().get_urls(),
        ]

    def approve_view(self, request, object_id):
        return approval_decide_view(request, model_admin=self, object_id=object_id, decision="approve")

    def reject_view(self, request, object_id):
        return approval_decide_view(request, model_admin=self, object_id=object_id, decision="reject")

    def edit_view(self, request, object_id):
        return approval_edit_view(request, model_admin=self, object_id=object_id)

    def visible(self, user):
        # The API's scope: an operator who may decide sees the operator-level requests (and
        # their own), not every customer's confirmations.
        return access.visible_approvals(user=user)

    def can_see(self, user, obj) -> bool:
        return access.can_see_approval(user=user, approval=obj)

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("run__session__owner", "tool_call", "decided_by", "assigned_to")

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"title": "Approval queue", **queue_context(request), **(extra_context or {})})

    def search_business_keys(self, queryset, term):
        return queryset.filter(run_id__in=run_ids_matching(term=term))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        approval = self.get_object(request, object_id)
        extra_context = {
            **(extra_context or {}),
            "can_decide": approval is not None and self._decidable(request, approval),
            "can_edit": approval is not None and access.can_edit_approval(user=request.user, approval=approval),
            "barred": access.why_not_a_decider(user=request.user, approval=approval)
            if approval is not None and approval.status == ApprovalStatus.PENDING else "",
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def csv_columns(self, changelist):
        # The file names people, never "you": it outlives the screen it came from.
        return ["assigned" if getattr(column, "__name__", column) == "assigned" else column
                for column in super().csv_columns(changelist)]

    def _decidable(self, request, approval: Approval) -> bool:
        return access.can_decide_approval(user=request.user, approval=approval)

    def has_decide_permission(self, request) -> bool:
        # The bulk actions; each request is still checked on its own when decided.
        return access.operator_powers(request.user)["decide_operator_approvals"]

    @admin.action(description="Approve selected requests…", permissions=["decide"])
    def approve_selected(self, request, queryset):
        return approvals_decide_action(self, request, queryset, decision="approve")

    @admin.action(description="Reject selected requests…", permissions=["decide"])
    def reject_selected(self, request, queryset):
        return approvals_decide_action(self, request, queryset, decision="reject")

    # Who has a request in hand (issue 29); only a decider assigns, and only to a decider of each.
    @admin.action(description="Assign to me", permissions=["decide"])
    def assign_to_me(self, request, queryset):
        return assign_action(self, request, queryset, to_me=True)

    @admin.action(description="Assign to…", permissions=["decide"])
    def assign_to(self, request, queryset):
        return assign_action(self, request, queryset)

    @admin.action(description="Unassign", permissions=["decide"])
    def unassign(self, request, queryset):
        return assign_action(self, request, queryset, unassign=True)

    # --- columns ------------------------------------------------------------------------------

    @admin.display(description="amount")
    def amount(self, obj):
        value = money_of(obj.tool_call.tool_name, obj.tool_call.arguments)
        return format_html('<span class="desk-amount">{}</span>', value) if value is not None else "—"

    # The request's reference and counterparty, as its tool declares them (not always an order).
    @admin.display(description="request")
    def order(self, obj):
        label = request_label(obj.tool_call.tool_name, obj.tool_call.arguments)
        return format_html('{}<br><small class="desk-muted">{}</small>', label, obj.tool_call.tool_name)

    @admin.display(description="limits")
    def limit_totals(self, obj):
        """The windows of the agent's limits with this call in them, as counted when it was created."""
        totals = (obj.tool_call.guard or {}).get("totals") or []
        if not totals:
            return "No limit of the agent's counts this tool."
        return table(
            ["window", "per", "with this call", "limit"],
            [(t["window"], f"{t['per']} {t['value']}" if t["per"] not in ("customer", "agent") else t["per"],
              " · ".join(filter(None, [f"{t['total']} {t.get('currency') or ''}".strip() if t.get("max_amount") else "",
                                       f"{t['count']} calls" if t.get("max_count") else ""])),
              " · ".join(filter(None, [f"{t['max_amount']} {t.get('currency') or ''}".strip() if t.get("max_amount") else "",
                                       f"{t['max_count']} calls" if t.get("max_count") else ""])))
             for t in totals],
        )

    @admin.display(description="same business key")
    def same_key_calls(self, obj):
        """Every other call that asked for the same business fact, in any run (SPEC §18)."""
        if not obj.tool_call.business_key:
            return "This tool has no business key."
        others = approval_same_key_calls(approval=obj)
        if not others:
            return "No other call asked for it."
        return table(
            ["call", "run", "status", "created"],
            [(format_html('<a href="{}">{}</a>', reverse("admin:tools_app_toolcall_change", args=[c.pk]), str(c.pk)[:8]),
              format_html('<a href="{}">{}</a>', reverse("admin:runs_app_run_change", args=[c.run_id]), str(c.run_id)[:8]),
              c.status + (" (answered by an earlier call)" if c.reused_from_id else ""), age(c.created_at) + " ago")
             for c in others],
        )

    @admin.display(description="customer", ordering="run__session__owner__username")
    def customer(self, obj):
        return obj.run.session.owner.get_username()

    @admin.display(description="waiting", ordering="requested_at")
    def waiting(self, obj):
        return waited(obj.requested_at) if obj.status == ApprovalStatus.PENDING else age(obj.requested_at, obj.decided_at)

    @admin.display(description="expires", ordering="expires_at")
    def expiry(self, obj):
        return countdown(obj.expires_at) if obj.status == ApprovalStatus.PENDING else "—"

    # The request's page says its expiry once: the time left and when, or when it was due.
    @admin.display(description="expires")
    def expires(self, obj):
        return expiry_line(obj.expires_at, pending=obj.status == ApprovalStatus.PENDING)

    # Not `rule`: that is the Approval's own field (the agent rule's text), shown inside this.
    @admin.display(description="rule")
    def rule_applied(self, obj):
        return applicable_rule(obj)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj):
        text = obj.status if not obj.decided_by_id else f"{obj.status} by {obj.decided_by.get_username()}"
        if obj.required_approvals > 1 and obj.status == ApprovalStatus.PENDING:
            text += f" · {len(approval_approvers(approval=obj))} of {obj.required_approvals} approvals"
        return badge(text, f"approval-{obj.status}")

    @admin.display(description="assigned")
    def assigned(self, obj):
        # Overridden per request in get_list_display ("you"); this is the name, for anyone else.
        return obj.assigned_to.get_username() if obj.assigned_to_id else "—"

    @admin.display(description="escalation", ordering="escalated_at")
    def escalation(self, obj):
        """ "escalated to leads 12 minutes ago": past its agent's service level, a second group was told
        (docs/NOTIFICATIONS.md); nothing was decided by it."""
        if obj.escalated_at is None:
            return "—"
        return badge(f"escalated to {obj.escalated_to} {age(obj.escalated_at)} ago", "approval-escalated")

    @admin.display(description="tool", ordering="tool_call__tool_name")
    def tool(self, obj):
        return obj.tool_call.tool_name

    @admin.display(description="arguments")
    def arguments_summary(self, obj):
        return compact_arguments(obj.tool_call.arguments)

    @admin.display(description="arguments")
    def arguments_pretty(self, obj):
        proposed = obj.tool_call.proposed_arguments
        if proposed is None:
            return pretty_json(obj.tool_call.arguments)
        # Edited by an operator before approving (SPEC §18): what executes, and what the model asked.
        return format_html('{}<p class="desk-edited" id="asked-arguments">Edited by an operator; the model asked: {}</p>',
                           pretty_json(obj.tool_call.arguments), compact_arguments(proposed, limit=200))

    @admin.display(description="idempotency key")
    def idempotency_key(self, obj):
        return obj.tool_call.idempotency_key or "—"

    @admin.display(description="session of", ordering="run__session__owner__username")
    def requested_by(self, obj):
        return obj.run.session.owner.get_username()

    @admin.display(description="run")
    def run_link(self, obj):
        url = reverse("admin:runs_app_run_change", args=[obj.run_id])
        return format_html('<a href="{}">{}</a> ({}{})', url, obj.run_id, obj.run.status,
                           f" / {obj.run.wait_reason}" if obj.run.wait_reason else "")

    @admin.display(description="session")
    def session_link(self, obj):
        url = reverse("admin:sessions_app_session_change", args=[obj.run.session_id])
        return format_html('<a href="{}">{}</a> (owner {})', url, obj.run.session, obj.run.session.owner.get_username())

    @admin.display(description="results")
    def read_results(self, obj):
        calls = approval_read_results(approval=obj)
        if not calls:
            return "No read tool ran in this run."
        return table(
            ["tool", "arguments", "result"],
            [(call.tool_name, compact_arguments(call.arguments), pretty_json(call.result)) for call in calls],
        )

    @admin.display(description="messages")
    def conversation(self, obj):
        messages = approval_conversation(approval=obj)
        if not messages:
            return "—"
        return table(
            ["#", "role", "said", "when"],
            [(m.seq, m.role + (f" ({m.tool_name})" if m.tool_name else ""), _message_text(m), age(m.created_at) + " ago")
             for m in messages],
        )

    def get_list_display(self, request):
        # The decide column depends on who looks at the queue: the buttons, or why not.
        @admin.display(description="decide")
        def decide(obj):
            if obj.status != ApprovalStatus.PENDING:
                return format_html('<span class="desk-muted">{}</span>', "decided" if obj.decided_at else "—")
            refusal = access.why_not_a_decider(user=request.user, approval=obj)
            if refusal:
                short = FOUR_EYES_SHORT if refusal.startswith("Four eyes") else refusal
                return format_html('<span class="desk-barred" title="{}">{}</span>', refusal, short)
            return format_html(
                '<span class="desk-decide"><a class="button desk-approve" href="{}">Approve…</a> '
                '<a class="button desk-reject" href="{}">Reject…</a></span>',
                reverse("admin:approvals_app_approval_approve", args=[obj.pk]),
                reverse("admin:approvals_app_approval_reject", args=[obj.pk]),
            )

        @admin.display(description="assigned")  # not sortable: the queue's width; the views filter by it
        def assigned(obj):
            return assignment_of(obj, request.user)

        return (decide, *(assigned if name == "assigned" else name for name in self.list_display))


def _message_text(message) -> str:
    if message.tool_calls:
        asked = format_html_join(", ", "{}({})", ((c.get("name"), c.get("arguments")) for c in message.tool_calls))
        return format_html("{} <em>asks for</em> {}", message.content, asked)
    return message.content[:500] + ("…" if len(message.content) > 500 else "")


@admin.register(ApprovalDecision)
class ApprovalDecisionAdmin(PolicyScopedAdmin):
    """Each person's decision on an approval (a quorum's several), as the access policy lets one see them."""

    list_display = ("approval", "decision", "decided_by", "decided_at")
    list_select_related = ("approval", "decided_by")

    def visible(self, user):
        return ApprovalDecision.objects.filter(approval__in=access.visible_approvals(user=user))


# Where an audit entry's object is shown; object_type is the model name it was recorded with.
AUDIT_OBJECT_ADMIN = {
    "approval": "admin:approvals_app_approval_change",
    "agent": "admin:agents_agent_change",
    "toolcall": "admin:tools_app_toolcall_change",
    "run": "admin:runs_app_run_change",
}


@admin.register(AuditEntry)
class AuditEntryAdmin(CsvExportMixin, ReadOnlyAdmin):
    """Every human decision, immutable (the database refuses UPDATE and DELETE too)."""

    list_display = ("created_at", "actor", "action", "object_link", "change_summary", "short_note")
    list_select_related = ("actor", "run")
    list_filter = ("action", "object_type", ("actor", admin.RelatedOnlyFieldListFilter), "created_at")
    search_fields = ("=object_id", "=run__id", "actor__username", "note")
    search_help_text = "An object's or run's id, an operator's username, or words of the note."
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fieldsets = (
        (None, {"fields": ("created_at", "actor", "action", "object_link", "run", "note")}),
        ("State", {"fields": ("before_pretty", "after_pretty")}),
    )
    readonly_fields = ("object_link", "before_pretty", "after_pretty")

    @admin.display(description="object", ordering="object_type")
    def object_link(self, obj):
        label = f"{obj.object_type} {obj.object_id[:8]}"
        try:
            url = reverse(AUDIT_OBJECT_ADMIN[obj.object_type], args=[obj.object_id])
        except (KeyError, NoReverseMatch):
            return label
        return format_html('<a href="{}" title="{} {}">{}</a>', url, obj.object_type, obj.object_id, label)

    @admin.display(description="before → after")
    def change_summary(self, obj):
        return f"{compact_arguments(obj.before, 60)} → {compact_arguments(obj.after, 60)}"

    @admin.display(description="note")
    def short_note(self, obj):
        return obj.note if len(obj.note) <= 120 else obj.note[:119] + "…"

    @admin.display(description="before")
    def before_pretty(self, obj):
        return pretty_json(obj.before)

    @admin.display(description="after")
    def after_pretty(self, obj):
        return pretty_json(obj.after)



@admin.register(SavedView)
class SavedViewAdmin(PolicyScopedAdmin):
    """One's own saved views of the desk's lists (made and deleted on the queue); nobody sees another's."""

    list_display = ("name", "link", "created_at")
    list_display_links = None
    ordering = ("name",)

    def visible(self, user):
        return SavedView.objects.filter(owner_id=user.pk)

    @admin.display(description="list")
    def link(self, obj):
        return format_html('<a href="{}">{}</a>', obj.url, obj.url)
