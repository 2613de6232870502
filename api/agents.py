"""Agents over HTTP (docs/EXTENDING.md): list and read them; define one or save a new version
(agents.change_agent), through engine.actions.agents.agent_save."""

from datetime import datetime

from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from api.errors import not_found
from access import policy as access
from agents.selectors import agent_get, agent_list
from api.base import BodyIn, COMMON_ERRORS, ShownJSON, StorableJSON, StorableText, errors
from engine.actions.agents import agent_save
from tools_app.mcp import mcp_effect

router = Router(tags=["agents"])

MCP_SERVERS_DESCRIPTION = ('{"<server>": {"tools": ["<tool>", …], "options": {"<tool>": {"reconciler": "<tool>", '
                           '"business_key": "<argument>", "approval": "none|user|operator", "timeout": N, …}}}}: '
                           "MCP servers (defined on the desk) and the tools chosen from each")


class McpToolOut(Schema):
    name: str = Field(description="the name the agent's model sees")
    server: str = Field(description="the MCP server it lives on")
    effect: str = Field(description="`read` when the server marks it readOnlyHint (or the agent says so), else `write`")
    description: str = Field(description="as the server described it when the version was saved")


class AgentVersionOut(Schema):
    number: int
    name: str
    instructions: str
    provider: str
    endpoint: str = Field(description="the model endpoint its runs call (by name); empty: the deployment's default")
    model: str
    fallback_endpoint: str = Field(description="the model endpoint its calls fall back to when `endpoint` fails with a "
                                               "transient error (by name); empty: none")
    fallback_model: str = Field(description="the model the fallback endpoint is asked for")
    provider_options: ShownJSON
    tools: list[str]
    budgets: ShownJSON = Field(description="defaults of a run's budgets: max_model_calls, max_tokens, deadline_seconds")
    budget_limits: ShownJSON = Field(description="the most a request may ask for (beside the deployment's caps)")
    approval_rules: ShownJSON = Field(description='{"<write tool>": [{"when": "amount <= 20", "approval": "none|user|operator", '
                                            '"approvers": N}, …]}: first match wins')
    interjection_classifier: str
    write_caps: ShownJSON = Field(description='{"per_turn": N, "per_run": N}: writes a model turn and a run may make '
                                        '(the deployment\'s defaults for what is left out)')
    limits: ShownJSON = Field(description='{"<write tool>": [{"window": "24h", "per": "customer|agent|<argument>", '
                                    '"max_amount": "30.00", "max_count": N, "currency": "EUR", '
                                    '"over": "operator|user|refuse", "approvers": N}, …]}')
    approval_service_levels: ShownJSON = Field(description='{"operator": {"notify": "<group>", "remind_after": "10m", '
                                                     '"escalate_after": "30m", "escalate_to": "<group>"}}: who is told '
                                                     'of a request, when they are reminded and when it escalates '
                                                     '(docs/NOTIFICATIONS.md)')
    mcp_servers: ShownJSON = Field(description=MCP_SERVERS_DESCRIPTION)
    mcp_tools: list[McpToolOut] = Field(description="the MCP tools this version keeps, as their servers described them "
                                                    "when it was saved (a server changing them later changes no version)")
    created_by: str | None
    created_at: datetime

    @staticmethod
    def resolve_endpoint(version) -> str:
        return version.endpoint.name if version.endpoint_id else ""

    @staticmethod
    def resolve_fallback_endpoint(version) -> str:
        return version.fallback_endpoint.name if version.fallback_endpoint_id else ""

    @staticmethod
    def resolve_mcp_tools(version) -> list[dict]:
        return [{"name": name, "server": entry.get("server", ""), "effect": str(mcp_effect(entry)),
                 "description": entry.get("description") or ""}
                for name, entry in sorted((version.mcp_tools or {}).items())]

    @staticmethod
    def resolve_created_by(version) -> str | None:
        return version.created_by.get_username() if version.created_by_id else None


class AgentOut(Schema):
    slug: str
    name: str
    version: AgentVersionOut = Field(description="the current version: what the next run uses")
    versions: list[int] = Field(description="every version's number, newest first")

    @staticmethod
    def resolve_version(agent):
        return agent.current_version

    @staticmethod
    def resolve_versions(agent) -> list[int]:
        return list(agent.versions.order_by("-number").values_list("number", flat=True))


class AgentIn(BodyIn):
    """An agent's whole definition; saving it makes a new version (runs under way keep theirs)."""

    model_config = ConfigDict(extra="forbid")

    slug: StorableText | None = Field(None, max_length=64, description="on create; derived from the name if left out")
    name: StorableText = Field(max_length=100)
    instructions: StorableText = Field(max_length=20_000)
    provider: StorableText | None = Field(None, max_length=32,
                                          description="a name in WARDEN_PROVIDERS; default WARDEN_MODEL_PROVIDER")
    endpoint: StorableText = Field("", max_length=64, description="a model endpoint's name (the desk's Model endpoints); "
                                                                 "the provider follows from it, the model must be one it offers")
    model: StorableText = Field("", max_length=100)
    fallback_endpoint: StorableText = Field("", max_length=64, description="a model endpoint the calls go to when "
                                                                          "`endpoint` fails with a transient error")
    fallback_model: StorableText = Field("", max_length=100, description="one the fallback endpoint offers")
    provider_options: StorableJSON = Field(default_factory=dict)
    tools: list[str] = Field(default_factory=list, description="registered tool names (WARDEN_TOOL_MODULES)")
    budgets: StorableJSON = Field(default_factory=dict)
    budget_limits: StorableJSON = Field(default_factory=dict)
    approval_rules: StorableJSON = Field(default_factory=dict)
    interjection_classifier: str = Field("model", description="`model` or `keywords`")
    write_caps: StorableJSON = Field(default_factory=dict)
    limits: StorableJSON = Field(default_factory=dict)
    approval_service_levels: StorableJSON = Field(default_factory=dict)
    mcp_servers: StorableJSON = Field(default_factory=dict, description=MCP_SERVERS_DESCRIPTION)


def _visible_agent(request, slug: str):
    agent = agent_get(slug=slug) if access.can_see_agents(user=request.auth) else None
    if agent is None:
        raise not_found("agent")
    return agent


def _agent_save(request, payload: AgentIn, agent=None):
    """A definition refused is answered 422 `invalid_agent` with its fields; a caller who may not
    define agents, 403 (engine.actions.agents.agent_save decides both)."""
    version = agent_save(definition=payload.model_dump(), acting_user=request.auth, agent=agent)
    return _visible_agent(request, version.agent.slug)


@router.get("", response={200: list[AgentOut], **errors(400, 401, 429)}, summary="List agents")
def agents_list(request):
    """The deployment's agents, to pick one for a new session (`POST /sessions {"agent": slug}`)."""
    return agent_list() if access.can_see_agents(user=request.auth) else []


@router.get("/{slug}", response={200: AgentOut, **COMMON_ERRORS}, summary="Agent detail")
def agents_get(request, slug: str):
    return _visible_agent(request, slug)


@router.post("", response={201: AgentOut, **COMMON_ERRORS, **errors(400, 403)}, summary="Define an agent")
def agents_create(request, payload: AgentIn):
    """Needs agents.change_agent. A definition naming an unknown tool or provider, rules that do
    not parse or a rule earlier rules already cover is refused (422 `invalid_agent`, `fields`
    naming each), and nothing is saved."""
    return Status(201, _agent_save(request, payload))


@router.put("/{slug}", response={200: AgentOut, **COMMON_ERRORS, **errors(400, 403)}, summary="Save a new version")
def agents_update(request, slug: str, payload: AgentIn):
    """The whole definition again: a new version, used by the agent's next runs; runs under way
    (and waiting ones) keep the version they started with."""
    return _agent_save(request, payload, agent=_visible_agent(request, slug))
