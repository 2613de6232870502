"""The processes that report to PostgreSQL: their heartbeats and counters (docs/OPERATIONS.md)."""

from django.contrib import admin

from desk.base import ReadOnlyAdmin
from operations.models import ProcessHeartbeat


@admin.register(ProcessHeartbeat)
class ProcessHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ("identity", "role", "cluster", "host", "pid", "started_at", "beat_at")
    list_filter = ("role",)
    readonly_fields = ("identity", "role", "host", "pid", "cluster", "started_at", "beat_at", "counters", "gauges")
