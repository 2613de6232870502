"""warden-client: a typed Python client for Warden's HTTP API (/api/v1), sync (`Warden`) and async
(`AsyncWarden`), and the `warden` command line (warden_client.cli). Every write carries an
Idempotency-Key and is retried safely; lists iterate across cursor pages; event streams resume
with Last-Event-ID; refusals are typed exceptions carrying the API's error code."""

__version__ = "0.1.0"

from warden_client._core import Call, ReconnectPolicy, RetryPolicy  # noqa: E402
from warden_client.aio import AsyncWarden  # noqa: E402
from warden_client.client import Warden  # noqa: E402
from warden_client.errors import (  # noqa: E402
    APIConnectionError, APIError, AuthenticationError, BadRequestError, ConflictError, NotFoundError,
    PermissionDeniedError, RateLimitedError, ServerError, StreamError, ValidationError, WardenError,
)
from warden_client.models import (  # noqa: E402
    Agent, Approval, ApprovalToolCall, Event, EventPage, FeedPage, Me, Message, MessagePosted, Money, Page,
    PendingInput, Run, RunDetail, RunListItem, Session, SessionDetail, ToolCall,
)
from warden_client.sse import ServerSentEvent, SSEDecoder  # noqa: E402

__all__ = [
    "APIConnectionError", "APIError", "Agent", "Approval", "ApprovalToolCall", "AsyncWarden", "AuthenticationError",
    "BadRequestError", "Call", "ConflictError", "Event", "EventPage", "FeedPage", "Me", "Message", "MessagePosted",
    "Money", "NotFoundError", "Page", "PendingInput", "PermissionDeniedError", "RateLimitedError", "ReconnectPolicy",
    "RetryPolicy", "Run", "RunDetail", "RunListItem", "SSEDecoder", "ServerError", "ServerSentEvent", "Session",
    "SessionDetail", "StreamError", "ToolCall", "ValidationError", "Warden", "WardenError", "__version__",
]
