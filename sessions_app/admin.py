from django.contrib import admin

from config.admin_base import ReadOnlyAdmin, ReadOnlyInline
from sessions_app.models import Message, PendingInput, Session


class MessageInline(ReadOnlyInline):
    model = Message
    fields = ("seq", "role", "content", "tool_name", "tool_call_id", "run", "created_at")
    readonly_fields = fields
    ordering = ("seq",)


class PendingInputInline(ReadOnlyInline):
    model = PendingInput
    fields = ("id", "mode", "resolved_mode", "content", "received_at", "consumed_at", "disposition", "consumed_by")
    readonly_fields = fields


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    list_display = ("id", "title", "owner", "created_at", "updated_at")
    list_select_related = ("owner",)
    search_fields = ("=id", "title", "owner__username")
    date_hierarchy = "created_at"
    inlines = [MessageInline, PendingInputInline]


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ("id", "session", "seq", "role", "short_content", "run", "created_at")
    list_select_related = ("session", "run")
    list_filter = ("role",)
    search_fields = ("=session__id", "=run__id", "content")

    @admin.display(description="content")
    def short_content(self, obj):
        return (obj.content[:80] + "…") if len(obj.content) > 80 else obj.content


@admin.register(PendingInput)
class PendingInputAdmin(ReadOnlyAdmin):
    list_display = ("id", "session", "mode", "resolved_mode", "disposition", "received_at", "consumed_at")
    list_select_related = ("session",)
    list_filter = ("mode", "disposition")
    search_fields = ("=session__id",)
