"""A deployment's agents (docs/EXTENDING.md) and their immutable versions."""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class Agent(models.Model):
    """A deployment's agent (docs/EXTENDING.md): what it is called, and which of its versions new
    runs use. Its definition lives in its versions; saving one (admin or API,
    engine.actions.agents.agent_save) makes a new version and points `current_version` at it."""

    id = models.BigAutoField(primary_key=True)
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=100)
    current_version = models.ForeignKey(
        "AgentVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        # The table it has had since it lived in runs_app (migrations agents/0001, runs_app/0015).
        db_table = "runs_app_agent"
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return self.name


class AgentVersion(models.Model):
    """One immutable definition of an agent (agents.definitions says what may be in it): the
    database refuses UPDATE and DELETE on this table (runs_app migration 0012), so a run's `agent_version`
    says exactly what it ran with — instructions, tools, rules, provider and model."""

    id = models.BigAutoField(primary_key=True)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    name = models.CharField(max_length=100)
    instructions = models.TextField()
    provider = models.CharField(max_length=32)
    # The model endpoint its runs call (docs/EXTENDING.md), `model` being one it offers; null: the
    # deployment's default endpoint (the OPENAI_* settings) or a provider that needs none.
    endpoint = models.ForeignKey("runs_app.ModelEndpoint", null=True, blank=True, on_delete=models.PROTECT,
                                 related_name="agent_versions")
    model = models.CharField(max_length=100, blank=True)
    # Where its runs' model calls go when the endpoint fails with a transient error (engine/model_route.py),
    # `fallback_model` being one that endpoint offers; null: no fallback.
    fallback_endpoint = models.ForeignKey("runs_app.ModelEndpoint", null=True, blank=True, on_delete=models.PROTECT,
                                          related_name="fallback_for_versions")
    fallback_model = models.CharField(max_length=100, blank=True, default="")
    provider_options = models.JSONField(default=dict, blank=True)
    # Tool names (the run-time's own ask_user is always offered besides).
    tools = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    # MCP servers and the tools chosen from each (docs/EXTENDING.md, "MCP servers"):
    # {"<server>": {"tools": ["refund", …], "options": {"refund": {"reconciler": "find_refund", …}}}}.
    mcp_servers = models.JSONField(default=dict, blank=True)
    # The chosen tools as the servers described them when the version was saved, by the name the model
    # sees: {"refund": {"server", "description", "input_schema", "annotations", "effect", …}}
    # (tools_app.mcp). A run keeps these whatever the server says later.
    mcp_tools = models.JSONField(default=dict, blank=True)
    # Defaults and maxima of a run's budgets: {"max_model_calls", "max_tokens", "deadline_seconds"}.
    budgets = models.JSONField(default=dict, blank=True)
    budget_limits = models.JSONField(default=dict, blank=True)
    # {"<write tool>": [{"when": "amount <= 20", "approval": "none|user|operator", "approvers": N}, …]}
    approval_rules = models.JSONField(default=dict, blank=True)
    interjection_classifier = models.CharField(max_length=16, default="model")
    # How many writes a model turn and a run may make: {"per_turn": 1, "per_run": 5} (agents.limits;
    # settings WARDEN_WRITES_PER_TURN / _PER_RUN for what is left out).
    write_caps = models.JSONField(default=dict, blank=True)
    # Cumulative limits per write tool: {"<tool>": [{"window": "24h", "per": "customer", "max_amount": "30.00",
    # "over": "operator"}, …]} (agents.limits).
    limits = models.JSONField(default=dict, blank=True)
    # Service levels of its approval requests, per tier (agents.service_levels; docs/NOTIFICATIONS.md):
    # {"operator": {"notify": "<group>", "remind_after": "10m", "escalate_after": "30m", "escalate_to": "<group>"}}.
    approval_service_levels = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runs_app_agentversion"
        ordering = ["agent", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "number"], name="agent_version_number_unique"),
            models.CheckConstraint(condition=Q(number__gte=1), name="agent_version_number_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.number}"
