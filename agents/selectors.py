"""Reads about agents: the list to pick from, one by slug, the default for new sessions, and the
version a run runs with (kept per process: versions never change)."""

import functools
import re
import threading
import time
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db import connections
from django.utils import timezone

from agents.limits import limit_scopes, window_of
from agents.models import Agent, AgentVersion
from config.threads import off_the_event_loop
from sessions_app.selectors import session_customer
from tools_app.mcp import mcp_tool_build
from tools_app.registry import Tool, tool_get, tools_in_scope
from tools_app.selectors import writes_spent

AGENT_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


@functools.lru_cache(maxsize=512)
def agent_version_get(version_id: int) -> AgentVersion:
    """A version by id, kept per process: versions never change (the database refuses it), and a
    worker reads its run's on every model call and tool call."""
    return AgentVersion.objects.select_related("agent").get(pk=version_id)


def run_agent_version(run) -> AgentVersion | None:
    return agent_version_get(run.agent_version_id) if run.agent_version_id else None


def run_offered_tools(run) -> list[str] | None:
    """The tools the run's model may see and call (its agent version's own and MCP tools, besides
    ask_user); None: a run without an agent version, which is offered every registered tool."""
    version = run_agent_version(run)
    return [*version.tools, *(version.mcp_tools or {})] if version is not None else None


@functools.lru_cache(maxsize=512)
def version_mcp_tools(version_id: int) -> dict[str, Tool]:
    """A version's MCP tools, built from its snapshot (tools_app.mcp), kept per process: versions never change."""
    version = agent_version_get(version_id)
    return {name: mcp_tool_build(name, entry) for name, entry in (version.mcp_tools or {}).items()}


def run_tools_scope(run):
    """A context in which `tool_get` knows the run's MCP tools as its version snapshotted them."""
    return tools_in_scope(version_mcp_tools(run.agent_version_id) if run.agent_version_id else None)


def mcp_server_drift(*, server_name: str, tools_seen: list[dict]) -> list[dict]:
    """The agents whose current version snapshotted a tool of this server that the server now
    describes otherwise (or no longer offers): [{"agent", "version", "tools": {name: "changed"|"removed"}}]."""
    seen = {tool["name"]: tool for tool in tools_seen}
    drift = []
    for agent in Agent.objects.filter(current_version__isnull=False).select_related("current_version").order_by("slug"):
        version = agent.current_version
        changed = {}
        for name, entry in (version.mcp_tools or {}).items():
            if entry.get("server") != server_name:
                continue
            now = seen.get(entry.get("tool", name))
            if now is None:
                changed[name] = "removed"
            elif any(now.get(field) != entry.get(field) for field in ("description", "input_schema", "annotations")):
                changed[name] = "changed"
        if changed:
            drift.append({"agent": agent.slug, "version": version.number, "tools": changed})
    return drift


def run_tool(*, run, name: str) -> Tool | None:
    """A tool as a run knows it: the deployment's own, or one its version snapshotted from an MCP server."""
    with run_tools_scope(run):
        return tool_get(name)


# Outside a run (the desk, the console, the API showing a call): the latest version that chose an MCP
# tool of that name. Which version that is, for every name, is read in one query at most every
# _LATEST_SECONDS, so a page listing many calls costs no query per call; the tools found are kept
# with it, so a lookup asked from an event loop needs a thread only when it reads.
_LATEST_SECONDS = 30.0
_latest: dict = {"read_at": None, "versions": {}, "tools": {}}
_latest_lock = threading.Lock()


def mcp_tools_forget() -> None:
    """Read the map again at the next lookup (an agent version was saved in this process)."""
    with _latest_lock:
        _latest.update(read_at=None)


def mcp_tool_latest(name: str) -> Tool | None:
    """An MCP tool by name as the latest agent version that chose it describes it (None: none did)."""
    with _latest_lock:
        fresh = _latest["read_at"] is not None and time.monotonic() - _latest["read_at"] < _LATEST_SECONDS
        if fresh and name in _latest["tools"]:
            return _latest["tools"][name]
    return off_the_event_loop(_latest_read, name)


def _latest_read(name: str) -> Tool | None:
    now = time.monotonic()
    with _latest_lock:
        read_at, versions = _latest["read_at"], _latest["versions"]
    if read_at is None or now - read_at >= _LATEST_SECONDS:
        with connections["default"].cursor() as cursor:
            cursor.execute('SELECT k.tool, max(v."id") FROM "runs_app_agentversion" v, '
                           'jsonb_object_keys(v."mcp_tools") AS k(tool) GROUP BY k.tool')
            versions = dict(cursor.fetchall())
        with _latest_lock:
            _latest.update(read_at=now, versions=versions, tools={})
    version_id = versions.get(name)
    try:
        tool = version_mcp_tools(version_id).get(name) if version_id is not None else None
    except AgentVersion.DoesNotExist:  # versions are never deleted, but a test database is emptied
        mcp_tools_forget()
        return None
    with _latest_lock:
        _latest["tools"][name] = tool
    return tool


def agent_list() -> list[Agent]:
    """The agents that have a definition (everyone signed in may read them: access.can_see_agents)."""
    return list(Agent.objects.select_related("current_version__endpoint").filter(current_version__isnull=False)
                .order_by("name", "id"))


def agent_get(*, slug: str) -> Agent | None:
    if not AGENT_SLUG.fullmatch(slug or ""):
        return None
    return Agent.objects.select_related("current_version__endpoint").filter(slug=slug, current_version__isnull=False).first()


def agent_default() -> Agent | None:
    """The agent new sessions get when they name none (settings.WARDEN_DEFAULT_AGENT), if it exists."""
    slug = settings.WARDEN_DEFAULT_AGENT
    return Agent.objects.filter(slug=slug, current_version__isnull=False).first() if slug else None


def agent_current_version(*, agent_id) -> AgentVersion | None:
    """The version a new run of an agent's session uses: the agent's current one, read as the run
    starts (a run keeps it for good; an edit of the agent meanwhile is the next run's)."""
    if agent_id is None:
        return None
    return AgentVersion.objects.filter(pk=Agent.objects.filter(pk=agent_id).values("current_version_id")[:1]).first()


def agent_versions_of(*, slug: str):
    """Every version of the agent `slug` (none for an unknown slug), as a subquery: a filter of runs
    by agent reads the runs' agent_version index."""
    return AgentVersion.objects.filter(agent__slug=slug).values("pk")


def endpoint_agents() -> dict[int, list[str]]:
    """Each model endpoint's id → the slugs of the agents whose current version calls it, as their
    endpoint or their fallback (one query, for a list of endpoints)."""
    agents: dict[int, list[str]] = {}
    for slug, *endpoint_ids in (Agent.objects.filter(current_version__isnull=False).order_by("slug")
                                .values_list("slug", "current_version__endpoint_id", "current_version__fallback_endpoint_id")):
        for endpoint_id in dict.fromkeys(endpoint_ids):
            if endpoint_id is not None:
                agents.setdefault(endpoint_id, []).append(slug)
    return agents


def endpoint_models_in_use(*, endpoint_id) -> dict[str, list[str]]:
    """The models of a model endpoint that agents' current versions name — as their own or as their
    fallback — with those agents' slugs: what the endpoint must keep offering."""
    used: dict[str, list[str]] = {}
    for endpoint_field, model_field in (("endpoint_id", "model"), ("fallback_endpoint_id", "fallback_model")):
        for slug, model in (Agent.objects.filter(**{f"current_version__{endpoint_field}": endpoint_id}).order_by("slug")
                            .values_list("slug", f"current_version__{model_field}")):
            if slug not in used.get(model, []):
                used.setdefault(model, []).append(slug)
    return used



@dataclass(frozen=True)
class LimitWindow:
    """One of the agent's limits on a write's tool as its window stands now (agents.limits): the
    other calls in it, and the total with this call, against the limit — in the call's currency."""

    window: str
    per: str  # "customer", "agent" or the counterparty argument it adds up by
    value: str  # whose window: the customer's or agent's id, the counterparty argument's value
    currency: str | None
    others_total: Decimal
    others_count: int
    total: Decimal  # with this call
    count: int
    max_amount: str | None
    max_count: int | None
    over: str  # what crossing it asks for: refuse, user, operator

    @property
    def crossed(self) -> bool:
        return ((self.max_amount is not None and self.total > Decimal(self.max_amount))
                or (self.max_count is not None and self.count > self.max_count))


def tool_call_limit_windows(*, tool_call, now=None) -> list[LimitWindow]:
    """Each of the run's agent's limits on the call's tool, with its window's total and count now
    — counted as the run-time counts them (tools_app.selectors.writes_spent), the call itself
    added once — in the call's currency (a limit in another currency does not count it); empty for
    a run without an agent, or a tool the agent sets no limit on."""
    tool = tool_get(tool_call.tool_name)
    version = run_agent_version(tool_call.run)
    limits = ((version.limits or {}) if version is not None else {}).get(tool_call.tool_name)
    if tool is None or not limits:
        return []
    customer = session_customer(str(tool_call.run.session_id))
    scopes = limit_scopes(tool=tool, limits=limits, arguments=tool_call.arguments,
                          customer_id=customer.id if customer else None, agent_id=version.agent_id)
    amount, currency = tool.money_of(tool_call.arguments)
    now = now or timezone.now()
    windows = []
    for limit, scope in zip(limits, scopes):
        if "max_amount" in limit and scope.currency != currency:
            continue
        total, count = writes_spent(tool_name=tool.name, since=now - window_of(limit["window"]), per=scope.per,
                                    value=scope.value, amount_argument=tool.amount,
                                    currency_argument=tool.currency_argument, currency=scope.currency,
                                    exclude_pk=tool_call.pk)
        windows.append(LimitWindow(
            window=limit["window"], per=scope.per, value=scope.value, currency=scope.currency, others_total=total,
            others_count=count, total=total + (amount or 0), count=count + 1, max_amount=limit.get("max_amount"),
            max_count=limit.get("max_count"), over=limit.get("over", ""),
        ))
    return windows
