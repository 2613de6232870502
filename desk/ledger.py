"""The desk's view of the tamper-evident ledger (docs/LEDGER.md): read-only, like the database makes
it, for those the access policy lets export it. `manage.py verify_ledger` checks the chain."""

import json

from django.contrib import admin

from access import policy as access
from approvals_app.models import LedgerEntry
from desk.base import EstimatedCountPaginator, ReadOnlyAdmin
from desk.export import CsvExportMixin
from desk.display import pretty_json


@admin.register(LedgerEntry)
class LedgerEntryAdmin(CsvExportMixin, ReadOnlyAdmin):
    list_display = ("seq", "created_at", "kind", "actor", "subject", "short_hash")
    list_filter = ("kind", "created_at")
    search_fields = ("=subject", "=actor", "=hash")
    search_help_text = "A subject (approval:<id>, tool_call:<id>, freeze:<id>), an actor's username, or a hash."
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = ("seq", "created_at", "kind", "actor", "actor_id", "subject", "payload_pretty", "prev_hash", "hash")
    readonly_fields = ("payload_pretty",)

    def has_view_permission(self, request, obj=None):
        return access.can_export_ledger(user=request.user)

    def has_module_permission(self, request):
        return access.can_export_ledger(user=request.user)

    @admin.display(description="hash")
    def short_hash(self, obj):
        return f"{obj.hash[:16]}…"

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return pretty_json(json.loads(obj.payload))
