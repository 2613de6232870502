"""What every router of the HTTP API shares: authentication, the error shape, input types that
cannot crash the database, and keyset cursors. The API itself is assembled in api/v1.py."""

import re
from datetime import datetime, timezone
from typing import Annotated, Any, Union

from django.conf import settings
from ninja import Schema
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field
from typing_extensions import TypeAliasType

from config.errors import WardenError
from api.errors import ApiRefusal
from config.storable import json_shown, storable_json, storable_text
from sessions_app.api_keys import ApiKeyRevoked, api_key_authenticate

# PostgreSQL bigint: larger integers in a filter would be a database error, not an empty page.
MAX_BIGINT = 2**63 - 1
MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50


class ErrorField(Schema):
    field: str = Field(description="where: body.<name>, query.<name>, path.<name> or header.<name>")
    message: str
    type: str


class ErrorOut(Schema):
    code: str = Field(description="stable, machine-readable, e.g. not_found, validation_error, run_terminal")
    message: str
    fields: list[ErrorField] | None = Field(None, description="validation errors only")


def errors(*statuses: int) -> dict[int, type[ErrorOut]]:
    # Every operation can be rate-limited (config/throttling.py): 429 with Retry-After.
    return {status: ErrorOut for status in (*statuses, 429)}


# Every authenticated operation can answer these (422 also for a query parameter it does not take, api/v1.py).
COMMON_ERRORS = errors(400, 401, 404, 422)


# ---------------------------------------------------------------------------
# Input types
# ---------------------------------------------------------------------------

class BodyIn(BaseModel):
    """The base of every request body, and of every object inside one: a JSON object and nothing
    else. A ninja Schema would read attributes off whatever it is given (PITFALLS.md): a body of
    "hello" became a session titled "Hello" (str.title), and `[1, 2]`, `123`, `true` or
    `"budgets": "lots"` passed as objects with every field defaulted. A plain pydantic model
    answers them with a validation error (422, `type: model_type`) naming where."""


# What text PostgreSQL stores, as the schema says it (issue 27, finding 11: the schema promised NUL,
# which storable_text refuses): any character but NUL. (Lone surrogates, refused too, are not
# characters UTF-8 can carry; a JSON Schema regex cannot name them.)
TEXT_PATTERN = "^[^\\u0000]*$"


class _TextPattern:
    """Puts TEXT_PATTERN in a string's JSON schema; the validators check it (with clearer words)."""

    def __get_pydantic_json_schema__(self, core_schema, handler):
        schema = handler(core_schema)
        schema["pattern"] = TEXT_PATTERN
        return schema


class _Closed:
    """An object's JSON schema allows no keys but those its patternProperties name."""

    def __get_pydantic_json_schema__(self, core_schema, handler):
        schema = handler(core_schema)
        schema["additionalProperties"] = False
        return schema


_Key = Annotated[str, _TextPattern()]
# A stored JSON value as the schema describes it: its strings and keys are storable text (depth and
# size are checked by storable_json; JSON Schema has no words for them).
StorableValue = TypeAliasType("StorableValue", Union[
    Annotated[str, _TextPattern()], int, float, bool, None, list["StorableValue"],
    Annotated[dict[_Key, "StorableValue"], _Closed()]])

StorableText = Annotated[str, AfterValidator(storable_text), _TextPattern()]
# A JSON object from outside: at most JSON_MAX_DEPTH deep and JSON_MAX_CHARS long, no NUL (422 otherwise).
# Validated by storable_json alone (fast, and its words); the schema is StorableValue's.
StorableJSON = Annotated[dict[str, Any], AfterValidator(storable_json),
                         BeforeValidator(lambda value: value, json_schema_input_type=Annotated[dict[_Key, StorableValue], _Closed()])]
# A stored document as a read returns it: anything deeper than the limit replaced by a marker.
ShownJSON = Annotated[Any, BeforeValidator(json_shown)]


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    try:
        return value.astimezone(timezone.utc)
    except OverflowError as exc:  # e.g. 0001-01-01T00:00:00+01:00
        raise ValueError("timestamp out of range") from exc


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _iso_8601_only(value):
    # pydantic also reads a number as seconds since 1970: `created_before=0.5` would be a date in
    # 1970 where the schema promises a date-time string.
    if isinstance(value, (int, float)) or (isinstance(value, str) and _NUMBER.fullmatch(value.strip())):
        raise ValueError("must be an ISO 8601 date-time, e.g. 2025-01-31T12:00:00Z, not a number")
    return value


# Query timestamps: ISO 8601; without an offset they mean UTC.
Timestamp = Annotated[datetime, BeforeValidator(_iso_8601_only), AfterValidator(_utc)]


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
            raise WardenError(ApiRefusal.API_KEY_REVOKED, "This API key was revoked.") from None
        if user is None:
            raise WardenError(ApiRefusal.INVALID_API_KEY, "Unknown API key.")
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
            raise WardenError(ApiRefusal.CSRF_FAILED,
                              "CSRF check failed: send the csrftoken cookie's value in an X-CSRFToken header.")
        return request.COOKIES.get(self.param_name)

    def authenticate(self, request, key):
        return request.user if request.user.is_authenticated else None


API_AUTH = [ApiKeyAuth(), SessionCookieAuth()]
