"""The API's resources as frozen dataclasses, field for field as the OpenAPI schema
(/api/v1/openapi.json) names them. Ids are strings (UUIDs as the API writes them), timestamps
timezone-aware datetimes, free-form JSON (arguments, payloads) plain Python values. Every resource
keeps the JSON it was read from in `raw` (fields a newer server adds are there), and a write
answered from the server's idempotency record — a retry finding that the first attempt had
already done it — says so in `replayed`."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Self, TypeVar

TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True, kw_only=True)
class Resource:
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    replayed: bool = field(default=False, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any], **extra: Any) -> Self:
        hints = _hints(cls)
        values: dict[str, Any] = {}
        for spec in dataclasses.fields(cls):
            if spec.name in ("raw", "replayed"):
                continue
            if spec.name in extra:
                values[spec.name] = extra[spec.name]
            elif spec.name in data:
                values[spec.name] = _convert(hints[spec.name], data[spec.name])
            elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                values[spec.name] = None  # a field an older server does not send
        return cls(raw=data, **values)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _convert(options[0], value) if len(options) == 1 else value
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(hint) or (Any,)
        return [_convert(item, element) for element in value]
    if hint is datetime and isinstance(value, str):
        return datetime.fromisoformat(value)
    if isinstance(hint, type) and issubclass(hint, Resource) and isinstance(value, dict):
        return hint.from_json(value)
    return value


# --- who -------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Me(Resource):
    username: str
    permissions: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Agent(Resource):
    slug: str
    name: str
    version: dict[str, Any] = field(default_factory=dict)
    versions: list[int] = field(default_factory=list)


# --- sessions --------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Message(Resource):
    id: int
    seq: int
    role: str
    content: str
    tool_calls: Any = None
    tool_call_id: str = ""
    tool_name: str = ""
    run_id: str | None = None
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class PendingInput(Resource):
    id: int
    content: str
    mode: str
    resolved_mode: str | None = None
    disposition: str | None = None
    received_at: datetime
    consumed_at: datetime | None = None
    consumed_by_run_id: str | None = None
    # Input meant for a run that was cancelled is held (disposition `held`) until its user sends it
    # as a new request or drops it (Sessions.send_held / drop_held).
    held_from_run_id: str | None = None
    held_reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Session(Resource):
    id: str
    title: str
    owner: str
    agent: str | None = None
    active_run_id: str | None = None
    message_count: int = 0
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, kw_only=True)
class SessionDetail(Session):
    messages: list[Message] = field(default_factory=list)
    pending_inputs: list[PendingInput] = field(default_factory=list)
    held_inputs: list[PendingInput] = field(default_factory=list)


# --- runs ------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Run(Resource):
    id: str
    session_id: str
    status: str
    phase: str | None = None
    wait_reason: str | None = None
    outcome: str | None = None
    model_calls: int = 0
    tokens_used: int = 0
    cancel_requested_at: datetime | None = None
    error_code: str | None = None
    created_at: datetime
    finished_at: datetime | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True, kw_only=True)
class Money(Resource):
    amount: str  # a decimal number as the tool's arguments gave it, "9.00": never a float
    currency: str | None = None

    def __str__(self) -> str:
        return f"{self.amount} {self.currency}" if self.currency else self.amount


@dataclass(frozen=True, kw_only=True)
class RunListItem(Run):
    title: str = ""
    agent: str | None = None
    money_moved: list[Money] = field(default_factory=list)  # what its applied writes moved, per currency


@dataclass(frozen=True, kw_only=True)
class Event(Resource):
    """One event of a run's log. `run_id` is the run's; `id` is the stream's cursor (`Last-Event-ID`)
    when the event came from a stream: the seq for a run's stream, an opaque string for a session's."""

    run_id: str
    seq: int
    type: str
    payload: Any = None
    created_at: datetime
    id: str | None = None


@dataclass(frozen=True, kw_only=True)
class EventPage(Resource):
    items: list[Event] = field(default_factory=list)
    next_after: int = 0
    run_status: str = ""
    finished: bool = False


@dataclass(frozen=True, kw_only=True)
class ToolCall(Resource):
    id: str
    run_id: str
    step_id: int
    index: int
    tool_call_id: str
    tool_name: str
    arguments: Any = None
    proposed_arguments: Any = None
    effect: str
    status: str
    attempts: int = 0
    idempotency_key: str | None = None
    business_key: str | None = None
    reused_from: str | None = None
    reused_from_run: str | None = None
    money: str | None = None
    result: Any = None
    error_code: str = ""
    error_detail: str = ""
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    approval_id: str | None = None
    reconcile_attempts: int = 0
    next_attempt_at: datetime | None = None
    resolution: str | None = None
    resolved_by: str | None = None
    resolved_at: datetime | None = None
    evidence: str = ""
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class ApprovalToolCall(Resource):
    id: str
    tool_name: str
    arguments: Any = None
    proposed_arguments: Any = None
    status: str
    idempotency_key: str | None = None
    money: str | None = None


@dataclass(frozen=True, kw_only=True)
class Approval(Resource):
    id: str
    run_id: str
    session_id: str
    tool_call: ApprovalToolCall
    policy: str
    status: str
    requested_at: datetime
    expires_at: datetime
    decided_by: str | None = None
    decided_at: datetime | None = None
    note: str = ""
    customer_message: str = ""
    can_decide: bool = False
    required_approvals: int = 1
    approved_by: list[str] = field(default_factory=list)
    approvals_missing: int = 0
    rule: str = ""
    rule_reason: str = ""


@dataclass(frozen=True, kw_only=True)
class RunDetail(Run):
    """`GET /runs/{id}`: the run with its steps, tool calls, approvals and latest events. Parts the
    schema describes loosely (budgets, wait, cancel, error, agent, steps) are plain dicts."""

    agent: dict[str, Any] | None = None
    started_at: datetime | None = None
    updated_at: datetime | None = None
    created_by: str | None = None
    provider: str = ""
    budgets: dict[str, Any] = field(default_factory=dict)
    wait: dict[str, Any] | None = None
    cancel: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    event_seq: int = 0
    step_count: int = 0
    can_cancel: bool = False
    can_retry: bool = False
    retry_of: str | None = None
    retries: list[str] = field(default_factory=list)
    can_fork: bool = False
    forked_from: str | None = None
    forks: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    approvals: list[Approval] = field(default_factory=list)
    applied_effects: list[dict[str, Any]] = field(default_factory=list)
    recent_events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class MessagePosted(Resource):
    """`POST /sessions/{id}/messages`: `started_run` (201) or, while a run is active, `answered` /
    `pending` (202) — `run` is the run started or the active one given the input."""

    disposition: str
    message: Message | None = None
    pending_input: PendingInput | None = None
    run: Run


@dataclass(frozen=True)
class FeedPage:
    """A page of many runs' events (a session's, or every run's) in commit order; pass `next_after`
    as `after=` to continue (the last item's `id`; the `after` sent when nothing came)."""

    items: list[Event]
    next_after: str | None


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list; pass `next_cursor` as `cursor=` for the next (None: the last page)."""

    items: list[T]
    next_cursor: str | None
