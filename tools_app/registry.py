"""The tool registry: a tool is declared once, with everything the run-time needs to decide
whether, when and how it runs (SPEC §6)."""

import contextlib
import contextvars
import hashlib
import json
from decimal import Decimal, InvalidOperation
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from sessions_app.selectors import Customer, session_customer
from tools_app.models import ToolEffect


class ApprovalRequirement:
    NONE = "none"
    USER = "user"
    OPERATOR = "operator"


class ToolError(Exception):
    """A definite failure: the downstream system said no, or the request provably never left.
    `retryable` applies to reads only; writes are never retried automatically."""

    def __init__(self, code: str, detail: str = "", *, retryable: bool = False):
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail
        self.retryable = retryable


class ToolOutcomeUnknown(Exception):
    """The request may have taken effect (timeout after sending, dropped connection,
    ambiguous 5xx). For writes this means `unknown` and reconciliation — never a retry."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True)
class ToolContext:
    """What the run-time tells a tool about the call it serves. `customer` is the verified customer
    — the session's owner — and `agent` the run's agent: a tool uses them to refuse another
    customer's objects (docs/EXTENDING.md), never anything the model wrote."""

    run_id: str
    session_id: str
    tool_call_id: str  # our ToolCall uuid
    idempotency_key: str | None
    timeout: float
    agent: str = ""  # the run's agent's slug; "" for a run without one

    @property
    def customer(self) -> Customer | None:
        return session_customer(self.session_id) if self.session_id else None


@dataclass(frozen=True)
class Reconciled:
    """What the downstream system says happened to a request, by idempotency key."""

    applied: bool
    result: dict | None = None
    detail: str = ""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    arguments: type[BaseModel]
    effect: str
    execute: Callable[[ToolContext, BaseModel], dict]
    approval: str = ApprovalRequirement.NONE
    timeout: float = 10.0
    # Reads only: attempts in all, and the first backoff (doubling).
    max_attempts: int = 3
    retry_backoff: float = 0.2
    # Writes: ask the downstream system what happened to a key; None when it cannot tell yet.
    reconcile: Callable[[ToolContext, BaseModel], Reconciled | None] | None = None
    # Writes: the business key (e.g. "refund:<order>"), a fact of the deployment: one key executes
    # once across every run and session (docs/EXTENDING.md, "Business keys"). Without one, a
    # write is deduplicated within its run only (a hash of run, tool and arguments).
    business_key: Callable[[BaseModel], str] | None = None
    # Writes that move money: the argument holding the amount, and the currency — fixed (`currency`,
    # e.g. "EUR") or an argument (`currency_argument`). Limits add amounts up per currency, and every
    # surface shows an amount with its currency (docs/EXTENDING.md, "Limits").
    amount: str | None = None
    currency: str | None = None
    currency_argument: str | None = None
    # Writes: who the arguments' counterparty and reference are, for the desk's queue columns.
    counterparty: str | None = None
    reference: str | None = None
    # What a succeeded call came to, in one line for the customer's console (docs/EXTENDING.md,
    # "Result summaries"): a format string over the call's arguments and result ("Refunded
    # {amount} {currency}, ref {refund_id}") or a function (arguments, result) -> str. A summary
    # that cannot be written (a missing field, an exception) falls back to the general words.
    summary: str | Callable[[dict, dict], str] | None = None
    extra: dict = field(default_factory=dict)

    def money_of(self, arguments: dict | None) -> tuple[Decimal | None, str | None]:
        """A call's amount and currency, as the tool declares them (None, None when it declares no amount)."""
        arguments = arguments or {}
        if self.amount is None:
            return None, None
        try:
            amount = Decimal(str(arguments.get(self.amount)))
        except (InvalidOperation, ValueError):
            return None, None
        if not amount.is_finite():
            return None, None
        currency = self.currency or (str(arguments.get(self.currency_argument) or "").upper() or None
                                     if self.currency_argument else None)
        return amount, currency

    def money_text(self, arguments: dict | None) -> str | None:
        """"9.00 EUR": how every surface shows a call's amount (None for a tool that declares none)."""
        amount, currency = self.money_of(arguments)
        return None if amount is None else f"{amount} {currency or ''}".strip()

    def summary_text(self, arguments: dict | None, result: Any) -> str | None:
        """The one-line business result of a succeeded call, as the tool declares it; None when it
        declares none or the declaration cannot be filled in from this call."""
        if self.summary is None:
            return None
        arguments = arguments if isinstance(arguments, dict) else {}
        result_fields = result if isinstance(result, dict) else {}
        try:
            if callable(self.summary):
                text = self.summary(arguments, result)
            else:
                # The result's fields win over the arguments' (what happened over what was asked).
                text = self.summary.format_map({**arguments, **result_fields})
        except Exception:  # noqa: BLE001 - a summary is a courtesy: the card falls back to plain words
            return None
        text = " ".join(str(text or "").split())
        return text[:SUMMARY_MAX_CHARS] or None

    def argument_fields(self) -> dict[str, str]:
        """The tool's arguments by name, with their descriptions (an MCP tool's from its JSON schema)."""
        described = getattr(self.arguments, "described_fields", None)
        if described is not None:
            return described()
        return {name: info.description or "" for name, info in self.arguments.model_fields.items()}

    def openai_schema(self) -> dict:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.arguments.model_json_schema(),
            },
        }

    def business_key_for(self, arguments: BaseModel) -> str | None:
        """The deployment-wide key of a write with a business key (the tool's name in front, so
        two tools never share one); None for a tool without. `arguments` are the validated
        ones: the tool's schema has normalised them (stripped, cased as it declares)."""
        if self.business_key is None:
            return None
        key = f"{self.name}:{self.business_key(arguments)}"
        if len(key) > BUSINESS_KEY_MAX:
            # Still one key per business fact, within the column: a digest of the long tail.
            key = f"{self.name}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"
        return key

    def idempotency_key_for(self, *, run_id, arguments: BaseModel) -> str:
        """Stable across re-emissions of the same action (never the model's tool_call_id): the
        business key, the same in every run; without one, scoped to `run_id`."""
        if self.business_key is not None:
            return self.business_key_for(arguments)
        canonical = json.dumps(arguments.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(f"{run_id}|{self.name}|{canonical}".encode()).hexdigest()[:32]
        return f"{self.name}:{digest}"


# A result summary is one line on a card.
SUMMARY_MAX_CHARS = 200
# Keys live in a 200-character column; a retried write's key gets ":retry<n>" after it.
BUSINESS_KEY_MAX = 180


_REGISTRY: dict[str, Tool] = {}
_SCHEMAS: list[dict] | None = None  # built once: pydantic schema generation costs ~0.4 ms a tool
_SCHEMA_OF: dict[str, dict] = {}


def tool_register(tool: Tool) -> Tool:
    if tool.effect not in ToolEffect.values:
        raise ValueError(f"tool {tool.name}: effect must be read or write")
    if tool.effect == ToolEffect.READ and tool.approval != ApprovalRequirement.NONE:
        raise ValueError(f"tool {tool.name}: only write tools take an approval policy")
    declared = {"amount": tool.amount, "currency_argument": tool.currency_argument,
                "counterparty": tool.counterparty, "reference": tool.reference}
    for what, argument in declared.items():
        if argument is not None and argument not in tool.arguments.model_fields:
            raise ValueError(f"tool {tool.name}: {what} names {argument!r}, which is not one of its arguments")
    if tool.currency is not None and tool.currency_argument is not None:
        raise ValueError(f"tool {tool.name}: a fixed currency or a currency argument, not both")
    if tool.currency is not None and not (len(tool.currency) == 3 and tool.currency.isalpha() and tool.currency.isupper()):
        raise ValueError(f"tool {tool.name}: currency is a three-letter code such as \"EUR\"")
    if tool.summary is not None and not (isinstance(tool.summary, str) or callable(tool.summary)):
        raise ValueError(f"tool {tool.name}: summary is a format string or a function (arguments, result) -> str")
    global _SCHEMAS
    _REGISTRY[tool.name] = tool
    _SCHEMAS = None
    _SCHEMA_OF.pop(tool.name, None)
    return tool


# Tools that are not the deployment's own modules' — an agent version's MCP tools (tools_app.mcp) —
# are the version's: the engine puts a run's in scope while it drives the run (`tools_in_scope`),
# and elsewhere (the desk, the console, the API showing a call) `_ELSEWHERE`, filled in by the
# agents app, finds the latest version that has a tool of that name.
_SCOPE: contextvars.ContextVar[dict[str, Tool] | None] = contextvars.ContextVar("warden_tools_in_scope", default=None)
_ELSEWHERE: list[Callable[[str], Tool | None]] = []


@contextlib.contextmanager
def tools_in_scope(tools: dict[str, Tool] | None):
    """`tool_get` also answers with `tools` (by name) in this context: a run's own tool set."""
    token = _SCOPE.set(tools or None)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def tool_resolver_add(resolve: Callable[[str], Tool | None]) -> None:
    """An extension point: how a tool that is neither registered nor in scope is found (agents app)."""
    if resolve not in _ELSEWHERE:
        _ELSEWHERE.append(resolve)


def tool_registered(name: str) -> Tool | None:
    """One of the deployment's own tools (WARDEN_TOOL_MODULES) or ask_user; None for any other name."""
    return _REGISTRY.get(name)


def tool_get(name: str) -> Tool | None:
    tool = _REGISTRY.get(name)
    if tool is not None:
        return tool
    scope = _SCOPE.get()
    if scope is not None and name in scope:
        return scope[name]
    for resolve in _ELSEWHERE:
        if (found := resolve(name)) is not None:
            return found
    return None


def tool_list() -> list[Tool]:
    return list(_REGISTRY.values())


def tool_schemas(names: list[str] | None = None) -> list[dict[str, Any]]:
    """The function schemas the model is offered: every registered tool, or (an agent version's
    list) only the tools named — and the run-time's own ask_user, which every run has."""
    global _SCHEMAS
    if names is None:
        if _SCHEMAS is None:
            _SCHEMAS = [tool.openai_schema() for tool in _REGISTRY.values()]
        return _SCHEMAS
    offered = [name for name in _REGISTRY if name in set(names) or name == ASK_USER]
    for name in offered:
        if name not in _SCHEMA_OF:
            _SCHEMA_OF[name] = _REGISTRY[name].openai_schema()
    scope = _SCOPE.get() or {}
    return [_SCHEMA_OF[name] for name in offered] + [scope[name].openai_schema() for name in names
                                                    if name not in _REGISTRY and name in scope]


# --- the run-time's own tool ------------------------------------------------------------------

ASK_USER = "ask_user"


class AskUserArguments(BaseModel):
    model_config = ConfigDict(extra="ignore")

    question: str = Field(min_length=1, max_length=1000, description="What to ask, in words for the user.")


def _answered_by_the_user(ctx: ToolContext, args: BaseModel) -> dict:
    # Never executed: the engine suspends the run on this call, and the user's reply closes it.
    raise ToolError("not_executable", "ask_user is answered by the user, not executed")


tool_register(Tool(
    name=ASK_USER,
    description=(
        "Ask the user for something only they can give (a missing order number, a choice, a "
        "confirmation of a detail) and wait for their reply. Use it instead of guessing."
    ),
    arguments=AskUserArguments,
    effect=ToolEffect.READ,
    execute=_answered_by_the_user,
    timeout=0,
    max_attempts=1,
))
