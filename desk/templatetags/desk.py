"""Template tags of the operators' desk: the dashboard on the admin index — what waits for an
operator, the charts, the latest decisions and the panels installed apps add (desk/panels.py:
in demo mode, the demo controls)."""

from django import template
from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe

from approvals_app.selectors import audit_recent, desk_charts, freezes_in_force
from approvals_app.selectors import desk_overview as desk_overview_select
from desk.charts import Series, horizontal_bars, lines, stacked_bars
from desk.display import cost_of, waited
from desk.panels import desk_panels_for

register = template.Library()

OUTCOME_SERIES = [
    Series("applied", "applied", "applied"),
    Series("not_applied", "not applied", "not-applied"),
    Series("rejected", "rejected", "rejected"),
    Series("expired", "expired", "expired"),
    Series("none", "no write", "none"),
    Series("active", "still active", "active"),
]
PERCENTILES = [Series("p50", "p50", "p50"), Series("p95", "p95", "p95")]


def _is_desk_user(context) -> bool:
    request = context.get("request")
    return request is not None and request.user.is_active and request.user.is_staff


def seconds_text(value: float) -> str:
    if value < 1:
        return f"{value:.2f} s" if value else "0"
    if value < 60:
        return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"
    if value < 3600:
        return f"{value / 60:.0f} m" if value >= 600 else f"{value / 60:.1f} m"
    return f"{value / 3600:.1f} h"


@register.simple_tag(takes_context=True)
def desk_overview(context):
    """The overview for staff on the admin index; None for anyone else."""
    return desk_overview_select() if _is_desk_user(context) else None


@register.simple_tag(takes_context=True)
def desk_freezes(context):
    """The freezes in force, for staff on the admin index (SPEC §18: shown on the dashboard)."""
    return freezes_in_force() if _is_desk_user(context) else []


@register.simple_tag(takes_context=True)
def desk_dashboard(context):
    """The charts, as SVG drawn here; None for anyone but staff."""
    if not _is_desk_user(context):
        return None
    now = timezone.now()
    charts = desk_charts(now=now)
    hours = [timezone.localtime(hour).strftime("%H:00") for hour in charts.hours]
    days = [day.strftime("%d %b") for day in charts.days]
    currency = settings.WARDEN_COST_CURRENCY
    unknown = [
        (f"{call.tool_name} · {call.run.session.owner.get_username()}",
         (now - (call.finished_at or call.created_at)).total_seconds(),
         reverse("admin:tools_app_unknowntoolcall_change", args=[call.pk]))
        for call in charts.unknown_calls
    ]
    return [
        stacked_bars(chart_id="chart-runs-per-hour", title="Runs per hour, by outcome (last 24 h)", labels=hours,
                     values=charts.runs_per_hour, series=OUTCOME_SERIES),
        lines(chart_id="chart-run-duration", title="Run duration, p50 and p95, by hour started (last 24 h)", labels=hours,
              values=charts.duration_per_hour, series=PERCENTILES, fmt=seconds_text),
        lines(chart_id="chart-approval-wait", title="Approval wait, request to decision, p50 and p95 (last 14 days)",
              labels=days, values=charts.approval_wait_per_day, series=PERCENTILES, fmt=seconds_text),
        horizontal_bars(chart_id="chart-unknown-age", title="Unknown calls, how long each has waited (oldest first)",
                        items=unknown, css="unknown", empty="No tool call is waiting for reconciliation.", fmt=seconds_text),
        stacked_bars(chart_id="chart-tokens-per-day", title="Model tokens per day (last 14 days)", labels=days,
                     values=charts.tokens_per_day, series=[Series("tokens", "tokens", "tokens")]),
        stacked_bars(chart_id="chart-cost-per-day", title=f"Estimated model cost per day, {currency} (last 14 days)", labels=days,
                     values=[{"cost": cost_of(day["tokens"])} for day in charts.tokens_per_day],
                     series=[Series("cost", currency, "cost")], fmt=lambda value: f"{value:.2f}" if value >= 0.1 else f"{value:.4f}"),
    ]


@register.simple_tag(takes_context=True)
def desk_recent_decisions(context):
    return audit_recent(limit=10) if _is_desk_user(context) else []


@register.simple_tag(takes_context=True)
def desk_panels(context):
    """The panels installed apps add to the home page (desk/panels.py), rendered."""
    request = context.get("request")
    if request is None or not _is_desk_user(context):
        return ""
    return mark_safe("".join(render_to_string(template, panel, request=request)
                             for template, panel in desk_panels_for(request)))


@register.simple_tag
def desk_refresh_seconds():
    return settings.WARDEN_DESK_REFRESH_SECONDS


@register.filter
def desk_waited(since):
    """How long since `since`, ticking (desk.js), never "0 minutes"."""
    return waited(since)
