from django.contrib import admin

from approvals_app.models import Approval, AuditEntry
from config.admin_base import ReadOnlyAdmin


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "tool_call", "policy", "status", "requested_at", "expires_at", "decided_by", "decided_at")
    list_select_related = ("run", "tool_call", "decided_by")
    list_filter = ("status", "policy")
    search_fields = ("=id", "=run__id")
    ordering = ("requested_at",)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "object_type", "object_id", "run")
    list_select_related = ("actor", "run")
    list_filter = ("action", "object_type")
    search_fields = ("=object_id", "=run__id", "actor__username")
