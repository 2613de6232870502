"""The API's errors: one handler answers every refusal (config.errors.WardenError) with its code's
HTTP status and the body `{"code", "message", "fields"?}`. What the framework and the database
raise — a body that does not validate, a missing identity, a rate limit, a rollback — is turned
into a refusal first and answered by the same handler. Anything else is a bug: logged, answered
with a JSON 500."""

import logging
import math

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig, SuspiciousOperation
from django.db import DataError, InterfaceError, OperationalError
from psycopg_pool import PoolTimeout
from django.http import Http404
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError

from config.errors import CommonRefusal, Refusal, WardenError
from config.request_ids import request_id_of

logger = logging.getLogger("warden.api")

# Seconds a client is asked to wait before retrying a write PostgreSQL rolled back (Retry-After).
RETRY_AFTER_SECONDS = 1


class ApiRefusal(Refusal):
    """What only the HTTP API refuses (the apps' own refusals: their errors.py)."""

    MALFORMED_BODY = "malformed_body", 400
    UNKNOWN_QUERY_PARAMETER = "unknown_query_parameter", 422
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key", 400
    INVALID_API_KEY = "invalid_api_key", 401
    API_KEY_REVOKED = "api_key_revoked", 401
    CSRF_FAILED = "csrf_failed", 403
    METHOD_NOT_ALLOWED = "method_not_allowed", 405
    IDEMPOTENCY_KEY_IN_USE = "idempotency_key_in_use", 409
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused", 409
    TOO_LARGE = "too_large", 413
    VALIDATION_ERROR = "validation_error", 422
    INVALID_VALUE = "invalid_value", 422


def not_found(what: str) -> WardenError:
    # The same answer whether the object does not exist or the caller may not see it.
    return WardenError(CommonRefusal.NOT_FOUND, f"No such {what}.")


def warden_error(api: NinjaAPI, request, error: WardenError):
    """The one answer to a refusal."""
    response = api.create_response(request, error.body(), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    return response


# --- what the framework and the database raise, as refusals ----------------------------------------

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


def _invalid(exc: ValidationError) -> WardenError:
    fields = [
        {"field": _field_name(error), "message": _field_message(error), "type": str(error.get("type", "invalid"))}
        for error in exc.errors
    ]
    summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields[:5])
    return WardenError(ApiRefusal.VALIDATION_ERROR, f"Invalid input — {summary}", fields=fields)


_HTTP_ERRORS = {400: CommonRefusal.BAD_REQUEST, 401: CommonRefusal.NOT_AUTHENTICATED, 403: CommonRefusal.NOT_PERMITTED,
                404: CommonRefusal.NOT_FOUND, 405: ApiRefusal.METHOD_NOT_ALLOWED, 409: CommonRefusal.CONFLICT,
                429: CommonRefusal.THROTTLED}


def _http_error(exc: HttpError) -> WardenError:
    code = _HTTP_ERRORS.get(exc.status_code, CommonRefusal.BAD_REQUEST)
    if exc.status_code == 400 and "parse" in str(exc).lower():
        code = ApiRefusal.MALFORMED_BODY
    return WardenError(code, str(exc))


def _throttled(exc: Throttled) -> WardenError:
    retry_after = max(1, math.ceil(exc.wait or 1))
    return WardenError(CommonRefusal.THROTTLED,
                       f"Too many requests: this API key or user is over its rate limit; retry in {retry_after} s.",
                       headers={"Retry-After": str(retry_after)})


def _operational(request, exc: OperationalError | InterfaceError) -> WardenError | None:
    """A request the database did not finish, that the same request again will: a write PostgreSQL
    rolled back because of a concurrent one (SQLSTATE class 40: a deadlock, a serialization
    failure), or a connection lost or refused (class 08, a connection exception; class 57, an
    operator's intervention such as pg_terminate_backend or a shutdown; no SQLSTATE at all: the
    socket closed under psycopg) — nothing half-written, since the transaction went with it
    (issue 27, finding 6). None: a bug."""
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
    if sqlstate.startswith("40"):
        why = "A concurrent change made the database roll this one back; retry it shortly."
    elif sqlstate.startswith(("08", "57")) or isinstance(exc, InterfaceError) or (not sqlstate and _connection_lost(exc)):
        why = "The connection to the database was lost; nothing was saved. Retry it shortly."
    elif isinstance(exc.__cause__, PoolTimeout):
        why = "The server has no database connection free for this request now; nothing was saved. Retry it shortly."
    else:
        return None
    logger.warning("database did not finish %s %s (SQLSTATE %s): answered 503", request.method, request.path,
                   sqlstate or "none")
    return WardenError(CommonRefusal.TRY_AGAIN, why, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def _connection_lost(exc: Exception) -> bool:
    """psycopg's words when the server went away mid-request (no SQLSTATE to go by)."""
    text = str(exc).lower()
    return any(words in text for words in ("connection is closed", "server closed the connection",
                                           "connection already closed", "consuming input failed", "terminating connection"))


def _data_error(request, exc: DataError) -> WardenError:
    # Input the schema let through but PostgreSQL refused (a value out of a column's range).
    logger.warning("database refused API input on %s %s: %s", request.method, request.path, exc)
    return WardenError(ApiRefusal.INVALID_VALUE, "A value is out of the range this API can store.")


def _suspicious(request, exc: SuspiciousOperation) -> WardenError:
    logger.warning("suspicious API request %s %s: %s", request.method, request.path, exc)
    return WardenError(CommonRefusal.BAD_REQUEST, "The request was malformed.")


def _unexpected(request, exc: Exception) -> WardenError:
    logger.exception("unhandled error on %s %s", request.method, request.path)
    return WardenError(CommonRefusal.INTERNAL_ERROR,
                       f"Internal error; it has been logged with request id {request_id_of(request)}.")


def _not_authenticated(request, exc) -> WardenError:
    return WardenError(CommonRefusal.NOT_AUTHENTICATED,
                       "Authentication required: send 'Authorization: Bearer <API key>' or log in.")


def _not_found(request, exc) -> WardenError:
    return WardenError(CommonRefusal.NOT_FOUND, "Not found.")


def _too_large(request, exc) -> WardenError:
    return WardenError(ApiRefusal.TOO_LARGE, f"The request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.")


# What each kind of exception becomes; the most specific registered class wins (ninja's lookup).
_TRANSLATIONS = {
    ValidationError: lambda request, exc: _invalid(exc),
    AuthenticationError: _not_authenticated,
    HttpError: lambda request, exc: _http_error(exc),
    Throttled: lambda request, exc: _throttled(exc),
    Http404: _not_found,
    ObjectDoesNotExist: _not_found,
    OperationalError: lambda request, exc: _operational(request, exc) or _unexpected(request, exc),
    InterfaceError: lambda request, exc: _operational(request, exc) or _unexpected(request, exc),
    DataError: _data_error,
    RequestDataTooBig: _too_large,
    SuspiciousOperation: _suspicious,
    Exception: _unexpected,
}


def errors_handled(api: NinjaAPI) -> None:
    """Register the one handler, and the translation of each exception that is not a refusal yet."""
    api.add_exception_handler(WardenError, lambda request, exc: warden_error(api, request, exc))
    for kind, translate in _TRANSLATIONS.items():
        api.add_exception_handler(kind, _answered_as(api, translate))


def _answered_as(api: NinjaAPI, translate):
    return lambda request, exc: warden_error(api, request, translate(request, exc))
