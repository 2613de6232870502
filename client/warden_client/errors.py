"""What the client raises. Every refusal of the API is JSON `{"code", "message", "fields"?}` with a
4xx or 5xx status (the server's api/errors.py); it becomes an `APIError` of the status's class,
carrying the code, the message, the status, the validation `fields` and — when the server sends
one — the request id. `code` is the API's stable, machine-readable name (`not_found`,
`run_terminal`, `validation_error`, …): branch on it, not on the message."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

# Response headers that may carry the server's id of a request (the first found is kept).
REQUEST_ID_HEADERS = ("X-Request-ID", "Request-Id", "X-Correlation-ID")


class WardenError(Exception):
    """Anything the client raises on purpose."""

    code: str
    message: str
    status: int | None
    request_id: str | None

    def __init__(self, message: str, *, code: str, status: int | None = None, request_id: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.request_id = request_id

    def __str__(self) -> str:
        where = f" ({self.status})" if self.status is not None else ""
        request = f" [request {self.request_id}]" if self.request_id else ""
        return f"{self.code}{where}: {self.message}{request}"


class APIError(WardenError):
    """The API answered with an error (after any retries the client was allowed to make)."""

    status: int

    def __init__(self, message: str, *, code: str, status: int, request_id: str | None = None,
                 fields: list[dict[str, str]] | None = None, retry_after: float | None = None,
                 body: Any = None):
        super().__init__(message, code=code, status=status, request_id=request_id)
        self.fields = fields or []
        self.retry_after = retry_after
        self.body = body


class BadRequestError(APIError):
    """400: a malformed request or body (`bad_request`, `malformed_body`, `invalid_idempotency_key`)."""


class AuthenticationError(APIError):
    """401: no key, an unknown key (`invalid_api_key`) or a revoked one (`api_key_revoked`)."""


class PermissionDeniedError(APIError):
    """403: known but not allowed (`not_permitted`, `budget_over_cap`, `csrf_failed`)."""


class NotFoundError(APIError):
    """404: it does not exist, or the caller may not see it (the API does not say which)."""


class ConflictError(APIError):
    """409: the object changed meanwhile (`conflict`, `run_terminal`, `already_decided`, an
    Idempotency-Key reused for another request: `idempotency_key_reused`)."""


class ValidationError(APIError):
    """422: input the API refuses; `fields` lists where (`body.content`, `query.cursor`, …)."""


class RateLimitedError(APIError):
    """429 `throttled`, after the client's retries: `retry_after` says how long the server asked to wait."""


class ServerError(APIError):
    """5xx, after the client's retries: `try_again` (503: nothing was saved) or `internal_error`."""


class APIConnectionError(WardenError):
    """The server could not be reached, or the connection broke before an answer came, on every
    attempt the client was allowed to make."""

    def __init__(self, message: str, *, code: str = "connection_error"):
        super().__init__(message, code=code)


class StreamError(WardenError):
    """An event stream ended with an `event: error` frame, e.g. `access_revoked`: the key was
    revoked or the caller lost the right to see the run or session. Reconnecting will not help."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError,
    409: ConflictError, 422: ValidationError, 429: RateLimitedError,
}


def request_id_of(headers: httpx.Headers) -> str | None:
    for name in REQUEST_ID_HEADERS:
        if value := headers.get(name):
            return str(value)
    return None


def retry_after_of(headers: httpx.Headers) -> float | None:
    """Retry-After in seconds (the API sends whole seconds; an HTTP date is honoured too)."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def error_from_response(status: int, headers: httpx.Headers, content: bytes) -> APIError:
    """The typed exception for an error answer. A body that is not the API's error model (a proxy's
    HTML page, say) still gives a code: `http_<status>`."""
    body: Any = None
    code, message, fields = f"http_{status}", content.decode("utf-8", "replace")[:500] or f"HTTP {status}", None
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        code = body["code"]
        message = str(body.get("message") or code)
        raw_fields = body.get("fields")
        fields = [f for f in raw_fields if isinstance(f, dict)] if isinstance(raw_fields, list) else None
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else APIError)
    return kind(message, code=code, status=status, request_id=request_id_of(headers), fields=fields,
                retry_after=retry_after_of(headers), body=body)
