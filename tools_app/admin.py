"""Tool calls, and the operators' unknown-calls queue (SPEC §6, §13).

The queue changes a call only through engine/actions/reconciliation.py: "query downstream now" is
`tool_call_reconcile_auto`, recording an outcome is `tool_call_resolve` (which audits it)."""

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.urls import path, reverse
from django.utils.html import format_html

from approvals_app.admin_display import age, compact_arguments, pretty_json
from config.admin_base import PolicyScopedAdmin
from sessions_app import access
from tools_app.admin_views import query_downstream, tool_call_query_view, tool_call_resolve_view
from tools_app.models import ToolCall, ToolCallStatus, UnknownToolCall


@admin.register(ToolCall)
class ToolCallAdmin(PolicyScopedAdmin):
    list_display = ("id", "run", "tool_name", "effect", "status", "attempts", "idempotency_key", "created_at")
    list_select_related = ("run",)
    list_filter = ("status", "effect", "tool_name")
    search_fields = ("=id", "=run__id", "idempotency_key", "tool_call_id")
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

    list_display = (
        "short_id", "tool_name", "arguments_summary", "unknown_for", "run_state", "idempotency_key",
        "reconcile_attempts", "next_attempt_at", "error_detail",
    )
    list_display_links = ("short_id",)
    list_select_related = ("run__session",)  # the four-eyes rule asks whose session each call is in
    list_filter = ("tool_name",)
    ordering = ("created_at",)
    actions = ("query_downstream_now",)

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

        @admin.display(description="outcome")
        def record(obj):
            if refusal := access.why_cannot_reconcile(user=request.user, tool_call=obj):
                return format_html('<span class="desk-barred">{}</span>', refusal)
            return format_html('<a class="button" href="{}">Record outcome…</a>',
                               reverse("admin:tools_app_unknowntoolcall_resolve", args=[obj.pk]))

        return (*self.list_display, record)

    @admin.display(description="id", ordering="id")
    def short_id(self, obj):
        return str(obj.pk)[:8]

    @admin.display(description="arguments")
    def arguments_summary(self, obj):
        return compact_arguments(obj.arguments)

    @admin.display(description="unknown for", ordering="finished_at")
    def unknown_for(self, obj):
        return age(obj.finished_at or obj.created_at)

    @admin.display(description="run", ordering="run__status")
    def run_state(self, obj):
        url = reverse("admin:runs_app_run_change", args=[obj.run_id])
        state = obj.run.status + (f" / {obj.run.wait_reason}" if obj.run.wait_reason else "")
        return format_html('<a href="{}">{}</a>', url, state)
