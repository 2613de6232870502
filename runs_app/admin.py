from django.contrib import admin

from approvals_app.models import Approval
from config.admin_base import ReadOnlyAdmin, ReadOnlyInline
from runs_app.models import ContextSummary, Run, RunEvent, Step
from tools_app.models import ToolCall


class StepInline(ReadOnlyInline):
    model = Step
    fields = ("index", "kind", "status", "finish_reason", "input_tokens", "output_tokens", "started_at", "finished_at", "discard_reason")
    readonly_fields = fields


class ToolCallInline(ReadOnlyInline):
    model = ToolCall
    fields = ("tool_name", "effect", "status", "attempts", "idempotency_key", "arguments", "result", "error_code")
    readonly_fields = fields


class ApprovalInline(ReadOnlyInline):
    model = Approval
    fk_name = "run"
    fields = ("tool_call", "policy", "status", "requested_at", "expires_at", "decided_by", "decided_at", "note")
    readonly_fields = fields


class RunEventInline(ReadOnlyInline):
    model = RunEvent
    fields = ("seq", "type", "payload", "created_at")
    readonly_fields = fields
    show_change_link = False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "session", "status", "phase", "wait_reason", "model_calls", "tokens_used", "created_at", "finished_at")
    list_select_related = ("session",)
    list_filter = ("status", "phase", "wait_reason", "provider")
    search_fields = ("=id", "=session__id")
    date_hierarchy = "created_at"
    inlines = [StepInline, ToolCallInline, ApprovalInline, RunEventInline]


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "index", "kind", "status", "started_at", "finished_at")
    list_select_related = ("run",)
    list_filter = ("kind", "status")
    search_fields = ("=run__id",)


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "seq", "type", "created_at")
    list_select_related = ("run",)
    list_filter = ("type",)
    search_fields = ("=run__id",)


@admin.register(ContextSummary)
class ContextSummaryAdmin(ReadOnlyAdmin):
    list_display = ("id", "session", "covers_through_seq", "created_at")
    list_select_related = ("session",)
