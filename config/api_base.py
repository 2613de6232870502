"""What every router of the HTTP API shares: authentication, the error shape, input types that
cannot crash the database, and keyset cursors. The API itself is assembled in config/api.py."""

import base64
import binascii
import json
import uuid
from datetime import datetime, timezone
from typing import Annotated, Any

from django.conf import settings
from ninja import Schema
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf
from pydantic import AfterValidator, Field

from sessions_app.api_keys import ApiKeyRevoked, api_key_authenticate

# PostgreSQL bigint: larger integers in a filter would be a database error, not an empty page.
MAX_BIGINT = 2**63 - 1
MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50


class ApiError(Exception):
    """An expected failure with its HTTP status and stable machine-readable code."""

    def __init__(self, status: int, code: str, message: str, fields: list[dict] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields


def not_found(what: str) -> ApiError:
    # The same answer whether the object does not exist or the caller may not see it.
    return ApiError(404, "not_found", f"No such {what}.")


class ErrorField(Schema):
    field: str = Field(description="where: body.<name>, query.<name>, path.<name> or header.<name>")
    message: str
    type: str


class ErrorOut(Schema):
    code: str = Field(description="stable, machine-readable, e.g. not_found, validation_error, run_terminal")
    message: str
    fields: list[ErrorField] | None = Field(None, description="validation errors only")


def errors(*statuses: int) -> dict[int, type[ErrorOut]]:
    return {status: ErrorOut for status in statuses}


# Every authenticated operation can answer these.
COMMON_ERRORS = errors(401, 404, 422)


# ---------------------------------------------------------------------------
# Input types
# ---------------------------------------------------------------------------

def storable_text(value: str) -> str:
    # PostgreSQL text cannot hold NUL, and lone surrogates cannot be encoded as UTF-8: both
    # would otherwise surface as a database error after validation.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid Unicode (no lone surrogates)") from exc
    return value


StorableText = Annotated[str, AfterValidator(storable_text)]


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    try:
        return value.astimezone(timezone.utc)
    except OverflowError as exc:  # e.g. 0001-01-01T00:00:00+01:00
        raise ValueError("timestamp out of range") from exc


# Query timestamps: ISO 8601; without an offset they mean UTC.
Timestamp = Annotated[datetime, AfterValidator(_utc)]


# ---------------------------------------------------------------------------
# Keyset cursors
# ---------------------------------------------------------------------------

def cursor_encode(position: datetime, pk) -> str:
    raw = json.dumps([position.isoformat(), str(pk)], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cursor_decode(cursor: str, *, pk_type=uuid.UUID) -> tuple[datetime, Any]:
    """The (timestamp, id) a page ends at. Cursors are opaque to clients and checked here:
    a damaged one is a 422, never a database error."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        position, pk = json.loads(raw)
        return _utc(datetime.fromisoformat(position)), pk_type(pk)
    except (binascii.Error, ValueError, TypeError, AttributeError, OverflowError, UnicodeDecodeError):
        raise ApiError(422, "invalid_cursor", "The cursor is not one this API handed out.",
                       fields=[{"field": "query.cursor", "message": "invalid cursor", "type": "invalid_cursor"}]) from None


def keyset_page(queryset, *, cursor: str | None, limit: int, position_field: str, descending: bool = True,
                order_prefix: tuple = ()):
    """One page of `queryset` ordered by (position_field, id), and the cursor of the next page
    (None on the last). The bound is written as `pos <= c AND (pos < c OR id < pk)` so the first
    half is an index range condition: deep pages cost the same as the first. `order_prefix`
    names columns the filters fix to one value: ordering by them changes nothing but tells the
    planner which index already yields the rows in order."""
    from django.db.models import Q

    order = [f"-{position_field}", "-id"] if descending else [position_field, "id"]
    queryset = queryset.order_by(*order_prefix, *order)
    if cursor:
        position, pk = cursor_decode(cursor)
        if descending:
            queryset = queryset.filter(Q(**{f"{position_field}__lte": position}),
                                       Q(**{f"{position_field}__lt": position}) | Q(id__lt=pk))
        else:
            queryset = queryset.filter(Q(**{f"{position_field}__gte": position}),
                                       Q(**{f"{position_field}__gt": position}) | Q(id__gt=pk))
    rows = list(queryset[: limit + 1])
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1]
        if isinstance(last, dict):  # a .values() page
            next_cursor = cursor_encode(last[position_field], last["id"])
        else:
            next_cursor = cursor_encode(getattr(last, position_field), last.pk)
    return rows, next_cursor


# ---------------------------------------------------------------------------
# Authentication
# ---------------------------------------------------------------------------

class ApiKeyAuth(HttpBearer):
    """`Authorization: Bearer <API key>` for machine clients. A key that is presented but
    wrong or revoked is a 401 at once; it never falls through to the session cookie."""

    def authenticate(self, request, token: str):
        try:
            user = api_key_authenticate(token=token)
        except ApiKeyRevoked:
            raise ApiError(401, "api_key_revoked", "This API key was revoked.") from None
        if user is None:
            raise ApiError(401, "invalid_api_key", "Unknown API key.")
        return user


class SessionCookieAuth(APIKeyCookie):
    """The browser's Django session. Cookies are sent by the browser on its own, so unsafe
    methods must carry the CSRF token (X-CSRFToken header); an anonymous request has no
    cookie identity to abuse and gets the plain 401 instead."""

    param_name = settings.SESSION_COOKIE_NAME

    def _get_key(self, request):
        if not request.user.is_authenticated:
            return None
        if not getattr(request, "_ninja_csrf_exempt", False) and check_csrf(request):
            raise ApiError(403, "csrf_failed", "CSRF check failed: send the csrftoken cookie's value in an X-CSRFToken header.")
        return request.COOKIES.get(self.param_name)

    def authenticate(self, request, key):
        return request.user if request.user.is_authenticated else None


API_AUTH = [ApiKeyAuth(), SessionCookieAuth()]
