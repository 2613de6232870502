"""Tool calls, and the operators' unknown-calls queue (SPEC §6, §13).

The queue changes a call only through engine/actions/reconciliation.py: "query downstream now" is
`tool_call_reconcile_auto`, recording an outcome is `tool_call_resolve` (which audits it)."""

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.db.models import Q
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from desk.display import age, amount_of, badge, compact_arguments, pretty_json, waited
from desk.base import BusinessKeySearch, EstimatedCountPaginator, PolicyScopedAdmin
from desk.export import CsvExportMixin
from tools_app.selectors import SEARCH_LIMIT, run_ids_matching
from access import policy as access
from desk.tool_call_views import query_downstream, tool_call_query_view, tool_call_resolve_view
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect, UnknownToolCall
from tools_app.registry import tool_list
from tools_app.selectors import tool_calls_matching

SEARCH_HELP = "Order number or any tool argument, idempotency key, customer, session title, or an id."


class ToolNameFilter(admin.SimpleListFilter):
    """By tool: the registered tools (tools_app.registry), not a DISTINCT over every call."""

    title = "tool"
    parameter_name = "tool_name"

    def lookups(self, request, model_admin):
        return [(tool.name, tool.name) for tool in sorted(tool_list(), key=lambda tool: tool.name)]

    def queryset(self, request, queryset):
        return queryset.filter(tool_name=self.value()) if self.value() else queryset


class WriteToolNameFilter(ToolNameFilter):
    """Only writes can have an unknown outcome."""

    def lookups(self, request, model_admin):
        return [(tool.name, tool.name) for tool in sorted(tool_list(), key=lambda tool: tool.name) if tool.effect == ToolEffect.WRITE]


@admin.register(ToolCall)
class ToolCallAdmin(CsvExportMixin, BusinessKeySearch, PolicyScopedAdmin):
    list_display = ("short_id", "tool_name", "arguments_summary", "status_badge", "customer", "attempts", "created_at")
    list_display_links = ("short_id",)
    list_select_related = ("run__session__owner",)
    list_filter = ("status", "effect", ToolNameFilter)
    search_help_text = SEARCH_HELP
    show_full_result_count = False
    ordering = ("-created_at",)
    paginator = EstimatedCountPaginator
    fieldsets = (
        (None, {"fields": ("id", "run", "step", "index", "tool_call_id", "tool_name", "effect", "status", "attempts", "lease_token")}),
        ("Request", {"fields": ("arguments_pretty", "idempotency_key", "reused_from")}),
        ("Outcome", {"fields": ("result_pretty", "error_code", "error_detail", "created_at", "started_at", "finished_at")}),
        ("Reconciliation", {"fields": ("resolution", "resolved_by", "resolved_at", "evidence", "reconcile_attempts", "next_attempt_at")}),
    )
    readonly_fields = ("id", "arguments_pretty", "result_pretty", "created_at")

    def visible(self, user):
        return access.visible_tool_calls(user=user)

    def can_see(self, user, obj) -> bool:
        return access.can_see_tool_call(user=user, tool_call=obj)

    def search_business_keys(self, queryset, term):
        # The calls themselves (an argument, a key, an id), and every call of the runs a
        # customer, a session title or a run id leads to. Both are collected first (bounded
        # index look-ups): OR-ed as subqueries, PostgreSQL would test every call against both.
        calls = list(tool_calls_matching(term=term).values_list("pk", flat=True)[:SEARCH_LIMIT])
        return queryset.filter(Q(pk__in=calls) | Q(run_id__in=run_ids_matching(term=term)))

    @admin.display(description="id", ordering="id")
    def short_id(self, obj):
        return str(obj.pk)[:8]

    @admin.display(description="arguments")
    def arguments_summary(self, obj):
        return compact_arguments(obj.arguments, 60)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj):
        return badge(obj.status, f"call-{obj.status}")

    @admin.display(description="customer", ordering="run__session__owner__username")
    def customer(self, obj):
        return obj.run.session.owner.get_username()

    @admin.display(description="arguments")
    def arguments_pretty(self, obj):
        return pretty_json(obj.arguments)

    @admin.display(description="result")
    def result_pretty(self, obj):
        return pretty_json(obj.result)


@admin.register(UnknownToolCall)
class UnknownToolCallAdmin(ToolCallAdmin):
    """Writes whose outcome nobody knows yet, oldest first. The sweeper keeps asking the
    downstream system; what it cannot settle an operator settles here, with evidence."""

    list_display = ("amount", "request", "customer", "unknown_for", "lookups", "why_unknown", "run_state")
    list_display_links = ("request",)
    list_select_related = ("run__session__owner",)
    list_filter = (WriteToolNameFilter,)
    ordering = ("finished_at", "created_at")
    actions = ("query_downstream_now",)
    csv_exclude = ("record",)  # the button, not data

    def get_queryset(self, request):
        return super().get_queryset(request).filter(status=ToolCallStatus.UNKNOWN)

    def has_reconcile_permission(self, request) -> bool:
        return access.can_reconcile(user=request.user)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/resolve/", wrap(self.resolve_view), name="tools_app_unknowntoolcall_resolve"),
            path("<path:object_id>/query/", wrap(self.query_view), name="tools_app_unknowntoolcall_query"),
            *super().get_urls(),
        ]

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"title": "Unknown tool calls: outcome to be settled", **(extra_context or {})})

    def resolve_view(self, request, object_id):
        return tool_call_resolve_view(request, model_admin=self, object_id=object_id)

    def query_view(self, request, object_id):
        return tool_call_query_view(request, model_admin=self, object_id=object_id)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        call = self.get_object(request, unquote(object_id))
        refusal = access.why_not_a_reconciler(user=request.user, tool_call=call) if call is not None else ""
        extra_context = {
            **(extra_context or {}),
            "can_reconcile": call is not None and not refusal,
            # Shown in place of the buttons to an operator the policy bars (e.g. four eyes).
            "reconcile_refusal": refusal if self.has_reconcile_permission(request) else "",
        }
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.action(description="Query the downstream system now", permissions=["reconcile"])
    def query_downstream_now(self, request, queryset):
        for call in queryset:
            query_downstream(request, call)

    def get_list_display(self, request):
        if not self.has_reconcile_permission(request):
            return self.list_display

        @admin.display(description="settle")
        def record(obj):
            if refusal := access.why_cannot_reconcile(user=request.user, tool_call=obj):
                return format_html('<span class="desk-barred">{}</span>', refusal)
            return format_html('<a class="button desk-record" href="{}">Record outcome…</a>',
                               reverse("admin:tools_app_unknowntoolcall_resolve", args=[obj.pk]))

        return (record, *self.list_display)

    @admin.display(description="amount")
    def amount(self, obj):
        value = amount_of(obj.arguments)
        return format_html('<span class="desk-amount">{}</span>', value) if value is not None else "—"

    @admin.display(description="request", ordering="tool_name")
    def request(self, obj):
        order = (obj.arguments or {}).get("order_id")
        label = f"order {order}" if order else compact_arguments(obj.arguments, 30)
        return format_html('{}<br><small class="desk-muted">{}</small>', label, obj.tool_name)

    @admin.display(description="unknown for", ordering="finished_at")
    def unknown_for(self, obj):
        return waited(obj.finished_at or obj.created_at)

    @admin.display(description="lookups", ordering="reconcile_attempts")
    def lookups(self, obj):
        nxt = f"next in {age(timezone.now(), obj.next_attempt_at)}" if obj.next_attempt_at else "no more automatic lookups"
        return format_html("{} so far<br><small class=\"desk-muted\">{}</small>", obj.reconcile_attempts, nxt)

    @admin.display(description="why unknown")
    def why_unknown(self, obj):
        return obj.error_detail[:120] or obj.error_code

    @admin.display(description="run", ordering="run__status")
    def run_state(self, obj):
        url = reverse("admin:runs_app_run_change", args=[obj.run_id])
        state = obj.run.status + (f" / {obj.run.wait_reason}" if obj.run.wait_reason else "")
        return format_html('<a href="{}">{}</a>', url, state)
