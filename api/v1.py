"""The one NinjaAPI of Warden, at /api/v1/ (docs at /api/v1/docs, schema at /api/v1/openapi.json).

Every answer that is not a success is JSON `{"code", "message", "fields"?}` with a 4xx status:
the handlers below translate validation errors, authentication failures and the services'
exceptions. A write PostgreSQL rolled back because of a concurrent one (a deadlock or a
serialization failure) is a 503 with Retry-After: the client sends it again. Anything else is a
bug, logged and answered with a JSON 500.
"""

import logging
import math
from functools import wraps

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig, SuspiciousOperation
from django.db import DataError, OperationalError
from django.http import Http404, HttpResponseNotAllowed, JsonResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError
from ninja.renderers import BaseRenderer
from pydantic_core import to_json

from api import agents, approvals, me, runs, sessions, tool_calls
from api.base import API_AUTH, ApiError
from api.idempotency import idempotent
from approvals_app.services import ApprovalAlreadyDecided, ApprovalError, ApprovalExpired, ApprovalNotPermitted
from config.pagination import InvalidCursor
from config.throttling import API_THROTTLES
from engine.actions.cancel import RunNotCancellable
from engine.actions.reconciliation import ReconcileError
from engine.actions.runs import RunNotRetryable
from runs_app.services import RunBudgetsOverCap
from runs_app.transitions import IllegalTransition, LeaseLost
from sessions_app.services import SessionError

logger = logging.getLogger("warden.api")

# Seconds a client is asked to wait before retrying a write PostgreSQL rolled back (Retry-After).
RETRY_AFTER_SECONDS = 1

DESCRIPTION = """\
Start, watch, steer and query agent runs.

**Authentication.** Machine clients send `Authorization: Bearer <API key>` (keys are created in
the admin or with `manage.py create_api_key <username> <name>`; the secret is shown once).
Browsers use their Django session; unsafe methods then need the `X-CSRFToken` header.

**Scope.** You see your own sessions, runs, tool calls and approvals. Operators' extra powers
come from permissions: `runs_app.view_run` (read any run), `runs_app.change_run` (cancel any
run), `sessions_app.view_session` (read any session), `approvals_app.decide_approval` (see and
decide operator approvals), `tools_app.reconcile_toolcall` (see and resolve unknown tool calls). Four
eyes: neither decision is yours to make in your own session. A message's `budgets` are capped by the
deployment (422 `budget_over_cap` names the cap) unless you have `runs_app.exceed_budget_caps`.
Whatever you may not see answers 404.

**Retries.** Send an `Idempotency-Key` header (1–255 characters, e.g. a UUID) with any POST: the
same key and body again return the first response (with `Idempotent-Replayed: true`) and do
nothing twice; the same key with a different body is a 409. Keys are kept for a day by default.

**Errors** are JSON `{"code": "...", "message": "...", "fields": [...]}`; `code` is stable.

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
            response = JsonResponse(
                {"code": "method_not_allowed", "message": f"{request.method} is not allowed here; use {allowed}."},
                status=405,
            )
            response["Allow"] = allowed
        return response

    return wrapper


@csrf_exempt
def _unknown_path(request, *args, **kwargs):
    return JsonResponse({"code": "not_found", "message": "No such API endpoint."}, status=404)


api = WardenAPI(
    title="Warden API",
    version="1",
    description=DESCRIPTION,
    urls_namespace="api-v1",
    auth=API_AUTH,
    throttle=API_THROTTLES,
    renderer=JsonRenderer(),
)
api.add_router("/me", me.router)
api.add_router("/sessions", sessions.router)
api.add_router("/runs", runs.router)
api.add_router("/agents", agents.router)
api.add_router("/tool-calls", tool_calls.router)
api.add_router("/approvals", approvals.router)


def _error(request, status: int, code: str, message: str, fields: list | None = None):
    body = {"code": code, "message": message}
    if fields is not None:
        body["fields"] = fields
    return api.create_response(request, body, status=status)


@api.exception_handler(ApiError)
def _api_error(request, exc: ApiError):
    return _error(request, exc.status, exc.code, exc.message, exc.fields)


@api.exception_handler(InvalidCursor)
def _invalid_cursor(request, exc: InvalidCursor):
    return _error(request, 422, "invalid_cursor", str(exc),
                  [{"field": "query.cursor", "message": "invalid cursor", "type": "invalid_cursor"}])


def _field_name(error: dict) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    # ninja nests the body under the parameter name: body.payload.content → body.content, and
    # body.payload (the body itself) → body. Every operation has at most one body parameter.
    if len(loc) >= 2 and loc[0] == "body":
        loc = [loc[0], *loc[2:]]
    return ".".join(loc)


def _field_message(error: dict) -> str:
    if error.get("type") == "model_type":  # a body, or an object inside one, that is not an object
        return "must be a JSON object"
    return str(error.get("msg", "invalid"))


@api.exception_handler(ValidationError)
def _validation_error(request, exc: ValidationError):
    fields = [
        {"field": _field_name(error), "message": _field_message(error), "type": str(error.get("type", "invalid"))}
        for error in exc.errors
    ]
    summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields[:5])
    return _error(request, 422, "validation_error", f"Invalid input — {summary}", fields)


@api.exception_handler(AuthenticationError)
def _not_authenticated(request, exc):
    return _error(request, 401, "not_authenticated",
                  "Authentication required: send 'Authorization: Bearer <API key>' or log in.")


_HTTP_ERROR_CODES = {400: "bad_request", 401: "not_authenticated", 403: "forbidden", 404: "not_found",
                     405: "method_not_allowed", 409: "conflict", 429: "throttled"}


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    code = _HTTP_ERROR_CODES.get(exc.status_code, "error")
    if exc.status_code == 400 and "parse" in str(exc).lower():
        code = "malformed_body"
    return _error(request, exc.status_code, code, str(exc))


@api.exception_handler(Throttled)
def _throttled(request, exc: Throttled):
    retry_after = max(1, math.ceil(exc.wait or 1))
    response = _error(request, 429, "throttled",
                      f"Too many requests: this API key or user is over its rate limit; retry in {retry_after} s.")
    response["Retry-After"] = str(retry_after)
    return response


@api.exception_handler(Http404)
def _http404(request, exc):
    return _error(request, 404, "not_found", "Not found.")


@api.exception_handler(ObjectDoesNotExist)
def _does_not_exist(request, exc):
    return _error(request, 404, "not_found", "Not found.")


@api.exception_handler(SessionError)
def _session_error(request, exc: SessionError):
    return _error(request, 422, exc.code, exc.message)


@api.exception_handler(RunBudgetsOverCap)
def _budgets_over_cap(request, exc: RunBudgetsOverCap):
    fields = [
        {"field": f"body.budgets.{over.field}", "type": "budget_over_cap",
         "message": f"at most {over.cap} (the cap {over.setting}) without the runs_app.exceed_budget_caps permission"}
        for over in exc.over
    ]
    return _error(request, 422, exc.code, exc.message, fields)


@api.exception_handler(RunNotCancellable)
def _run_not_cancellable(request, exc: RunNotCancellable):
    return _error(request, 409, exc.code, exc.message)


@api.exception_handler(RunNotRetryable)
def _run_not_retryable(request, exc: RunNotRetryable):
    return _error(request, 409, exc.code, exc.message)


@api.exception_handler(ApprovalError)
def _approval_error(request, exc: ApprovalError):
    status = {ApprovalAlreadyDecided: 409, ApprovalExpired: 409, ApprovalNotPermitted: 403}.get(type(exc), 422)
    return _error(request, status, exc.code, exc.message)


_RECONCILE_STATUS = {"not_permitted": 403, "evidence_required": 422, "not_unknown": 409}


@api.exception_handler(ReconcileError)
def _reconcile_error(request, exc: ReconcileError):
    return _error(request, _RECONCILE_STATUS.get(exc.code, 422), exc.code, exc.message)


@api.exception_handler(IllegalTransition)
def _illegal_transition(request, exc):
    return _error(request, 409, "conflict", f"The object changed state meanwhile: {exc}")


@api.exception_handler(LeaseLost)
def _lease_lost(request, exc):
    return _error(request, 409, "conflict", "The run changed meanwhile; read it again and retry.")


@api.exception_handler(DataError)
def _data_error(request, exc):
    # Input the schema let through but PostgreSQL refused (a value out of a column's range).
    logger.warning("database refused API input on %s %s: %s", request.method, request.path, exc)
    return _error(request, 422, "invalid_value", "A value is out of the range this API can store.")


@api.exception_handler(OperationalError)
def _operational_error(request, exc: OperationalError):
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
    if not sqlstate.startswith("40"):  # class 40, transaction rollback: serialization_failure, deadlock_detected…
        return _unexpected(request, exc)
    # The transaction was rolled back whole; the same request again is safe and usually succeeds.
    logger.warning("database rolled back %s %s (SQLSTATE %s): answered 503", request.method, request.path, sqlstate)
    response = _error(request, 503, "try_again",
                      "A concurrent change made the database roll this one back; retry it shortly.")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


@api.exception_handler(RequestDataTooBig)
def _too_big(request, exc):
    return _error(request, 413, "too_large", f"The request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.")


@api.exception_handler(SuspiciousOperation)
def _suspicious(request, exc):
    logger.warning("suspicious API request %s %s: %s", request.method, request.path, exc)
    return _error(request, 400, "bad_request", "The request was malformed.")


@api.exception_handler(Exception)
def _unexpected(request, exc):
    logger.exception("unhandled error on %s %s", request.method, request.path)
    return _error(request, 500, "internal_error", "Internal error; it has been logged.")
