"""The refusals of sessions and what is posted to them (config/errors.py)."""

from config.errors import Refusal


class SessionRefusal(Refusal):
    EMPTY_MESSAGE = "empty_message", 422
    MESSAGE_TOO_LONG = "message_too_long", 422
    INVALID_MODE = "invalid_mode", 422
    # A held input (its run was cancelled) was sent or dropped already: read the session again.
    INPUT_NOT_HELD = "input_not_held", 409
