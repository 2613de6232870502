"""The model provider interface: a provider turns a request into a stream of events.

Providers are synchronous iterators (workers are plain processes). The engine may stop
iterating at any moment — cancel, lease lost — and then calls `close()` on the iterator,
so a provider must release its connection in a `finally`.
"""

from dataclasses import dataclass, field
from typing import Iterator, Protocol, Union


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A fragment of one tool call. `index` identifies the call within the turn (None when the
    server sends none: the engine tells calls apart by id); `id` and `name` usually arrive with
    the first fragment only; `arguments` is a piece of JSON text."""

    index: int | None
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Finish:
    """The model's own end of turn: `stop`, `tool_calls`, `length`, `content_filter`…"""

    reason: str


StreamEvent = Union[TextDelta, ToolCallDelta, Usage, Finish]


class ModelError(Exception):
    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.status = status


class TransientModelError(ModelError):
    """429, 5xx, timeouts and dropped streams: worth retrying with backoff."""

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None):
        super().__init__(message, status=status)
        self.retry_after = retry_after


class PermanentModelError(ModelError):
    """Bad request, authentication, unknown model: retrying cannot help."""


@dataclass
class ModelRequest:
    """What the engine asks the model: OpenAI-style chat messages and function tools."""

    messages: list[dict]
    tools: list[dict] = field(default_factory=list)
    run_id: str = ""
    call_index: int = 0  # how many model calls this run made before this one
    options: dict = field(default_factory=dict)  # the run's provider_options (scripted faults, …)
    max_output_tokens: int | None = None  # the answer's token limit (sent as max_tokens)


# How the model context marks a user message that was added to a request while the run worked on
# it (a supplement, SPEC §8): the answer must cover the whole request, not only the addition.
SUPPLEMENT_NOTE = "[The user added this while you were working on their request; answer all of it.] "


@dataclass(frozen=True)
class InputClassification:
    mode: str  # "supplement" or "new_intent"
    reason: str


@dataclass(frozen=True)
class Summary:
    """A summary of older history for the model context, and the tokens making it cost."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0


class Provider(Protocol):
    name: str

    def stream(self, request: ModelRequest) -> Iterator[StreamEvent]: ...

    def classify_input(self, *, history: list[dict], text: str) -> InputClassification: ...

    def summarize(self, *, previous: str, messages: list[dict], max_tokens: int) -> Summary:
        """`previous` (the summary so far, or "") with `messages` (OpenAI-style, oldest first)
        folded in, in at most about `max_tokens` tokens."""
        ...
