"""Runs with their steps, tool calls, approvals and events; cancelling runs (SPEC §9, §13).

A run's page opens with what an operator asks first — status and outcome, how long it took, its
tokens and cost, the writes that took effect — then the same timeline as the console, then its
parts, with the event log in pages. Cancel is `run_cancel_request` (engine/actions/cancel.py),
the same action the API and the console use; who may is the access policy's answer."""


from django.contrib import admin
from django.core.paginator import Paginator
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html

from desk.display import badge, compact_arguments, cost_text, duration_of, pretty_json, table
from approvals_app.models import Approval
from desk.base import BusinessKeySearch, EstimatedCountPaginator, PolicyScopedAdmin, ReadOnlyInline
from desk.export import CsvExportMixin
from desk.run_views import run_cancel_view, runs_cancel_action, runs_retry_action
from runs_app.events import RunEventType
from runs_app.models import NOT_TAKEN_EFFECT, ContextSummary, Run, RunEvent, RunOutcome, Step
from tools_app.selectors import run_ids_matching
from access import policy as access
from runs_app.timeline import run_timeline
from tools_app.models import ToolCall
from tools_app.selectors import applied_effects

EVENTS_PER_PAGE = 50
OUTCOME_SHORT = {RunOutcome.APPLIED: "applied", RunOutcome.NOT_APPLIED: "not applied", RunOutcome.REJECTED: "rejected",
                 RunOutcome.EXPIRED: "expired", RunOutcome.NONE: "no write"}
# The outcome filter's extra choice: the runs whose write did not happen.
DID_NOT_HAPPEN = "did_not_happen"


class StepInline(ReadOnlyInline):
    model = Step
    fields = ("index", "kind", "status", "finish_reason", "input_tokens", "output_tokens", "endpoint", "model", "cost",
              "duration", "discard_reason", "context_manifest")
    readonly_fields = fields
    classes = ("collapse",)

    @admin.display(description="created", ordering="created_at")
    def created(self, obj):
        moment = timezone.localtime(obj.created_at)
        return format_html('<time datetime="{}" title="{}">{}</time>', moment.isoformat(), moment.strftime("%Y-%m-%d %H:%M:%S %Z"),
                           moment.strftime("%d %b %H:%M:%S"))

    @admin.display(description="took")
    def duration(self, obj):
        return duration_of(obj.started_at, obj.finished_at)


class ToolCallInline(ReadOnlyInline):
    model = ToolCall
    fields = ("tool_name", "effect", "status", "attempts", "arguments_summary", "result_summary", "error_code", "idempotency_key")
    readonly_fields = fields

    @admin.display(description="arguments")
    def arguments_summary(self, obj):
        return compact_arguments(obj.arguments, 60)

    @admin.display(description="result")
    def result_summary(self, obj):
        return compact_arguments(obj.result, 60) if isinstance(obj.result, dict) else (obj.result or "—")


class ApprovalInline(ReadOnlyInline):
    model = Approval
    fk_name = "run"
    fields = ("tool_call", "policy", "status", "requested_at", "expires_at", "decided_by", "decided_at", "note", "customer_message")
    readonly_fields = fields


class EventTypeFilter(admin.SimpleListFilter):
    """By type: the contract's types (runs_app.events), not a DISTINCT over every event."""

    title = "type"
    parameter_name = "type"

    def lookups(self, request, model_admin):
        return RunEventType.choices

    def queryset(self, request, queryset):
        return queryset.filter(type=self.value()) if self.value() else queryset


class OutcomeFilter(admin.SimpleListFilter):
    """By outcome — and "did not happen", every run whose write was not applied, rejected or expired."""

    title = "outcome"
    parameter_name = "outcome"

    def lookups(self, request, model_admin):
        return [(DID_NOT_HAPPEN, "Write did not happen (any of the three below)"),
                *((value, label) for value, label in RunOutcome.choices)]

    def queryset(self, request, queryset):
        if self.value() == DID_NOT_HAPPEN:
            return queryset.filter(outcome__in=NOT_TAKEN_EFFECT)
        if self.value() in RunOutcome.values:
            return queryset.filter(outcome=self.value())
        return queryset


@admin.register(Run)
class RunAdmin(CsvExportMixin, BusinessKeySearch, PolicyScopedAdmin):
    list_display = ("short_id", "customer", "session_title", "state", "outcome_badge", "duration", "tokens_used", "cost",
                    "created")
    list_display_links = ("short_id",)
    list_select_related = ("session__owner",)
    list_filter = ("status", OutcomeFilter, "wait_reason", "phase")
    search_help_text = "Order number or any tool argument, customer, session title, idempotency key, or an id."
    actions = ("request_cancel", "retry")
    list_per_page = 50
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    inlines = [ToolCallInline, ApprovalInline, StepInline]
    fieldsets = (
        (None, {"fields": ("id", "session", "created_by", "status", "outcome", "phase", "wait_reason", "provider")}),
        ("Agent version (what the run was started with, and keeps)", {"fields": ("agent_version_display",)}),
        ("Wait context", {"classes": ("collapse",), "fields": ("wait_type", "request_id", "expires_at", "resume_target")}),
        ("Cancellation", {"classes": ("collapse",), "fields": ("cancel_requested_at", "cancel_requested_by", "cancel_reason")}),
        ("Error", {"classes": ("collapse",), "fields": ("error_code", "error_detail")}),
        ("Budgets and usage", {"classes": ("collapse",), "fields": (
            "model_calls", "max_model_calls", "tokens_used", "max_tokens", "deadline", "budgets_origin", "model_retries",
            "provider_options",
        )}),
        ("Lease and checkpoint", {"classes": ("collapse",), "fields": (
            "lease_owner", "lease_token", "lease_expires_at", "snapshot_version", "event_seq", "step_count",
        )}),
        ("Times", {"classes": ("collapse",), "fields": ("created_at", "started_at", "finished_at", "updated_at")}),
    )
    readonly_fields = ("id", "applied_effects_display", "budgets_origin", "agent_version_display", "created_at", "updated_at")

    def visible(self, user):
        return access.visible_runs(user=user)

    @admin.display(description="agent version")
    def agent_version_display(self, obj):
        version = obj.agent_version
        if version is None:
            return "— (no agent: every registered tool, each with its own approval policy)"
        return format_html(
            "{} v{} · {} {}<br>tools: {}<br>instructions:<pre class=\"desk-json\">{}</pre>rules: {}",
            version.name, version.number, version.provider, version.model, ", ".join(version.tools) or "—",
            version.instructions, pretty_json(version.approval_rules),
        )

    def can_see(self, user, obj) -> bool:
        return access.can_see_run(user=user, run=obj)

    def search_business_keys(self, queryset, term):
        return queryset.filter(pk__in=run_ids_matching(term=term))

    def has_cancel_permission(self, request) -> bool:
        # The bulk action; a run's own page asks can_cancel_run (its owner may cancel it too).
        return access.cancels_any_run(request.user)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name="runs_app_run_cancel"),
            *super().get_urls(),
        ]

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"title": "Runs", **(extra_context or {})})

    def cancel_view(self, request, object_id):
        return run_cancel_view(request, model_admin=self, object_id=object_id)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        run = self.get_object(request, object_id)
        extra = {"can_cancel": run is not None and access.can_cancel_run(user=request.user, run=run)}
        if run is not None:
            extra |= self._overview(request, run)
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), **extra})

    def _overview(self, request, run: Run) -> dict:
        """The top of a run's page: the summary, the console's timeline and a page of events."""
        now = timezone.now()
        marks = list(RunEvent.objects.filter(run_id=run.pk, type="run_status").order_by("seq").values("seq", "type", "payload", "created_at"))
        steps = list(Step.objects.filter(run_id=run.pk).order_by("index"))
        calls = list(ToolCall.objects.filter(run_id=run.pk).order_by("step__index", "index"))
        events = Paginator(RunEvent.objects.filter(run_id=run.pk).order_by("seq"), EVENTS_PER_PAGE)
        page = events.get_page(request.GET.get("events"))
        return {
            "summary": {
                "status": run.status + (f" / {run.phase or run.wait_reason}" if run.phase or run.wait_reason else ""),
                "outcome": run.get_outcome_display() if run.outcome else "— (still active)",
                "outcome_css": run.outcome or "active",
                "duration": duration_of(run.created_at, run.finished_at, now),
                "model_calls": f"{run.model_calls} of {run.max_model_calls}",
                "tokens": f"{run.tokens_used:,} of {run.max_tokens:,}",
                "cost": cost_text(run.tokens_used),
                "customer": run.session.owner.get_username(),
                "error": f"{run.error_code}: {run.error_detail}" if run.error_code else "",
            },
            "effects": applied_effects(run_id=run.pk),
            "timeline": run_timeline(run=run, events=marks, steps=steps, calls=calls, now=now),
            "events_page": page,
            "events_rows": [(e.seq, e.type, compact_arguments(e.payload, 140), e.created_at) for e in page.object_list],
        }

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

    # --- columns ------------------------------------------------------------------------------

    @admin.display(description="run", ordering="created_at")
    def short_id(self, obj):
        return str(obj.pk)[:8]

    @admin.display(description="customer", ordering="session__owner__username")
    def customer(self, obj):
        return obj.session.owner.get_username()

    @admin.display(description="session")
    def session_title(self, obj):
        title = obj.session.title or "Untitled"
        return title if len(title) <= 40 else title[:39] + "…"

    @admin.display(description="status", ordering="status")
    def state(self, obj):
        detail = (obj.phase or obj.wait_reason).replace("_", " ")
        return format_html("{}{}", badge(obj.status, f"run-{obj.status}"),
                           format_html('<br><small class="desk-muted">{}</small>', detail) if detail else "")

    @admin.display(description="outcome", ordering="outcome")
    def outcome_badge(self, obj):
        return badge(OUTCOME_SHORT.get(obj.outcome, obj.outcome), f"outcome-{obj.outcome}") if obj.outcome else "—"

    @admin.display(description="created", ordering="created_at")
    def created(self, obj):
        moment = timezone.localtime(obj.created_at)
        return format_html('<time datetime="{}" title="{}">{}</time>', moment.isoformat(), moment.strftime("%Y-%m-%d %H:%M:%S %Z"),
                           moment.strftime("%d %b %H:%M:%S"))

    @admin.display(description="took")
    def duration(self, obj):
        return duration_of(obj.created_at, obj.finished_at)

    @admin.display(description="cost", ordering="tokens_used")
    def cost(self, obj):
        return cost_text(obj.tokens_used)

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
        return access.visible_run_parts(user=user, parts=self.model.objects.all())


@admin.register(Step)
class StepAdmin(_PartOfRunAdmin):
    list_display = ("id", "run", "index", "kind", "status", "started_at", "finished_at")
    list_select_related = ("run",)
    list_filter = ("kind", "status")
    search_fields = ("=run__id",)
    show_full_result_count = False
    ordering = ("-id",)  # newest first, by the primary key (the model's order joins every run)
    paginator = EstimatedCountPaginator


@admin.register(RunEvent)
class RunEventAdmin(_PartOfRunAdmin):
    list_display = ("id", "run", "seq", "type", "created_at")
    list_select_related = ("run",)
    list_filter = (EventTypeFilter,)
    search_fields = ("=run__id",)
    show_full_result_count = False
    ordering = ("-id",)
    paginator = EstimatedCountPaginator


@admin.register(ContextSummary)
class ContextSummaryAdmin(PolicyScopedAdmin):
    list_display = ("id", "session", "covers_through_seq", "created_at")
    list_select_related = ("session",)
    ordering = ("-id",)

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
