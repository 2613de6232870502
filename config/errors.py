"""One error model (STYLE.md): every refusal Warden makes — of a request, a decision, a message — is
a `WardenError` carrying a code from an app's enum of refusals, a message for people and, for
input, the fields it concerns. The API answers it with the code's HTTP status and its JSON body
(api/errors.py: one handler); the console and the desk show the same message. A new refusal is one
new member of an enum: `<app>/errors.py` holds each app's.
"""

from enum import Enum
from typing import Any


class Refusal(str, Enum):
    """The refusals of one app: each member's value is its stable, machine-readable code, and
    `status` the HTTP status the API answers it with. Subclasses list members as
    `NAME = "code", status`."""

    def __new__(cls, code: str, status: int):
        member = str.__new__(cls, code)
        member._value_ = code
        member.status = status
        return member

    def __str__(self) -> str:
        return self.value


class CommonRefusal(Refusal):
    """What every surface may answer, whatever the app."""

    BAD_REQUEST = "bad_request", 400
    NOT_AUTHENTICATED = "not_authenticated", 401
    NOT_PERMITTED = "not_permitted", 403
    NOT_FOUND = "not_found", 404
    CONFLICT = "conflict", 409  # the object changed meanwhile: read it again
    INVALID_CURSOR = "invalid_cursor", 422
    THROTTLED = "throttled", 429
    INTERNAL_ERROR = "internal_error", 500
    TRY_AGAIN = "try_again", 503  # the database rolled the change back or is unreachable: send it again


class StartupRefused(Exception):
    """A setting Warden cannot start with; manage.py and the web server print it as one line (no
    traceback) and exit."""


class WardenError(Exception):
    """A refusal: nothing was written. `fields` (for input) name where: `body.<name>`,
    `query.<name>`, `path.<name>` or `header.<name>`; `headers` go on an HTTP answer (Retry-After)."""

    def __init__(self, code: Refusal, message: str, *, fields: list[dict[str, str]] | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.fields = fields
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return self.code.status

    def body(self) -> dict[str, Any]:
        """The JSON every surface sends for it: {"code", "message", "fields"?}."""
        body: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.fields is not None:
            body["fields"] = self.fields
        return body
