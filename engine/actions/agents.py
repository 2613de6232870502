"""Defining agents (docs/EXTENDING.md): every save of a definition, from the admin or the API, is
a new immutable version — checked first (agents.definitions.agent_definition_check: nothing is saved
when any field is wrong), then written with the agent's pointer to it and an audit entry naming
who, in one transaction. Runs keep the version they started with; the next run takes the new one."""

from django.db import transaction

from access import policy as access
from agents.definitions import AgentDefinitionInvalid, agent_definition_check, mcp_servers_check
from agents.errors import AgentRefusal
from agents.models import Agent, AgentVersion
from agents.selectors import mcp_tools_forget
from approvals_app.services import audit_record
from config.errors import WardenError
from engine.actions.mcp_servers import mcp_server_seen
from runs_app.models import ModelEndpoint
from tools_app.mcp import McpUnavailable, mcp_tools_list
from tools_app.models import McpServer

# The definition's fields as an AgentVersion stores them.
VERSION_FIELDS = ("name", "instructions", "provider", "model", "fallback_model", "provider_options", "tools", "budgets", "budget_limits",
                  "approval_rules", "interjection_classifier", "write_caps", "limits",
                  "approval_service_levels", "mcp_servers")
# The model endpoint, named in a definition and pointed at by a version (AgentVersion.endpoint), and
# the one its calls fall back to (AgentVersion.fallback_endpoint).
ENDPOINT_FIELD = "endpoint"
FALLBACK_FIELD = "fallback_endpoint"


def agent_definition_of(version: AgentVersion | None) -> dict:
    """A version as a definition (what the admin form and the API show, and a save may change)."""
    if version is None:
        return {}
    return {"slug": version.agent.slug, **{field: getattr(version, field) for field in VERSION_FIELDS},
            ENDPOINT_FIELD: version.endpoint.name if version.endpoint_id else "",
            FALLBACK_FIELD: version.fallback_endpoint.name if version.fallback_endpoint_id else ""}


def agent_save(*, definition: dict, acting_user, agent: Agent | None = None, mcp_tools: dict | None = None) -> AgentVersion:
    """Create the agent (without `agent`) or give it a new version. AgentDefinitionInvalid names
    every wrong field, a caller without agents.change_agent is refused (AgentRefusal.NOT_PERMITTED);
    in either case nothing is written. `mcp_tools`: the snapshot of the MCP servers' tools when the
    caller took it already (the desk's form, which checked it); otherwise the servers are asked now."""
    if not access.can_manage_agents(user=acting_user):
        raise WardenError(AgentRefusal.NOT_PERMITTED, "Defining agents needs the agents.change_agent permission.")
    if agent is not None:
        definition = {**definition, "slug": agent.slug}
    if mcp_tools is None:
        mcp_tools = mcp_snapshot_take(definition.get("mcp_servers"))
    clean = agent_definition_check(definition, mcp_tools=mcp_tools)
    with transaction.atomic():
        endpoint, fallback = (_endpoint_locked(clean, field) for field in (ENDPOINT_FIELD, FALLBACK_FIELD))
        if agent is None:
            if Agent.objects.filter(slug=clean["slug"]).exists():
                raise AgentDefinitionInvalid({"slug": f"an agent {clean['slug']!r} exists already"})
            agent = Agent.objects.create(slug=clean["slug"], name=clean["name"])
            before: dict = {}
        else:
            # Two saves at once: the row lock makes their version numbers consecutive, not equal.
            agent = Agent.objects.select_for_update().get(pk=agent.pk)
            before = {"version": agent.current_version.number if agent.current_version_id else None}
        number = (AgentVersion.objects.filter(agent=agent).order_by("-number").values_list("number", flat=True).first() or 0) + 1
        version = AgentVersion.objects.create(agent=agent, number=number, created_by=acting_user, endpoint=endpoint,
                                              fallback_endpoint=fallback, mcp_tools=clean["mcp_tools"],
                                              **{field: clean[field] for field in VERSION_FIELDS})
        agent.current_version = version
        agent.name = clean["name"]
        agent.save(update_fields=["current_version", "name", "updated_at"])
        transaction.on_commit(mcp_tools_forget)  # this process's map of MCP tools by name (agents.selectors)
        audit_record(actor=acting_user, action="define_agent", obj=agent, before=before,
                     after={"version": number, "tools": clean["tools"], "provider": clean["provider"], "model": clean["model"],
                            ENDPOINT_FIELD: clean[ENDPOINT_FIELD],
                            **({FALLBACK_FIELD: clean[FALLBACK_FIELD], "fallback_model": clean["fallback_model"]}
                               if clean[FALLBACK_FIELD] else {})})
    return version


def mcp_snapshot_take(mcp_servers) -> dict:
    """What the servers the definition names say of the tools it chose, by the name the model will
    see (AgentVersion.mcp_tools): asked now, so the version keeps it whatever the servers say later.
    A server that cannot be asked, or lacks a chosen tool or reconciler, refuses the save by field."""
    errors: dict[str, str] = {}
    servers = mcp_servers_check(mcp_servers, errors)
    if errors:
        raise AgentDefinitionInvalid(errors)
    snapshot: dict[str, dict] = {}
    for server in McpServer.objects.filter(name__in=list(servers)):
        chosen = servers[server.name]
        try:
            listed = {tool["name"]: tool for tool in mcp_tools_list(server)}
        except McpUnavailable as error:
            errors[f"mcp_servers.{server.name}"] = f"{error}; nothing was saved"
            continue
        mcp_server_seen(server=server, tools=list(listed.values()))
        missing = [name for name in chosen["tools"] if name not in listed]
        if missing:
            errors[f"mcp_servers.{server.name}.tools"] = (f"{server.name} offers no tool {', '.join(map(repr, missing))}; "
                                                          f"it offers: {', '.join(sorted(listed)) or 'none'}")
            continue
        for name in chosen["tools"]:
            if name in snapshot:
                errors[f"mcp_servers.{server.name}.tools"] = (f"{name!r} is offered by {snapshot[name]['server']} too: "
                                                              "choose it from one server")
                continue
            options = chosen["options"].get(name, {})
            reconciler = options.get("reconciler")
            if reconciler is not None and reconciler not in listed:
                errors[f"mcp_servers.{server.name}.options.{name}"] = (
                    f"the reconciler {reconciler!r} is not one of {server.name}'s tools")
                continue
            snapshot[name] = {"server": server.name, "tool": name, "description": listed[name]["description"],
                              "input_schema": listed[name]["input_schema"], "annotations": listed[name]["annotations"],
                              "timeout": server.timeout_seconds, "options": options}
    if errors:
        raise AgentDefinitionInvalid(errors)
    return snapshot


def _endpoint_locked(clean: dict, field: str) -> ModelEndpoint | None:
    """The endpoint the definition names in `field`, under a share lock: an endpoint removed since the
    check is refused, never dropped."""
    if not clean[field]:
        return None
    endpoint = ModelEndpoint.objects.select_for_update(no_key=True).filter(name=clean[field]).first()
    if endpoint is None:
        raise AgentDefinitionInvalid({field: f"model endpoint {clean[field]!r} no longer exists"})
    return endpoint
