"""Allowed tool call transitions (SPEC §6)."""

from runs_app.transitions import check_transition
from tools_app.models import ToolCallStatus

T = ToolCallStatus
TOOL_CALL_TRANSITIONS: dict[str, frozenset[str]] = {
    # pending → succeeded reuses the outcome of an identical earlier write (never a second call).
    T.PENDING: frozenset({T.RUNNING, T.SUCCEEDED, T.FAILED, T.CANCELLED}),
    # running → pending: a read interrupted by a crash is run again.
    # running → unknown: a write whose outcome we cannot know (timeout after sending).
    # running → cancelled: only a read marked running but not yet executed when a cancel lands.
    T.RUNNING: frozenset({T.PENDING, T.SUCCEEDED, T.FAILED, T.UNKNOWN, T.CANCELLED}),
    T.UNKNOWN: frozenset({T.SUCCEEDED, T.FAILED}),
    T.SUCCEEDED: frozenset(),
    T.FAILED: frozenset(),
    T.CANCELLED: frozenset(),
}


def check_tool_call_transition(from_status: str, to_status: str) -> None:
    check_transition(TOOL_CALL_TRANSITIONS, "tool call", from_status, to_status)
