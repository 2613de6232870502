"""The deployment's agents (docs/EXTENDING.md): their definitions, saved as new versions through
engine.actions.agents.agent_save, and every version they had."""

import json
import re

from django import forms
from django.contrib import admin, messages

from access import policy as access
from agents.definitions import AgentDefinitionInvalid, agent_definition_check
from agents.models import Agent, AgentVersion
from desk.base import ReadOnlyAdmin, ReadOnlyInline
from desk.display import pretty_json
from engine.actions.agents import agent_definition_of, agent_save, mcp_snapshot_take
from runs_app.endpoints import endpoint_names


def _json_field(label: str, help_text: str) -> forms.CharField:
    return forms.CharField(label=label, required=False, help_text=help_text,
                           widget=forms.Textarea(attrs={"rows": 6, "cols": 90, "class": "vLargeTextField"}))


class AgentForm(forms.ModelForm):
    """The whole definition of an agent; saving it makes a new version (engine.actions.agents).
    Checked as a whole by agents.definitions.agent_definition_check: a wrong field is named, and
    nothing is saved."""

    JSON_FIELDS = ("provider_options", "budgets", "budget_limits", "approval_rules", "write_caps", "limits",
                   "approval_service_levels", "mcp_servers")

    instructions = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "cols": 90}),
                                   help_text="The system prompt the agent's model gets.")
    endpoint = forms.ChoiceField(required=False, help_text="The model endpoint its runs call (Model endpoints); blank: "
                                                           "the deployment's default (OPENAI_* settings).")
    provider = forms.CharField(max_length=32, required=False,
                               help_text="A name in WARDEN_PROVIDERS (scripted, openai, or the deployment's own); blank: the "
                                         "endpoint's, else WARDEN_MODEL_PROVIDER.")
    model = forms.CharField(max_length=100, required=False,
                            help_text="The model name the provider is asked for; with an endpoint, one it offers.")
    fallback_endpoint = forms.ChoiceField(required=False, help_text="Where its model calls go when the endpoint fails "
                                                                    "with a transient error (unreachable, 5xx, 429); blank: none.")
    fallback_model = forms.CharField(max_length=100, required=False, help_text="One the fallback endpoint offers.")
    tools = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 90}),
                            help_text="Tool names, comma- or line-separated (registered through WARDEN_TOOL_MODULES). "
                                      "ask_user is always offered.")
    provider_options = _json_field("Provider options", "A JSON object, e.g. {\"temperature\": 0}.")
    budgets = _json_field("Default budgets", 'JSON: {"max_model_calls": 20, "max_tokens": 200000, "deadline_seconds": 3600}.')
    budget_limits = _json_field("Maximum budgets", "JSON, same keys: the most a request may ask for.")
    approval_rules = _json_field(
        "Approval rules",
        'JSON per write tool, first match wins: {"execute_refund": [{"when": "amount <= 20", "approval": "none"}, '
        '{"when": "amount <= 500", "approval": "user"}, {"when": "amount > 500", "approval": "operator", "approvers": 2}]}.')
    write_caps = _json_field(
        "Writes per turn and per run",
        'JSON: {"per_turn": 1, "per_run": 5} — more writes are refused before anything runs; left out, the '
        "deployment's defaults (WARDEN_WRITES_PER_TURN, WARDEN_WRITES_PER_RUN).")
    limits = _json_field(
        "Limits over time",
        'JSON per write tool: {"execute_refund": [{"window": "24h", "per": "customer", "max_amount": "30.00", '
        '"over": "operator"}, {"window": "1h", "per": "customer", "max_count": 5, "over": "refuse"}]} — per customer, '
        "per agent or per argument (a counterparty such as account); over a limit, the tier it names or a refusal.")
    approval_service_levels = _json_field(
        "Service levels",
        'JSON per tier: {"operator": {"notify": "operators", "remind_after": "10m", "escalate_after": "30m", '
        '"escalate_to": "leads"}} — whom to tell of a request (a group; left out: everyone who may decide), when to '
        "remind them and when to tell a second group too. An escalation never decides anything (docs/NOTIFICATIONS.md).")
    mcp_servers = _json_field(
        "MCP servers",
        'JSON per server (the desk\'s MCP servers) and the tools chosen from it: {"payments": {"tools": ["lookup_order", '
        '"refund"], "options": {"refund": {"reconciler": "find_refund", "business_key": "order_id"}}}} — the servers are '
        "asked for those tools when saving, and the version keeps what they said (a server changing its tools changes "
        "no version). A write waits for an operator unless the server calls it non-destructive or a rule says otherwise.")
    interjection_classifier = forms.ChoiceField(choices=[("model", "the agent's model"), ("keywords", "keyword rules")],
                                                initial="model")

    class Meta:
        model = Agent
        fields = ("name", "slug")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["endpoint"].choices = [("", "— the default (OPENAI_* settings) —"), *((n, n) for n in endpoint_names())]
        self.fields["fallback_endpoint"].choices = [("", "— none —"), *((n, n) for n in endpoint_names())]
        if "slug" in self.fields:  # read-only once the agent exists
            self.fields["slug"].required = False
            self.fields["slug"].help_text = "Derived from the name when left blank; sessions name the agent by it."
        if self.instance.pk and self.instance.current_version_id:
            definition = agent_definition_of(self.instance.current_version)
            for field in self.JSON_FIELDS:
                self.initial[field] = json.dumps(definition[field], indent=2)
            self.initial["tools"] = ", ".join(definition["tools"])
            for field in ("instructions", "provider", "endpoint", "model", "fallback_endpoint", "fallback_model",
                          "interjection_classifier"):
                self.initial[field] = definition[field]

    def clean(self):
        cleaned = super().clean()
        definition = {field: cleaned.get(field) for field in ("name", "slug", "instructions", "provider", "endpoint", "model",
                                                               "fallback_endpoint", "fallback_model", "interjection_classifier")}
        definition["tools"] = [t.strip() for t in re.split(r"[,\n]", cleaned.get("tools") or "") if t.strip()]
        for field in self.JSON_FIELDS:
            text = (cleaned.get(field) or "").strip()
            try:
                definition[field] = json.loads(text) if text else {}
            except json.JSONDecodeError as error:
                self.add_error(field, f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})")
        if self.instance.pk:
            definition["slug"] = self.instance.slug
        if self.errors:
            return cleaned
        try:
            # The servers asked now, as agent_save will: an unreachable one or a tool it lacks is named here.
            mcp_tools = mcp_snapshot_take(definition["mcp_servers"])
            self.definition = agent_definition_check(definition, mcp_tools=mcp_tools)
        except AgentDefinitionInvalid as error:
            for where, message in error.errors.items():
                field = where.split(".")[0].split("[")[0]
                self.add_error(field if field in self.fields else None, f"{where}: {message}" if where != field else message)
        return cleaned


def mcp_tools_by_server(version: AgentVersion) -> str:
    """The tools a version snapshotted, per server: "payments: lookup_order, refund"."""
    servers: dict[str, list[str]] = {}
    for name, entry in sorted((version.mcp_tools or {}).items()):
        servers.setdefault(entry.get("server", "?"), []).append(name)
    return "; ".join(f"{server}: {', '.join(tools)}" for server, tools in sorted(servers.items())) or "—"


class AgentVersionInline(ReadOnlyInline):
    model = AgentVersion
    fk_name = "agent"
    fields = ("number", "name", "provider", "endpoint", "model", "tools", "mcp_tools_list", "created_by", "created_at")
    readonly_fields = fields
    ordering = ("-number",)

    @admin.display(description="MCP tools")
    def mcp_tools_list(self, obj):
        return mcp_tools_by_server(obj)


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    """The deployment's agents. Defining one needs agents.change_agent (the access policy);
    every save is a new version, and runs keep the version they started with."""

    form = AgentForm
    list_display = ("name", "slug", "version", "tools_list", "provider_model", "updated_at")
    inlines = [AgentVersionInline]
    fieldsets = (
        (None, {"fields": ("name", "slug", "instructions", "endpoint", "provider", "model", "fallback_endpoint",
                           "fallback_model", "tools", "interjection_classifier")}),
        ("Approval rules", {"fields": ("approval_rules", "approval_service_levels")}),
        ("Limits on money", {"fields": ("write_caps", "limits")}),
        ("MCP servers", {"fields": ("mcp_servers",)}),
        ("Budgets and provider options", {"fields": ("budgets", "budget_limits", "provider_options")}),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("current_version")

    def get_readonly_fields(self, request, obj=None):
        return ("slug",) if obj is not None else ()

    def has_module_permission(self, request):
        return access.can_see_agents(user=request.user)

    def has_view_permission(self, request, obj=None):
        return access.can_see_agents(user=request.user)

    def has_add_permission(self, request):
        return access.can_manage_agents(user=request.user)

    def has_change_permission(self, request, obj=None):
        return access.can_manage_agents(user=request.user)

    def has_delete_permission(self, request, obj=None):
        return False  # runs point at its versions for good

    def save_model(self, request, obj, form, change):
        version = agent_save(definition=form.definition, acting_user=request.user, agent=obj if change else None,
                             mcp_tools=form.definition["mcp_tools"])
        obj.pk, obj.slug, obj.current_version = version.agent_id, version.agent.slug, version
        messages.info(request, f"Saved as version {version.number}; runs under way keep the version they started with.")

    def save_related(self, request, form, formsets, change):
        pass  # the versions are written by agent_save, never through the inline

    def construct_change_message(self, request, form, formsets, add=False):
        return [{"added": {}}] if add else [{"changed": {"fields": ["a new version"]}}]

    @admin.display(description="version")
    def version(self, obj):
        return obj.current_version.number if obj.current_version_id else "—"

    @admin.display(description="tools")
    def tools_list(self, obj):
        return ", ".join(obj.current_version.tools) if obj.current_version_id else "—"

    @admin.display(description="model")
    def provider_model(self, obj):
        version = obj.current_version
        return f"{version.provider} {version.model}".strip() if version else "—"


@admin.register(AgentVersion)
class AgentVersionAdmin(ReadOnlyAdmin):
    """Every version ever saved, as the runs that used it saw it (the database refuses changes)."""

    list_display = ("agent", "number", "provider", "endpoint", "model", "created_by", "created_at")
    list_select_related = ("agent", "created_by", "endpoint")
    readonly_fields = ("approval_rules_pretty", "provider_options_pretty", "mcp_servers_pretty", "mcp_tools_list")

    def has_view_permission(self, request, obj=None):
        return access.can_see_agents(user=request.user)

    def has_module_permission(self, request):
        return access.can_see_agents(user=request.user)

    @admin.display(description="approval rules")
    def approval_rules_pretty(self, obj):
        return pretty_json(obj.approval_rules)

    @admin.display(description="provider options")
    def provider_options_pretty(self, obj):
        return pretty_json(obj.provider_options)

    @admin.display(description="MCP servers")
    def mcp_servers_pretty(self, obj):
        return pretty_json(obj.mcp_servers)

    @admin.display(description="MCP tools (as the servers described them when saved)")
    def mcp_tools_list(self, obj):
        return mcp_tools_by_server(obj)
