"""Guards that see the whole flow of money, not one call (SPEC §18): caps on the writes of a model
turn and of a run, and cumulative limits — sums of a write tool's amount and counts of its calls
over rolling windows, per customer, per agent or per counterparty argument, in a currency.

An agent version says them (docs/EXTENDING.md, "Limits"):

    "write_caps": {"per_turn": 1, "per_run": 5},
    "limits": {"execute_refund": [
        {"window": "24h", "per": "customer", "max_amount": "30.00", "over": "operator"},
        {"window": "1h", "per": "customer", "max_count": 5, "over": "refuse"},
        {"window": "30d", "per": "account", "max_amount": "1000.00", "currency": "EUR", "over": "operator", "approvers": 2}
    ]}

`limits_check` is the run-time's evaluation when a write is created, with the scopes' locks held
(engine.tool_exec): every call of the tool created in the window counts — pending approval,
running, `unknown` and succeeded — except those that definitely did not take effect or were
answered by an earlier call; the call itself is added. A limit crossed sends the call to the
limit's tier (the stricter of it and the agent's approval rule applies) or refuses it."""

import re
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.utils import timezone

from tools_app.models import ToolEffect
from tools_app.registry import ApprovalRequirement, Tool, tool_get

PER_TURN, PER_RUN = "per_turn", "per_run"
CAP_BOUNDS = {PER_TURN: 20, PER_RUN: 200}
WINDOW = re.compile(r"^([1-9][0-9]{0,3})([mhd])$")
WINDOW_UNITS = {"m": "minutes", "h": "hours", "d": "days"}
MAX_WINDOW = timedelta(days=90)
SCOPES_BUILT_IN = ("customer", "agent")
OVER = ("refuse", ApprovalRequirement.USER, ApprovalRequirement.OPERATOR)
MAX_APPROVERS = 5
LIMIT_KEYS = {"window", "per", "max_amount", "max_count", "currency", "over", "approvers"}
REFUSE = "refuse"
# How strict a tier is: a call goes to the strictest that any rule or limit asks for.
TIER_ORDER = {ApprovalRequirement.NONE: 0, ApprovalRequirement.USER: 1, ApprovalRequirement.OPERATOR: 2}


def write_caps_of(version) -> dict[str, int]:
    """The caps a run of `version` (None: a run without an agent) is held to."""
    caps = {PER_TURN: settings.WARDEN_WRITES_PER_TURN, PER_RUN: settings.WARDEN_WRITES_PER_RUN}
    if version is not None:
        caps |= version.write_caps or {}
    return caps


def window_of(text: str) -> timedelta:
    number, unit = WINDOW.match(text).groups()
    return timedelta(**{WINDOW_UNITS[unit]: int(number)})


def write_caps_check(value: Any, errors: dict[str, str]) -> dict[str, int]:
    if value in (None, {}):
        return {}
    if not isinstance(value, dict) or set(value) - set(CAP_BOUNDS):
        errors["write_caps"] = 'an object {"per_turn": N, "per_run": N}'
        return {}
    clean = {}
    for name, bound in CAP_BOUNDS.items():
        if name not in value:
            continue
        number = value[name]
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= bound:
            errors[f"write_caps.{name}"] = f"a whole number from 1 to {bound}"
        else:
            clean[name] = number
    if clean.get(PER_TURN, 0) > clean.get(PER_RUN, CAP_BOUNDS[PER_RUN]):
        errors["write_caps.per_turn"] = "more than per_run: a run could never make that many"
    return clean


def limits_check(value: Any, *, tools: list[str] | None, errors: dict[str, str]) -> dict[str, list[dict]]:
    """The `limits` of a definition, normalised (amounts as text with their cents), or errors
    naming each offending field."""
    if value in (None, {}):
        return {}
    if not isinstance(value, dict):
        errors["limits"] = 'an object {"<write tool>": [limits…]}'
        return {}
    clean: dict[str, list[dict]] = {}
    for tool_name, limits in value.items():
        where = f"limits.{tool_name}"
        tool = tool_get(tool_name)
        if tool is None or (tools is not None and tool_name not in tools):
            errors[where] = f"{tool_name!r} is not one of the agent's tools"
            continue
        if tool.effect != ToolEffect.WRITE:
            errors[where] = f"{tool_name} is a read tool: limits are for write tools"
            continue
        if not isinstance(limits, list) or not limits:
            errors[where] = 'a list of limits, e.g. [{"window": "24h", "per": "customer", "max_amount": "30.00", "over": "operator"}]'
            continue
        clean[tool_name] = [c for index, limit in enumerate(limits)
                            if (c := _limit_check(tool, limit, f"{where}[{index}]", errors)) is not None]
    return clean


def _limit_check(tool: Tool, limit: Any, where: str, errors: dict[str, str]) -> dict | None:
    if not isinstance(limit, dict) or set(limit) - LIMIT_KEYS:
        errors[where] = f"each limit is an object of {', '.join(sorted(LIMIT_KEYS))}"
        return None
    arguments = set(tool.argument_fields())
    clean: dict[str, Any] = {}
    window = limit.get("window")
    if not isinstance(window, str) or not WINDOW.match(window) or window_of(window) > MAX_WINDOW:
        errors[f"{where}.window"] = 'a rolling window such as "15m", "1h", "24h" or "30d", at most 90 days'
    else:
        clean["window"] = window
    per = limit.get("per", "customer")
    if per not in SCOPES_BUILT_IN and per not in arguments:
        errors[f"{where}.per"] = (f"{per!r} is neither customer, agent nor an argument of {tool.name}; its arguments: "
                                  f"{', '.join(sorted(arguments))}")
    else:
        clean["per"] = per
    if "max_amount" not in limit and "max_count" not in limit:
        errors[where] = "a limit needs max_amount, max_count or both"
        return None
    if "max_amount" in limit:
        if tool.amount is None:
            errors[f"{where}.max_amount"] = (f"{tool.name} declares no amount argument (Tool.amount), so its calls "
                                             "have no amount to add up; use max_count")
        else:
            try:
                amount = Decimal(str(limit["max_amount"]))
                if not amount.is_finite() or amount <= 0 or amount != amount.quantize(Decimal("0.01")):
                    raise InvalidOperation
                clean["max_amount"] = str(amount.quantize(Decimal("0.01")))
            except (InvalidOperation, ValueError):
                errors[f"{where}.max_amount"] = 'a positive amount with at most two decimals, e.g. "30.00"'
    if "max_count" in limit:
        count = limit["max_count"]
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 100_000:
            errors[f"{where}.max_count"] = "a whole number from 1 to 100000"
        else:
            clean["max_count"] = count
    currency = limit.get("currency")
    if currency is None:
        if "max_amount" in limit and tool.amount is not None and tool.currency is None:
            errors[f"{where}.currency"] = (f"{tool.name}'s currency is its argument {tool.currency_argument!r}: "
                                           "say which currency this limit adds up, e.g. \"EUR\"")
        elif tool.currency is not None:
            clean["currency"] = tool.currency
    elif not isinstance(currency, str) or not re.fullmatch(r"[A-Z]{3}", currency):
        errors[f"{where}.currency"] = 'a three-letter currency code, e.g. "EUR"'
    elif tool.currency is not None and currency != tool.currency:
        errors[f"{where}.currency"] = f"{tool.name} moves {tool.currency} only"
    else:
        clean["currency"] = currency
    over = limit.get("over", ApprovalRequirement.OPERATOR)
    if over not in OVER:
        errors[f"{where}.over"] = f"one of {', '.join(OVER)}"
    else:
        clean["over"] = over
    approvers = limit.get("approvers", 1)
    if not isinstance(approvers, int) or isinstance(approvers, bool) or not 1 <= approvers <= MAX_APPROVERS:
        errors[f"{where}.approvers"] = f"a whole number from 1 to {MAX_APPROVERS}"
    elif approvers > 1 and over != ApprovalRequirement.OPERATOR:
        errors[f"{where}.approvers"] = "only operator approval can ask for several approvers"
    else:
        clean["approvers"] = approvers
    return clean if not any(key.startswith(where) for key in errors) else None


# --- at run time ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scope:
    """What one limit adds up: the tool's calls in `since`.. now of one customer, one agent or one
    counterparty (an argument's value), in `currency` (None: every call, for counts)."""

    tool: str
    per: str
    value: str
    currency: str | None

    def lock_key(self) -> str:
        return f"limit:{self.tool}:{self.per}:{self.value}:{self.currency or '*'}"


@dataclass
class Crossed:
    limit: dict
    scope: Scope
    total: Decimal
    count: int

    def describe(self, tool: Tool) -> str:
        window = self.limit["window"]
        who = {"customer": "this customer", "agent": "this agent"}.get(self.limit["per"], f"{self.limit['per']} {self.scope.value}")
        parts = []
        if "max_amount" in self.limit:
            parts.append(f"{self.total} {self.scope.currency or ''} of {self.limit['max_amount']}".replace("  ", " "))
        if "max_count" in self.limit:
            parts.append(f"{self.count} calls of {self.limit['max_count']}")
        return f"{tool.name} by {who} in {window}, with this call: {' and '.join(parts)}"


@dataclass
class LimitVerdict:
    """What the limits say of one call: nothing (within them), a tier, or a refusal — and the
    windows' totals, which the approval shows."""

    crossed: list[Crossed] = field(default_factory=list)
    totals: list[dict] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return any(c.limit["over"] == REFUSE for c in self.crossed)

    def tier(self) -> tuple[str, int]:
        asked = [c.limit for c in self.crossed if c.limit["over"] != REFUSE]
        if not asked:
            return ApprovalRequirement.NONE, 1
        strictest = max(asked, key=lambda limit: (TIER_ORDER[limit["over"]], limit.get("approvers", 1)))
        return strictest["over"], strictest.get("approvers", 1) if strictest["over"] == ApprovalRequirement.OPERATOR else 1

    def guard(self, tool: Tool) -> dict:
        """What a write records of this verdict (`ToolCall.guard`): the refusal, with the totals, or
        the totals, the limits crossed and the tier they ask for."""
        over = [crossed.describe(tool) for crossed in self.crossed]
        if self.refused:
            return {"refused": {"code": "limit_refused", "detail": "over the agent's limit: " + "; ".join(over)},
                    "totals": self.totals}
        approval, approvers = self.tier()
        return {"totals": self.totals, "over": over, "approval": approval, "approvers": approvers}


def limit_scopes(*, tool: Tool, limits: list[dict], arguments: dict, customer_id, agent_id) -> list[Scope]:
    """The scope each of the tool's limits adds up for this call (in the limits' order)."""
    _, currency = tool.money_of(arguments)
    scopes = []
    for limit in limits:
        per = limit["per"]
        value = {"customer": customer_id, "agent": agent_id}.get(per, arguments.get(per))
        scopes.append(Scope(tool=tool.name, per=per, value=str(value), currency=limit.get("currency") or currency))
    return scopes


def limit_verdict(*, tool: Tool, limits: list[dict], scopes: list[Scope], arguments: dict, spent) -> LimitVerdict:
    """The limits' verdict on a call, given `spent(scope, since) -> (total, count)` of the calls
    before it (the caller holds the scopes' locks)."""
    verdict = LimitVerdict()
    amount, currency = tool.money_of(arguments)
    now = timezone.now()
    for limit, scope in zip(limits, scopes):
        if "max_amount" in limit and scope.currency != currency:
            continue  # a limit in another currency does not count this call
        total, count = spent(scope, now - window_of(limit["window"]))
        total, count = total + (amount or 0), count + 1
        verdict.totals.append({"window": limit["window"], "per": limit["per"], "value": scope.value,
                               "currency": scope.currency, "total": str(total), "count": count,
                               "max_amount": limit.get("max_amount"), "max_count": limit.get("max_count")})
        over_amount = "max_amount" in limit and total > Decimal(limit["max_amount"])
        over_count = "max_count" in limit and count > limit["max_count"]
        if over_amount or over_count:
            verdict.crossed.append(Crossed(limit=limit, scope=scope, total=total, count=count))
    return verdict
