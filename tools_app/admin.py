from django.contrib import admin

from config.admin_base import ReadOnlyAdmin
from tools_app.models import ToolCall


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "tool_name", "effect", "status", "attempts", "idempotency_key", "created_at")
    list_select_related = ("run",)
    list_filter = ("status", "effect", "tool_name")
    search_fields = ("=id", "=run__id", "idempotency_key", "tool_call_id")
