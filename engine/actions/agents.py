"""Defining agents (docs/EXTENDING.md): every save of a definition, from the admin or the API, is
a new immutable version — checked first (agents.definitions.agent_definition_check: nothing is saved
when any field is wrong), then written with the agent's pointer to it and an audit entry naming
who, in one transaction. Runs keep the version they started with; the next run takes the new one."""

from django.db import transaction

from access import policy as access
from agents.definitions import AgentDefinitionInvalid, agent_definition_check
from agents.errors import AgentRefusal
from agents.models import Agent, AgentVersion
from approvals_app.services import audit_record
from config.errors import WardenError
from runs_app.models import ModelEndpoint

# The definition's fields as an AgentVersion stores them.
VERSION_FIELDS = ("name", "instructions", "provider", "model", "fallback_model", "provider_options", "tools", "budgets", "budget_limits",
                  "approval_rules", "interjection_classifier", "write_caps", "limits",
                  "approval_service_levels")
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


def agent_save(*, definition: dict, acting_user, agent: Agent | None = None) -> AgentVersion:
    """Create the agent (without `agent`) or give it a new version. AgentDefinitionInvalid names
    every wrong field, a caller without agents.change_agent is refused (AgentRefusal.NOT_PERMITTED);
    in either case nothing is written."""
    if not access.can_manage_agents(user=acting_user):
        raise WardenError(AgentRefusal.NOT_PERMITTED, "Defining agents needs the agents.change_agent permission.")
    if agent is not None:
        definition = {**definition, "slug": agent.slug}
    clean = agent_definition_check(definition)
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
                                              fallback_endpoint=fallback,
                                              **{field: clean[field] for field in VERSION_FIELDS})
        agent.current_version = version
        agent.name = clean["name"]
        agent.save(update_fields=["current_version", "name", "updated_at"])
        audit_record(actor=acting_user, action="define_agent", obj=agent, before=before,
                     after={"version": number, "tools": clean["tools"], "provider": clean["provider"], "model": clean["model"],
                            ENDPOINT_FIELD: clean[ENDPOINT_FIELD],
                            **({FALLBACK_FIELD: clean[FALLBACK_FIELD], "fallback_model": clean["fallback_model"]}
                               if clean[FALLBACK_FIELD] else {})})
    return version


def _endpoint_locked(clean: dict, field: str) -> ModelEndpoint | None:
    """The endpoint the definition names in `field`, under a share lock: an endpoint removed since the
    check is refused, never dropped."""
    if not clean[field]:
        return None
    endpoint = ModelEndpoint.objects.select_for_update(no_key=True).filter(name=clean[field]).first()
    if endpoint is None:
        raise AgentDefinitionInvalid({field: f"model endpoint {clean[field]!r} no longer exists"})
    return endpoint
