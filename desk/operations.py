"""The processes that report to PostgreSQL: their heartbeats and counters (docs/OPERATIONS.md)."""

from django.contrib import admin

from desk.base import ReadOnlyAdmin
from operations.models import OpenStream, ProcessHeartbeat


@admin.register(ProcessHeartbeat)
class ProcessHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ("identity", "role", "cluster", "host", "pid", "started_at", "beat_at")
    list_filter = ("role",)
    readonly_fields = ("identity", "role", "host", "pid", "cluster", "started_at", "beat_at", "counters", "gauges")


@admin.register(OpenStream)
class OpenStreamAdmin(ReadOnlyAdmin):
    """Live connections held open — SSE streams and console sockets — per user, against
    WARDEN_STREAMS_PER_USER (operations/streams.py)."""

    list_display = ("user_id", "kind", "opened_at", "expires_at")
    list_filter = ("kind",)
    search_fields = ("=user_id",)
    readonly_fields = ("id", "user_id", "kind", "opened_at", "expires_at")
