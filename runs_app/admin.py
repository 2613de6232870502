"""Runs with their steps, tool calls, approvals and events; cancelling runs (SPEC §9, §13).

Cancel is `run_cancel_request` (engine/actions/cancel.py), the same action the API and the
console use; who may is the access policy's answer (sessions_app.access)."""

from django import forms
from django.contrib import admin, messages
from django.urls import path
from django.utils import timezone

from approvals_app.admin_display import compact_arguments, pretty_json, table
from approvals_app.models import Approval
from config.admin_base import PolicyScopedAdmin, ReadOnlyAdmin, ReadOnlyInline
from runs_app.admin_views import run_cancel_view, runs_cancel_action, runs_retry_action
from runs_app.models import (
    ContextSummary,
    DeliveryStatus,
    NotificationKind,
    ProcessHeartbeat,
    Run,
    RunEvent,
    Step,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from sessions_app import access
from tools_app.models import ToolCall
from tools_app.selectors import applied_effects


class StepInline(ReadOnlyInline):
    model = Step
    fields = ("index", "kind", "status", "finish_reason", "input_tokens", "output_tokens", "started_at", "finished_at",
              "discard_reason", "context_manifest")
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
class RunAdmin(PolicyScopedAdmin):
    list_display = ("id", "session", "status", "phase", "wait_reason", "model_calls", "tokens_used", "created_at", "finished_at")
    list_select_related = ("session",)
    list_filter = ("status", "phase", "wait_reason", "provider")
    search_fields = ("=id", "=session__id")
    date_hierarchy = "created_at"
    actions = ("request_cancel", "retry")
    inlines = [StepInline, ToolCallInline, ApprovalInline, RunEventInline]
    fieldsets = (
        (None, {"fields": ("id", "session", "created_by", "status", "phase", "wait_reason", "provider")}),
        ("Applied side effects", {"fields": ("applied_effects_display",)}),
        ("Wait context", {"fields": ("wait_type", "request_id", "expires_at", "resume_target")}),
        ("Cancellation", {"fields": ("cancel_requested_at", "cancel_requested_by", "cancel_reason")}),
        ("Error", {"fields": ("error_code", "error_detail")}),
        ("Budgets and usage", {"fields": (
            "model_calls", "max_model_calls", "tokens_used", "max_tokens", "deadline", "budgets_origin", "model_retries",
            "provider_options",
        )}),
        ("Lease and checkpoint", {"fields": (
            "lease_owner", "lease_token", "lease_expires_at", "snapshot_version", "event_seq", "step_count",
        )}),
        ("Times", {"fields": ("created_at", "started_at", "finished_at", "updated_at")}),
    )
    readonly_fields = ("id", "applied_effects_display", "budgets_origin", "created_at", "updated_at")

    def visible(self, user):
        return access.visible_runs(user=user)

    def can_see(self, user, obj) -> bool:
        return access.can_see_run(user=user, run=obj)

    def has_cancel_permission(self, request) -> bool:
        # The bulk action; a run's own page asks can_cancel_run (its owner may cancel it too).
        return access.cancels_any_run(request.user)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name="runs_app_run_cancel"),
            *super().get_urls(),
        ]

    def cancel_view(self, request, object_id):
        return run_cancel_view(request, model_admin=self, object_id=object_id)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        run = self.get_object(request, object_id)
        can_cancel = run is not None and access.can_cancel_run(user=request.user, run=run)
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), "can_cancel": can_cancel})

    @admin.action(description="Cancel selected runs…", permissions=["cancel"])
    def request_cancel(self, request, queryset):
        return runs_cancel_action(self, request, queryset)

    @admin.action(description="Retry selected failed or cancelled runs", permissions=["cancel"])
    def retry(self, request, queryset):
        return runs_retry_action(self, request, queryset)

    @admin.display(description="budgets set by")
    def budgets_origin(self, obj):
        if obj.budgets_set_by_id is None:
            return "the deployment's defaults"
        return f"{obj.budgets_set_by.get_username()}, in their request"

    @admin.display(description="applied effects")
    def applied_effects_display(self, obj):
        effects = applied_effects(run_id=obj.pk)
        if not effects:
            return "None: no write of this run took effect."
        return table(
            ["tool", "arguments", "result", "idempotency key", "finished"],
            [(e["tool"], compact_arguments(e["arguments"]), pretty_json(e["result"]), e["idempotency_key"], e["finished_at"])
             for e in effects],
        )


class _PartOfRunAdmin(PolicyScopedAdmin):
    """Steps and events are seen with their run."""

    def visible(self, user):
        runs = access.visible_runs(user=user)
        if not runs.query.has_filters():
            return self.model.objects.all()
        return self.model.objects.filter(run__in=runs)


@admin.register(Step)
class StepAdmin(_PartOfRunAdmin):
    list_display = ("id", "run", "index", "kind", "status", "started_at", "finished_at")
    list_select_related = ("run",)
    list_filter = ("kind", "status")
    search_fields = ("=run__id",)


@admin.register(RunEvent)
class RunEventAdmin(_PartOfRunAdmin):
    list_display = ("id", "run", "seq", "type", "created_at")
    list_select_related = ("run",)
    list_filter = ("type",)
    search_fields = ("=run__id",)


@admin.register(ContextSummary)
class ContextSummaryAdmin(PolicyScopedAdmin):
    list_display = ("id", "session", "covers_through_seq", "created_at")
    list_select_related = ("session",)

    def visible(self, user):
        sessions = access.visible_sessions(user=user)
        if not sessions.query.has_filters():
            return ContextSummary.objects.all()
        return ContextSummary.objects.filter(session__in=sessions)


# ---------------------------------------------------------------------------
# Operating it: webhook endpoints, their deliveries with attempts, process heartbeats
# (docs/OPERATIONS.md). Endpoints are configuration, changed with Django's own permissions;
# deliveries and heartbeats are records, read-only.
# ---------------------------------------------------------------------------
class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https", help_text="Where deliveries are POSTed.")
    kinds = forms.MultipleChoiceField(choices=NotificationKind.choices, widget=forms.CheckboxSelectMultiple, required=False,
                                      help_text="What this receiver is told about.")

    class Meta:
        model = WebhookEndpoint
        fields = ("name", "url", "kinds", "active", "secret")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ("name", "url", "kinds_display", "active", "created_at")
    list_filter = ("active",)
    readonly_fields = ("created_at", "updated_at")

    @admin.display(description="kinds")
    def kinds_display(self, obj):
        return ", ".join(obj.kinds) or "—"


class WebhookAttemptInline(ReadOnlyInline):
    model = WebhookAttempt
    fields = ("number", "deliverer", "started_at", "finished_at", "status_code", "error", "response_excerpt")
    readonly_fields = fields
    show_change_link = False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "endpoint", "status", "attempts", "last_status_code", "next_attempt_at", "created_at", "delivered_at")
    list_select_related = ("endpoint",)
    list_filter = ("status", "kind", "endpoint")
    search_fields = ("=id", "=run__id")
    readonly_fields = ("id", "endpoint", "kind", "run", "event_seq", "body_display", "status", "attempts", "next_attempt_at",
                       "claimed_by", "claimed_until", "last_status_code", "last_error", "created_at", "delivered_at")
    fields = readonly_fields
    inlines = [WebhookAttemptInline]
    actions = ("retry_now",)

    @admin.display(description="body")
    def body_display(self, obj):
        return pretty_json(obj.body)

    @admin.action(description="Attempt the selected deliveries again now", permissions=["view"])
    def retry_now(self, request, queryset):
        if not request.user.has_perm("runs_app.change_webhookdelivery"):
            messages.error(request, "You may not retry deliveries (runs_app.change_webhookdelivery).")
            return
        count = queryset.exclude(status=DeliveryStatus.DELIVERED).update(
            status=DeliveryStatus.PENDING, next_attempt_at=timezone.now())
        messages.success(request, f"{count} deliver{'y' if count == 1 else 'ies'} will be attempted again at once.")


@admin.register(WebhookAttempt)
class WebhookAttemptAdmin(ReadOnlyAdmin):
    list_display = ("delivery", "number", "deliverer", "started_at", "finished_at", "status_code", "error")
    list_select_related = ("delivery", "delivery__endpoint")
    search_fields = ("=delivery__id",)


@admin.register(ProcessHeartbeat)
class ProcessHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ("identity", "role", "cluster", "host", "pid", "started_at", "beat_at")
    list_filter = ("role",)
    readonly_fields = ("identity", "role", "host", "pid", "cluster", "started_at", "beat_at", "counters", "gauges")
