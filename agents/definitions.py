"""What an agent definition may say, and what its approval rules mean (docs/EXTENDING.md).

An agent is the deployment's own: instructions, a model provider or a model endpoint (which implies
the provider) and a model, the tools it may use, default and maximum budgets, approval rules and the
classifier of interjections. Every save of a definition becomes a new immutable AgentVersion, and a
run keeps the version it started with.

`agent_definition_check` refuses a definition that names an unknown tool, provider or model
endpoint (its own or its fallback), or a model its endpoint does not offer, whose rules do not parse, or one of whose rules
can never apply (an earlier rule already covers every argument it would match: first match wins) —
naming the field, so the admin and the API can say where. `approval_rule_match` is the run-time's evaluation of the rules on a call's validated
arguments: the first rule whose condition holds decides who must approve, and why."""

import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.utils.text import slugify

from agents.errors import AgentRefusal
from agents.limits import limits_check, write_caps_check
from agents.service_levels import service_levels_check
from config.errors import WardenError
from runs_app.endpoints import (ENDPOINT_OPTION, ENDPOINT_PROVIDERS, endpoint_get, endpoint_model_names, endpoint_names,
                                 endpoint_provider)
from runs_app.models import EndpointKind, ModelEndpoint
from tools_app.mcp import TOOL_OPTIONS, mcp_schema_problem, mcp_tool_build, mcp_tool_properties
from tools_app.models import McpServer, McpTransport, ToolEffect
from tools_app.registry import ASK_USER, ApprovalRequirement, tool_get, tool_list, tool_registered, tools_in_scope

# Providers that only speak a model endpoint of their kind: the deployment's default endpoint (the
# OPENAI_* settings) speaks Chat Completions, so an agent naming one of these must name an endpoint.
_ENDPOINT_ONLY_PROVIDERS = {provider: EndpointKind(kind).label for kind, provider in ENDPOINT_PROVIDERS.items()
                            if kind != EndpointKind.CHAT_COMPLETIONS}

# Who a rule asks: nobody (the call runs at once), the session's user, or operators.
APPROVALS = (ApprovalRequirement.NONE, ApprovalRequirement.USER, ApprovalRequirement.OPERATOR)
MAX_APPROVERS = 5
# How interjections (input arriving while a run works) are classified: by the agent's model, or
# by the run-time's keyword rules (no model call).
CLASSIFIERS = ("model", "keywords")
BUDGET_FIELDS = ("max_model_calls", "max_tokens", "deadline_seconds")
ALWAYS = "always"


class AgentDefinitionInvalid(WardenError):
    """`errors` maps each offending field (`tools`, `approval_rules.execute_refund[2].when`, …) to
    what is wrong with it; nothing was saved."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__(
            AgentRefusal.INVALID_AGENT,
            "The agent definition was refused, nothing was saved: "
            + "; ".join(f"{field}: {message}" for field, message in errors.items()),
            fields=[{"field": f"body.{field}", "message": message, "type": AgentRefusal.INVALID_AGENT.value}
                    for field, message in errors.items()],
        )


# --- conditions ---------------------------------------------------------------------------------

_COMPARISON = re.compile(r"""^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|==|!=|<|>)\s*("(?:[^"\\]|\\.)*"|'[^']*'|[-+]?\d+(?:\.\d+)?)\s*$""")
_AND = re.compile(r"\s+and\s+", re.IGNORECASE)


@dataclass(frozen=True)
class Comparison:
    field: str
    op: str
    value: Any  # Decimal for numbers, str for quoted text

    def holds(self, actual: Any) -> bool:
        if isinstance(self.value, Decimal):
            try:
                actual = Decimal(str(actual))
            except (InvalidOperation, ValueError):
                return False
        elif not isinstance(actual, str):
            actual = "" if actual is None else str(actual)
        if self.op in ("==", "!="):
            return (actual == self.value) == (self.op == "==")
        if isinstance(self.value, str):
            return False
        return {"<": actual < self.value, "<=": actual <= self.value, ">": actual > self.value, ">=": actual >= self.value}[self.op]

    def __str__(self) -> str:
        shown = f'"{self.value}"' if isinstance(self.value, str) else str(self.value)
        return f"{self.field} {self.op} {shown}"


def condition_parse(text: str) -> tuple[Comparison, ...]:
    """`amount <= 20`, `amount > 500 and reason == "fraud"`, or `always`. ValueError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError('a condition is required, e.g. "amount <= 20" (or "always")')
    if text.strip().lower() == ALWAYS:
        return ()
    comparisons = []
    for part in _AND.split(text.strip()):
        match = _COMPARISON.match(part)
        if not match:
            raise ValueError(f'cannot read {part.strip()!r}: write <argument> <op> <number or "text">, ops < <= > >= == !=, '
                             'joined by "and"')
        field, op, literal = match.groups()
        if literal[0] in "\"'":
            value: Any = literal[1:-1]
            if op not in ("==", "!="):
                raise ValueError(f"{part.strip()!r}: text can only be compared with == or !=")
        else:
            value = Decimal(literal)
        comparisons.append(Comparison(field=field, op=op, value=value))
    return tuple(comparisons)


# --- coverage: is a rule reachable at all? ------------------------------------------------------

@dataclass(frozen=True)
class _Interval:
    low: Decimal | None = None  # None: unbounded
    low_closed: bool = False
    high: Decimal | None = None
    high_closed: bool = False

    def empty(self) -> bool:
        if self.low is None or self.high is None:
            return False
        return self.low > self.high or (self.low == self.high and not (self.low_closed and self.high_closed))

    def narrowed(self, op: str, value: Decimal) -> "_Interval":
        low, low_closed, high, high_closed = self.low, self.low_closed, self.high, self.high_closed
        if op in (">", ">=", "=="):
            closed = op != ">"
            if low is None or value > low or (value == low and not closed):
                low, low_closed = value, closed
        if op in ("<", "<=", "=="):
            closed = op != "<"
            if high is None or value < high or (value == high and not closed):
                high, high_closed = value, closed
        return _Interval(low, low_closed, high, high_closed)


def _box(comparisons: tuple[Comparison, ...]) -> tuple[dict[str, _Interval], dict[str, tuple], bool] | None:
    """The region a condition matches: an interval per numeric argument, the exact text
    comparisons per text argument, and whether it is simple enough to reason about (numbers and
    `==` text only). None when it can match nothing."""
    intervals: dict[str, _Interval] = {}
    texts: dict[str, tuple] = {}
    simple = True
    for c in comparisons:
        if isinstance(c.value, Decimal):
            if c.op == "!=":
                simple = False
                continue
            intervals[c.field] = intervals.get(c.field, _Interval()).narrowed(c.op, c.value)
        else:
            texts[c.field] = tuple(sorted({*texts.get(c.field, ()), (c.op, c.value)}))
            if c.op == "!=":
                simple = False
    if any(interval.empty() for interval in intervals.values()):
        return None
    for field, wanted in texts.items():
        equal = {v for op, v in wanted if op == "=="}
        if len(equal) > 1 or any(op == "!=" and v in equal for op, v in wanted):
            return None
    return intervals, texts, simple


def _interval_covered(target: _Interval, earlier: list[_Interval]) -> bool:
    """Whether the union of `earlier` contains `target` (a sweep from target's low end)."""
    point, point_closed = target.low, target.low_closed  # the first value still to be covered
    pending = list(earlier)
    while True:
        progressed = False
        for interval in pending:
            starts_before = interval.low is None or (point is not None and (
                interval.low < point or (interval.low == point and (interval.low_closed or not point_closed))))
            if not starts_before:
                continue
            # The interval covers from `point` up to its high end; does that get further?
            if interval.high is None:
                return True
            if point is None or interval.high > point or (interval.high == point and interval.high_closed and point_closed):
                point, point_closed = interval.high, not interval.high_closed
                pending.remove(interval)
                progressed = True
                break
        if target.high is not None and point is not None and (
                point > target.high or (point == target.high and (not point_closed or not target.high_closed))):
            return True
        if not progressed:
            return False


def _shadowed_by(target, earlier_boxes) -> bool:
    """Whether every argument set `target` matches is already matched by an earlier rule."""
    intervals, texts, _ = target
    # A single earlier rule containing it outright.
    for e_intervals, e_texts, e_simple in earlier_boxes:
        if not e_simple:
            continue
        if all(f in intervals and _contains(e_intervals[f], intervals[f]) for f in e_intervals) and all(
                texts.get(f) == wanted for f, wanted in e_texts.items()):
            return True
    # Several earlier rules on the same single number covering it together (`always` after
    # `amount <= 20` and `amount > 20` too).
    if not texts and len(intervals) <= 1:
        single = [e for e in earlier_boxes if e[2] and not e[1] and len(e[0]) == 1]
        for field in set(intervals) or {f for e in single for f in e[0]}:
            same = [e[0][field] for e in single if field in e[0]]
            if _interval_covered(intervals.get(field, _Interval()), same):
                return True
    return False


def _contains(outer: _Interval, inner: _Interval) -> bool:
    if outer.low is not None:
        if inner.low is None or inner.low < outer.low or (inner.low == outer.low and inner.low_closed and not outer.low_closed):
            return False
    if outer.high is not None:
        if inner.high is None or inner.high > outer.high or (inner.high == outer.high and inner.high_closed and not outer.high_closed):
            return False
    return True


# --- rules ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ApprovalRule:
    when: str
    approval: str
    approvers: int = 1

    def describe(self) -> str:
        who = {ApprovalRequirement.NONE: "no approval", ApprovalRequirement.USER: "the session's user"}.get(
            self.approval, f"{self.approvers} distinct operators" if self.approvers > 1 else "an operator")
        return f"{self.when} → {who}"


@dataclass(frozen=True)
class RuleMatch:
    """Who must approve a call, the rule that said so (`tool[index]: condition → who`) and why."""

    approval: str
    approvers: int
    rule: str
    reason: str


def _rules_check(*, tool_name: str, rules: Any, errors: dict[str, str]) -> None:
    where = f"approval_rules.{tool_name}"
    tool = tool_get(tool_name)
    if tool is None:
        errors[where] = f"unknown tool {tool_name!r}: rules are for the agent's own tools"
        return
    if tool.effect != ToolEffect.WRITE:
        errors[where] = f"{tool_name} is a read tool: only write tools ask for approval"
        return
    if not isinstance(rules, list) or not rules:
        errors[where] = 'a list of rules is required, e.g. [{"when": "amount <= 20", "approval": "none"}]'
        return
    arguments = set(tool.argument_fields())
    boxes = []
    for index, rule in enumerate(rules):
        here = f"{where}[{index}]"
        if not isinstance(rule, dict) or set(rule) - {"when", "approval", "approvers"}:
            errors[here] = 'each rule is {"when": "<condition>", "approval": "none|user|operator", "approvers": N}'
            continue
        try:
            comparisons = condition_parse(rule.get("when"))
        except ValueError as error:
            errors[f"{here}.when"] = str(error)
            continue
        unknown = sorted({c.field for c in comparisons} - arguments)
        if unknown:
            errors[f"{here}.when"] = (f"{tool_name} has no argument {', '.join(map(repr, unknown))}; its arguments: "
                                      f"{', '.join(sorted(arguments))}")
            continue
        if rule.get("approval") not in APPROVALS:
            errors[f"{here}.approval"] = f"must be one of {', '.join(APPROVALS)}, not {rule.get('approval')!r}"
            continue
        approvers = rule.get("approvers", 1)
        if not isinstance(approvers, int) or isinstance(approvers, bool) or not 1 <= approvers <= MAX_APPROVERS:
            errors[f"{here}.approvers"] = f"a whole number from 1 to {MAX_APPROVERS}"
            continue
        if approvers > 1 and rule["approval"] != ApprovalRequirement.OPERATOR:
            errors[f"{here}.approvers"] = "only operator approval can ask for several approvers"
            continue
        box = _box(comparisons)
        if box is None:
            errors[f"{here}.when"] = f"{rule['when']!r} can never hold"
            continue
        if _shadowed_by(box, boxes):
            errors[f"{here}.when"] = (f"{rule['when']!r} overlaps the rules before it: they already cover every call it "
                                      "would match (first match wins), so it could never apply")
            continue
        boxes.append(box)


def rules_from(stored: list[dict]) -> list[ApprovalRule]:
    return [ApprovalRule(when=r["when"], approval=r["approval"], approvers=int(r.get("approvers", 1))) for r in stored]


def approval_rule_match(*, tool_name: str, rules: list[dict], arguments: dict) -> RuleMatch | None:
    """The first of `rules` (an agent version's, for this tool) whose condition holds for the
    call's validated `arguments`. With rules but no match the call is not let through: an
    operator decides (fail closed). None when the agent has no rules for the tool."""
    if not rules:
        return None
    for index, rule in enumerate(rules_from(rules)):
        comparisons = condition_parse(rule.when)
        if all(c.holds(arguments.get(c.field)) for c in comparisons):
            shown = ", ".join(f"{c.field} is {arguments.get(c.field)}" for c in comparisons) or "the rule always applies"
            return RuleMatch(approval=rule.approval, approvers=rule.approvers if rule.approval == ApprovalRequirement.OPERATOR else 1,
                             rule=f"{tool_name}[{index}]: {rule.describe()}", reason=f"{shown}; {rule.when}")
    return RuleMatch(approval=ApprovalRequirement.OPERATOR, approvers=1, rule=f"{tool_name}: no rule matched → an operator",
                     reason="no rule's condition held for these arguments, so an operator decides")


# --- the whole definition -------------------------------------------------------------------------

def agent_definition_check(definition: dict, *, mcp_tools: dict | None = None) -> dict:
    """The definition, normalised, or AgentDefinitionInvalid naming every offending field.
    `mcp_tools`: the snapshot of the MCP servers' tools the definition chose (engine.actions.agents
    takes it by asking the servers; None when it names none)."""
    errors: dict[str, str] = {}
    clean: dict[str, Any] = {}
    clean["mcp_servers"] = mcp_servers_check(definition.get("mcp_servers"), errors)
    clean["mcp_tools"] = _mcp_tools_check(mcp_tools or {}, errors)
    with tools_in_scope({name: mcp_tool_build(name, entry) for name, entry in clean["mcp_tools"].items()}):
        return _definition_check(definition, clean=clean, errors=errors)


def _definition_check(definition: dict, *, clean: dict, errors: dict[str, str]) -> dict:
    name = definition.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        errors["name"] = "a name of 1 to 100 characters is required"
    else:
        clean["name"] = name.strip()
    slug = definition.get("slug") or (slugify(name) if isinstance(name, str) else "")
    if not isinstance(slug, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", slug):
        errors["slug"] = "lowercase letters, digits and hyphens, at most 64"
    else:
        clean["slug"] = slug
    instructions = definition.get("instructions")
    if not isinstance(instructions, str) or not instructions.strip():
        errors["instructions"] = "the system prompt the model gets is required"
    elif len(instructions) > 20_000:
        errors["instructions"] = "at most 20000 characters"
    else:
        clean["instructions"] = instructions.strip()
    endpoint = _endpoint_check(definition.get("endpoint") or "", errors)
    clean["endpoint"] = endpoint.name if endpoint is not None else ""
    # The provider that speaks the endpoint: its kind's, or the one a `custom` endpoint names.
    speaks = endpoint_provider(kind=endpoint.kind, provider=endpoint.provider) if endpoint is not None else ""
    provider = definition.get("provider") or (speaks if endpoint is not None else settings.WARDEN_MODEL_PROVIDER)
    if endpoint is not None and speaks not in settings.WARDEN_PROVIDERS:
        errors["endpoint"] = (f"endpoint {endpoint.name!r} is called by provider {speaks!r}, which is not configured "
                              f"(WARDEN_PROVIDERS: {', '.join(sorted(settings.WARDEN_PROVIDERS))}): fix the "
                              "endpoint's provider in the desk, or configure it")
    elif provider not in settings.WARDEN_PROVIDERS:
        errors["provider"] = (f"unknown provider {provider!r}; configured (WARDEN_PROVIDERS): "
                              f"{', '.join(sorted(settings.WARDEN_PROVIDERS))}")
    elif endpoint is not None and provider != speaks:
        errors["provider"] = (f"endpoint {endpoint.name!r} speaks {endpoint.get_kind_display()}: its provider is "
                              f"{speaks!r} (or leave the provider blank)")
    elif endpoint is None and provider in _ENDPOINT_ONLY_PROVIDERS:
        errors["provider"] = (f"provider {provider!r} calls a model endpoint of kind "
                              f"{_ENDPOINT_ONLY_PROVIDERS[provider]}: name one (`endpoint`) with one of its models")
    else:
        clean["provider"] = provider
    model = definition.get("model") or ""
    if not isinstance(model, str) or len(model) > 100:
        errors["model"] = "a model name of at most 100 characters"
    else:
        clean["model"] = model.strip()
        if endpoint is not None and clean["model"] not in (offered := endpoint_model_names(endpoint)):
            errors["model"] = (f"{clean['model']!r} is not a model endpoint {endpoint.name!r} offers" if clean["model"] else
                               f"endpoint {endpoint.name!r} needs one of its models") + f"; it offers: {', '.join(offered) or 'none yet'}"
    _fallback_check(definition, endpoint=endpoint, clean=clean, errors=errors)
    options = definition.get("provider_options") or {}
    if not isinstance(options, dict):
        errors["provider_options"] = "a JSON object"
    elif ENDPOINT_OPTION in options:
        errors["provider_options"] = f"{ENDPOINT_OPTION!r} is the agent's own field, not a provider option"
    elif "\\u0000" in json.dumps(options, default=str):
        errors["provider_options"] = "must not contain NUL characters"
    else:
        clean["provider_options"] = options
    tools = definition.get("tools")
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        errors["tools"] = "a list of tool names"
    else:
        unknown = [t for t in tools if tool_registered(t) is None]
        if unknown:
            registered = sorted(t.name for t in tool_list() if t.name != ASK_USER)
            errors["tools"] = (f"unknown tool {', '.join(map(repr, unknown))}; registered (WARDEN_TOOL_MODULES): "
                               f"{', '.join(registered) or 'none'}")
        else:
            clean["tools"] = list(dict.fromkeys(t for t in tools if t != ASK_USER))
    # The tools rules and limits may name: the agent's own and the MCP tools it chose.
    chosen = [*clean["tools"], *clean["mcp_tools"]] if "tools" in clean else None
    for field in ("budgets", "budget_limits"):
        value = definition.get(field) or {}
        if not isinstance(value, dict) or set(value) - set(BUDGET_FIELDS) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value.values()):
            errors[field] = f"an object of positive whole numbers: {', '.join(BUDGET_FIELDS)}"
        else:
            clean[field] = value
    if "budgets" in clean and "budget_limits" in clean:
        over = [f for f, v in clean["budgets"].items() if f in clean["budget_limits"] and v > clean["budget_limits"][f]]
        if over:
            errors["budgets"] = f"{', '.join(over)} above the agent's own maximum (budget_limits)"
    rules = definition.get("approval_rules") or {}
    if not isinstance(rules, dict):
        errors["approval_rules"] = 'an object {"<write tool>": [rules…]}'
    else:
        for tool_name, tool_rules in rules.items():
            if chosen is not None and tool_name not in chosen:
                errors[f"approval_rules.{tool_name}"] = f"{tool_name!r} is not one of the agent's tools"
                continue
            _rules_check(tool_name=tool_name, rules=tool_rules, errors=errors)
        clean["approval_rules"] = rules
    clean["write_caps"] = write_caps_check(definition.get("write_caps"), errors)
    clean["limits"] = limits_check(definition.get("limits"), tools=chosen, errors=errors)
    clean["approval_service_levels"] = service_levels_check(definition.get("approval_service_levels"), errors)
    classifier = definition.get("interjection_classifier") or "model"
    if classifier not in CLASSIFIERS:
        errors["interjection_classifier"] = f"one of {', '.join(CLASSIFIERS)}"
    else:
        clean["interjection_classifier"] = classifier
    if errors:
        raise AgentDefinitionInvalid(errors)
    return clean


# --- MCP servers ----------------------------------------------------------------------------------

MCP_MAX_TIMEOUT = 600
_MCP_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def mcp_servers_check(value: Any, errors: dict[str, str]) -> dict:
    """`{"<server>": {"tools": ["refund", …], "options": {"refund": {…}}}}`: each server defined (the
    desk's MCP servers), a stdio one only where the deployment allows them, the tools chosen by name
    and each tool's options of the known kinds (what the server said is checked with the snapshot)."""
    if value in (None, "", {}):
        return {}
    if not isinstance(value, dict):
        errors["mcp_servers"] = 'an object {"<server>": {"tools": ["<tool>", …], "options": {…}}}'
        return {}
    clean: dict[str, dict] = {}
    defined = {server.name: server for server in McpServer.objects.filter(name__in=[str(k) for k in value])}
    for name, spec in value.items():
        where = f"mcp_servers.{name}"
        server = defined.get(name)
        if server is None:
            errors[where] = f"no MCP server {name!r} is defined (the desk's MCP servers)"
            continue
        if server.transport == McpTransport.STDIO and not settings.WARDEN_MCP_STDIO:
            errors[where] = f"{name} is a local command, and this deployment does not allow those (WARDEN_MCP_STDIO)"
            continue
        if not isinstance(spec, dict) or set(spec) - {"tools", "options"}:
            errors[where] = 'an object {"tools": ["<tool>", …], "options": {"<tool>": {…}}}'
            continue
        tools = spec.get("tools")
        if (not isinstance(tools, list) or not tools
                or not all(isinstance(t, str) and _MCP_TOOL_NAME.fullmatch(t) for t in tools)):
            errors[f"{where}.tools"] = "a list of the server's tool names (letters, digits, _ and -), at least one"
            continue
        options = spec.get("options") or {}
        if not isinstance(options, dict):
            errors[f"{where}.options"] = 'an object {"<tool>": {"reconciler": "<tool>", "timeout": 10, …}}'
            continue
        clean_options = {}
        for tool_name, tool_options in options.items():
            here = f"{where}.options.{tool_name}"
            if tool_name not in tools:
                errors[here] = f"{tool_name!r} is not one of the tools chosen from {name}"
            elif (problem := _mcp_options_problem(tool_options)):
                errors[here] = problem
            else:
                clean_options[tool_name] = tool_options
        clean[name] = {"tools": list(dict.fromkeys(tools)), "options": clean_options}
    return clean


def _mcp_options_problem(options: Any) -> str:
    if not isinstance(options, dict) or set(options) - set(TOOL_OPTIONS):
        return f"an object of: {', '.join(TOOL_OPTIONS)}"
    if "effect" in options and options["effect"] not in ToolEffect.values:
        return "effect is read or write"
    if "approval" in options and options["approval"] not in APPROVALS:
        return f"approval is one of {', '.join(APPROVALS)}"
    timeout = options.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout <= MCP_MAX_TIMEOUT):
        return f"timeout is a number of seconds above 0, at most {MCP_MAX_TIMEOUT}"
    attempts = options.get("max_attempts")
    if attempts is not None and (isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 10):
        return "max_attempts is a whole number from 1 to 10"
    key = options.get("business_key")
    if key is not None and not (isinstance(key, str) and key) and not (
            isinstance(key, list) and key and all(isinstance(k, str) and k for k in key)):
        return "business_key names the argument (or a list of arguments) whose values make the key"
    for field in ("reconciler", "amount", "currency", "currency_argument", "counterparty", "reference", "summary"):
        if field in options and not (isinstance(options[field], str) and options[field].strip()):
            return f"{field} is a non-empty text"
    currency = options.get("currency")
    if currency is not None and not (len(currency) == 3 and currency.isalpha() and currency.isupper()):
        return 'currency is a three-letter code such as "EUR"'
    if currency is not None and options.get("currency_argument") is not None:
        return "a fixed currency or a currency argument, not both"
    return ""


def _mcp_tools_check(snapshot: dict, errors: dict[str, str]) -> dict:
    """The snapshot's tools as the model will see them: no name taken twice (the deployment's own
    tools, ask_user, another server's), a usable schema, and every argument the options declare
    among the schema's."""
    clean: dict[str, dict] = {}
    for name, entry in snapshot.items():
        where = f"mcp_servers.{entry['server']}.tools"
        if tool_registered(name) is not None:
            errors[where] = f"{name!r} is also the name of one of the deployment's own tools: choose one or the other"
            continue
        if name in clean:
            errors[where] = f"{name!r} is offered by {clean[name]['server']} too: choose it from one server"
            continue
        if problem := mcp_schema_problem(entry.get("input_schema")):
            errors[where] = f"{name}: {problem}"
            continue
        options = entry.get("options") or {}
        names = set(mcp_tool_properties(entry))
        key = options.get("business_key")
        declared = [options.get(f) for f in ("amount", "currency_argument", "counterparty", "reference")]
        declared += [key] if isinstance(key, str) else list(key or [])
        missing = [d for d in declared if d is not None and d not in names]
        if missing:
            errors[f"mcp_servers.{entry['server']}.options.{name}"] = (
                f"{', '.join(map(repr, missing))} is not one of {name}'s arguments ({', '.join(sorted(names)) or 'none'})")
            continue
        clean[name] = entry
    return clean


def _endpoint_check(name: Any, errors: dict[str, str]) -> ModelEndpoint | None:
    if not name:
        return None
    endpoint = endpoint_get(name=name) if isinstance(name, str) else None
    if endpoint is None:
        errors["endpoint"] = (f"unknown model endpoint {name!r}; defined (the desk's Model endpoints): "
                              f"{', '.join(endpoint_names()) or 'none'}")
    return endpoint


def _fallback_check(definition: dict, *, endpoint: ModelEndpoint | None, clean: dict, errors: dict[str, str]) -> None:
    """`fallback_endpoint` and `fallback_model`: where the agent's model calls go when its endpoint
    fails with a transient error (engine/model_route.py) — an endpoint that exists, speaks a configured
    provider and offers the model, and is not the agent's own endpoint and model again."""
    name, model = definition.get("fallback_endpoint") or "", definition.get("fallback_model") or ""
    clean["fallback_endpoint"], clean["fallback_model"] = "", ""
    if not isinstance(model, str) or len(model) > 100:
        errors["fallback_model"] = "a model name of at most 100 characters"
        return
    model = model.strip()
    if not name:
        if model:
            errors["fallback_model"] = "a fallback model needs the fallback_endpoint that offers it"
        return
    fallback = endpoint_get(name=name) if isinstance(name, str) else None
    if fallback is None:
        errors["fallback_endpoint"] = (f"unknown model endpoint {name!r}; defined (the desk's Model endpoints): "
                                       f"{', '.join(endpoint_names()) or 'none'}")
        return
    if endpoint is None:
        if "endpoint" not in errors:
            errors["fallback_endpoint"] = "a fallback backs up the agent's own endpoint: name an `endpoint` too"
        return
    provider = endpoint_provider(kind=fallback.kind, provider=fallback.provider)
    if provider not in settings.WARDEN_PROVIDERS:
        errors["fallback_endpoint"] = (f"endpoint {fallback.name!r} speaks {fallback.get_kind_display()}, which no "
                                       "configured provider (WARDEN_PROVIDERS) speaks")
        return
    offered = endpoint_model_names(fallback)
    if model not in offered:
        errors["fallback_model"] = (f"{model!r} is not a model endpoint {fallback.name!r} offers" if model else
                                    f"fallback endpoint {fallback.name!r} needs one of its models") + \
            f"; it offers: {', '.join(offered) or 'none yet'}"
        return
    if fallback.pk == endpoint.pk and model == clean.get("model"):
        errors["fallback_model"] = "the fallback is the agent's own endpoint and model: name another model or endpoint"
        return
    clean["fallback_endpoint"], clean["fallback_model"] = fallback.name, model


def approval_requirement(*, version, tool, arguments: dict) -> RuleMatch:
    """Who must approve a call of `tool` with these validated `arguments` in a run of agent
    `version` (None: a run without one): the agent's rules for the tool when it has any, else the
    tool's own declared policy (the rule then says so)."""
    rules = (version.approval_rules or {}).get(tool.name) if version is not None else None
    match = approval_rule_match(tool_name=tool.name, rules=rules, arguments=arguments) if rules else None
    return match or RuleMatch(approval=tool.approval, approvers=1, rule="", reason="")
