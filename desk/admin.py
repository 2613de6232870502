"""The admin's autodiscovery imports this module: it registers every ModelAdmin of the desk, and
orders the desk's home — the operators' work first; the internals (how the machine runs, not what
an operator acts on) after it under "Administration", for superusers only."""

from django.contrib import admin

from desk import (  # noqa: F401
    agents, approvals, delegations, endpoints, freezes, ledger, mcp_servers, notifications, operations, runs, sessions,
    tool_calls,
)

# The operators' sections in the order of their work: what waits for a decision first.
OPERATORS_ORDER = ("approvals_app", "tools_app", "runs_app", "sessions_app", "agents", "notifications")
WHOLE_APP = "*"
# The internals: whole apps, or some models of an operators' app.
INTERNALS = {
    "auth": WHOLE_APP, "axes": WHOLE_APP, "django_q": WHOLE_APP, "operations": WHOLE_APP,
    "sessions_app": {"idempotencyrecord", "ratecounter"},
}
OPERATORS, ADMINISTRATION = "operators", "administration"

_django_app_list = admin.site.get_app_list


def _is_internal(app_label: str, model_name: str) -> bool:
    internal = INTERNALS.get(app_label, ())
    return internal == WHOLE_APP or model_name in internal


def desk_app_list(request, app_label=None) -> list[dict]:
    """The admin's app list, each app marked with its `desk_section`: the operators' apps (less
    their internal models) in OPERATORS_ORDER, then — for a superuser — the internals. One app's
    page (`app_label`) keeps its models together."""
    operators, internals = [], []
    for app in _django_app_list(request, app_label):
        inside = [m for m in app["models"] if _is_internal(app["app_label"], m["model"]._meta.model_name)]
        outside = [m for m in app["models"] if m not in inside]
        if app_label is not None:
            shown = app["models"] if request.user.is_superuser else outside
            if shown:
                operators.append({**app, "models": shown, "desk_section": ADMINISTRATION if not outside else OPERATORS})
            continue
        if outside:
            operators.append({**app, "models": outside, "desk_section": OPERATORS})
        if inside and request.user.is_superuser:
            internals.append({**app, "models": inside, "desk_section": ADMINISTRATION})
    rank = {label: position for position, label in enumerate(OPERATORS_ORDER)}
    operators.sort(key=lambda app: (rank.get(app["app_label"], len(rank)), app["name"].lower()))
    return operators + internals


admin.site.get_app_list = desk_app_list
