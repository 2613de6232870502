"""The one NinjaAPI of Warden, at /api/v1/ (docs at /api/v1/docs, schema at /api/v1/openapi.json).

Every answer that is not a success is JSON `{"code", "message", "fields"?}`: a refusal
(config.errors.WardenError), answered by the one handler of api/errors.py with its code's status.
A write PostgreSQL rolled back because of a concurrent one (a deadlock or a serialization failure),
or a request whose database connection was lost or refused (SQLSTATE classes 08 and 57), is a 503
with Retry-After: the client sends it again. Anything else is a bug, logged and answered with a
JSON 500.
"""

from functools import wraps

from django.http import HttpResponseNotAllowed, JsonResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI
from ninja.renderers import BaseRenderer
from pydantic_core import to_json

from api import agents, approvals, endpoints, events, freezes, ledger, me, runs, sessions, tool_calls
from api.base import API_AUTH
from api.errors import ApiRefusal, errors_handled
from api.idempotency import idempotent
from config.errors import CommonRefusal, WardenError
from config.throttling import API_THROTTLES

DESCRIPTION = """\
Start, watch, steer and query agent runs.

**Authentication.** Machine clients send `Authorization: Bearer <API key>` (keys are created in
the admin or with `manage.py create_api_key <username> <name>`; the secret is shown once).
Browsers use their Django session; unsafe methods then need the `X-CSRFToken` header.

**Scope.** You see your own sessions, runs, tool calls and approvals. Operators' extra powers
come from permissions: `runs_app.view_run` (read any run), `runs_app.change_run` (cancel any
run), `sessions_app.view_session` (read any session), `approvals_app.decide_approval` (see and
decide operator approvals), `tools_app.reconcile_toolcall` (see and resolve unknown tool calls),
`approvals_app.freeze_money` (freeze and unfreeze an agent's, a tool's or a customer's writes). Four
eyes: neither decision is yours to make in your own session. A message's `budgets` are capped by the
deployment (403 `budget_over_cap` names the cap) unless you have `runs_app.exceed_budget_caps`.
`runs_app.follow_all_events` opens `GET /events` and `/events/stream`: every run you may see, in
one stream. `runs_app.view_modelendpoint` reads the model endpoints and `runs_app.change_modelendpoint`
defines them (403 without); an endpoint's credential is write-only: no answer carries it.
`approvals_app.export_ledger` exports the tamper-evident ledger (`GET /ledger`, 403 without). Whatever
else you may not see answers 404.

**Events.** A run's events page and stream by their `seq`; a session's, and every run's, in commit
order by a cursor (`<digits>_<digits>`): send the last one back as `Last-Event-ID` or `?after=` and
nothing is missed or repeated. A session's stream stays open from one run to the next.

**Retries.** Send an `Idempotency-Key` header (1–255 characters, e.g. a UUID) with any POST: the
same key and body again return the first response (with `Idempotent-Replayed: true`) and do
nothing twice; the same key with a different body is a 409. Keys are kept for a day by default.

**Errors** are JSON `{"code": "...", "message": "...", "fields": [...]}`; `code` is stable. `503`
`{"code": "try_again"}` with `Retry-After`: the database rolled the request back or lost its
connection; nothing was saved, send it again.

**JSON you send** (agent definitions, a resolution's result, an edit's arguments) may be nested at
most 32 levels and be at most 256 KiB as JSON; anything stored deeper is shown cut off with a marker.

**Rate limits.** Requests are counted per API key, per user, and POSTs per user (the deployment's
settings `WARDEN_API_RATE_PER_KEY`, `WARDEN_API_RATE_PER_USER`, `WARDEN_API_WRITE_RATE_PER_USER`);
over a limit the answer is `429` `{"code": "throttled"}` with a `Retry-After` header in seconds.
"""


class JsonRenderer(BaseRenderer):
    """JSON through pydantic-core: datetimes (ISO 8601, UTC as Z), UUIDs and decimals are encoded
    natively instead of through a Python `default` hook per value — a third of the time of a
    page of 50 runs went there."""

    media_type = "application/json"

    def render(self, request, data, *, response_status):
        return to_json(data, fallback=str, inf_nan_mode="null")


class WardenAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation) -> str:
        # View names are unique and read well in generated clients: runs_list, approvals_decide…
        return operation.view_func.__name__

    def _get_urls(self):
        urls = super()._get_urls()
        for pattern in urls:
            pattern.callback = idempotent(_json_method_not_allowed(pattern.callback))
        # Unknown paths under /api/v1/ get the JSON 404 too, not Django's HTML page.
        return [*urls, re_path(r"^.*$", _unknown_path)]


def _json_method_not_allowed(view):
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):
            allowed = response["Allow"]
            refused = WardenError(ApiRefusal.METHOD_NOT_ALLOWED, f"{request.method} is not allowed here; use {allowed}.")
            response = JsonResponse(refused.body(), status=refused.status)
            response["Allow"] = allowed
        return response

    return wrapper


def _query_parameters_declared(run):
    """(Around an operation's run.) Note on the request which query parameters the operation
    declares, for `_known_query_parameters_only`, which runs after authentication."""
    operation = run.__self__
    known = frozenset(name for model in operation.models if model.__ninja_param_source__ == "query"
                      for name in model.__ninja_flatten_map__)

    @wraps(run)
    def noted(request, *args, **kwargs):
        request.warden_query_parameters = known
        return run(request, *args, **kwargs)

    return noted


def _known_query_parameters_only(view_func):
    """(Around an operation's view, after authentication and validation.) Refuse a query parameter
    the operation does not declare — 422 `unknown_query_parameter`, naming it — instead of
    ignoring it: a misspelt filter (`?stauts=failed`) would otherwise answer as if none had been
    asked for."""

    @wraps(view_func)
    def checked(request, *args, **kwargs):
        known = request.warden_query_parameters
        unknown = sorted(set(request.GET) - known)
        if unknown:
            raise WardenError(
                ApiRefusal.UNKNOWN_QUERY_PARAMETER,
                f"Unknown query parameter {', '.join(repr(name) for name in unknown)}; this endpoint takes "
                f"{', '.join(sorted(known)) or 'none'}.",
                fields=[{"field": f"query.{name}", "message": "not a parameter of this endpoint",
                         "type": ApiRefusal.UNKNOWN_QUERY_PARAMETER.value} for name in unknown],
            )
        return view_func(request, *args, **kwargs)

    return checked


@csrf_exempt
def _unknown_path(request, *args, **kwargs):
    refused = WardenError(CommonRefusal.NOT_FOUND, "No such API endpoint.")
    return JsonResponse(refused.body(), status=refused.status)


api = WardenAPI(
    title="Warden API",
    version="1",
    description=DESCRIPTION,
    urls_namespace="api-v1",
    auth=API_AUTH,
    throttle=API_THROTTLES,
    renderer=JsonRenderer(),
)
for router in (me.router, sessions.router, runs.router, events.router, agents.router, tool_calls.router, approvals.router,
               freezes.router, endpoints.router, ledger.router):
    router.add_decorator(_query_parameters_declared, mode="view")
    router.add_decorator(_known_query_parameters_only, mode="operation")
api.add_router("/me", me.router)
api.add_router("/sessions", sessions.router)
api.add_router("/runs", runs.router)
api.add_router("/events", events.router)
api.add_router("/agents", agents.router)
api.add_router("/tool-calls", tool_calls.router)
api.add_router("/approvals", approvals.router)
api.add_router("/freezes", freezes.router)
api.add_router("/model-endpoints", endpoints.router)
api.add_router("/ledger", ledger.router)


errors_handled(api)
