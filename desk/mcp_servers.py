"""MCP servers (docs/EXTENDING.md, "MCP servers"): where an agent's MCP tools live and the credential
they want — write-only, as a model endpoint's: the page says whether one is set, a new one replaces
it, and no page, list or message ever shows it. Saved through engine.actions.mcp_servers.mcp_server_save
(sealed, audited). "Check tools now" asks a server for its tools; the list then names the agents
whose current version snapshotted a tool the server now describes otherwise."""

import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from access import policy as access
from agents.models import Agent
from agents.selectors import mcp_server_drift
from config.errors import WardenError
from desk.base import FormForTheUser, form_refused
from desk.display import age
from engine.actions.mcp_servers import FIELDS, McpServerInvalid, mcp_credential_parse, mcp_server_check, mcp_server_save
from tools_app.errors import McpServerRefusal
from tools_app.mcp import mcp_effect
from tools_app.models import McpServer, McpTransport, ToolEffect


class McpServerForm(forms.ModelForm):
    # Never rendered back (render_value=False): the page says "set" or "not set" beside it.
    new_credential = forms.CharField(
        label="New credential", required=False, strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text='The headers the server wants, as one line "Authorization: Bearer …" or a JSON object of names '
                  "to values (for a local command, its environment). Leave blank to keep the one set; the next call "
                  "uses a new one.")
    credential_clear = forms.BooleanField(label="Remove the credential", required=False)
    url = forms.URLField(label="URL", max_length=300, required=False, assume_scheme="https",
                         widget=forms.URLInput(attrs={"class": "vURLField"}),
                         help_text="Streamable HTTP: the server's MCP endpoint, e.g. https://mcp.example.com/mcp.")
    command = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
                              help_text='A local command (stdio, where WARDEN_MCP_STDIO allows it): a JSON list such as '
                                        '["python", "-m", "my_server"].')

    class Meta:
        model = McpServer
        fields = FIELDS

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.initial["command"] = json.dumps(self.instance.command) if self.instance.command else ""

    def clean_command(self):
        text = (self.cleaned_data.get("command") or "").strip()
        try:
            return json.loads(text) if text else []
        except ValueError:
            raise forms.ValidationError('not valid JSON: a list such as ["python", "-m", "my_server"]') from None

    def clean_new_credential(self):
        text = self.cleaned_data.get("new_credential") or ""
        if not text:
            return None
        try:
            return mcp_credential_parse(text)
        except McpServerInvalid as refused:
            raise forms.ValidationError(refused.errors["credential"]) from None  # says what is wrong, never echoes it

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("new_credential") and cleaned.get("credential_clear"):
            self.add_error("credential_clear", "Either a new credential or its removal, not both.")
        if self.errors:
            return cleaned
        fields = {field: cleaned.get(field) for field in FIELDS if field in self.fields}
        self.had_credential = bool(self.instance.pk and self.instance.credential)
        try:
            self.instance = mcp_server_save(acting_user=self.user, fields=fields, credential=cleaned.get("new_credential"),
                                            clear_credential=bool(cleaned.get("credential_clear")),
                                            server=self.instance if self.instance.pk else None)
        except WardenError as refused:
            if refused.code == McpServerRefusal.MCP_SERVER_NAME_TAKEN:
                self.add_error("name", refused.message)
            else:
                form_refused(self, refused)
        return cleaned


@admin.register(McpServer)
class McpServerAdmin(FormForTheUser, admin.ModelAdmin):
    """Only holders of tools_app.change_mcpserver (the access policy) see or change MCP servers: the
    page holds where a credential goes. None is deleted: agent versions name it."""

    form = McpServerForm
    list_display = ("name", "transport", "where", "tools_checked", "check_error_shown", "tools_changed")
    readonly_fields = ("credential_state", "tools_check", "check_error_shown", "tools_last_seen", "created_at", "updated_at")
    actions = ("check_tools_now",)
    fieldsets = (
        (None, {"fields": ("name", "transport", "url", "command", "timeout_seconds")}),
        ("Credential", {"fields": ("credential_state", "new_credential", "credential_clear")}),
        ("Tools", {"fields": ("tools_check", "check_error_shown", "tools_last_seen")}),
        (None, {"fields": ("created_at", "updated_at")}),
    )

    def get_fieldsets(self, request, obj=None):
        if obj is None:  # nothing set or checked yet: the tools come with the first check
            return ((None, self.fieldsets[0][1]), ("Credential", {"fields": ("new_credential",)}))
        return self.fieldsets

    def get_readonly_fields(self, request, obj=None):
        # Agent versions and their runs find the server by its name: renaming it would strand them.
        return ("name", *self.readonly_fields) if obj is not None else self.readonly_fields

    def get_urls(self):
        return [path("<path:object_id>/check/", self.admin_site.admin_view(self.check_view),
                     name="tools_app_mcpserver_check"),
                *super().get_urls()]

    def has_module_permission(self, request):
        return access.can_manage_mcp_servers(user=request.user)

    def has_view_permission(self, request, obj=None):
        return access.can_manage_mcp_servers(user=request.user)

    def has_add_permission(self, request):
        return access.can_manage_mcp_servers(user=request.user)

    def has_change_permission(self, request, obj=None):
        return access.can_manage_mcp_servers(user=request.user)

    def has_delete_permission(self, request, obj=None):
        return False  # agent versions name it for good

    def has_check_permission(self, request):
        return access.can_manage_mcp_servers(user=request.user)

    def save_model(self, request, obj, form, change):
        """Saved by mcp_server_save in the form's clean (sealed, audited)."""
        if form.cleaned_data.get("new_credential"):
            messages.info(request, f"Credential {'rotated' if form.had_credential else 'set'}: the next call to "
                                   f"{obj.name} uses it.")

    def save_related(self, request, form, formsets, change):
        pass  # nothing else is written through the admin

    @admin.action(description="Check tools now", permissions=["check"])
    def check_tools_now(self, request, queryset):
        for server in queryset:
            _check_and_tell(request, server)

    def check_view(self, request, object_id):
        """The change page's "Check tools now" button (a POST, with the page's CSRF token)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_check_permission(request):
            raise PermissionDenied
        server = self.get_object(request, unquote(object_id))
        if server is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        _check_and_tell(request, server)
        return HttpResponseRedirect(reverse("admin:tools_app_mcpserver_change", args=[server.pk]))

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        # One look-up for the agents every drift row links to, not one per row.
        self._drift = {server.pk: mcp_server_drift(server_name=server.name, tools_seen=server.tools_seen or [])
                       for server in changelist.result_list}
        slugs = {row["agent"] for rows in self._drift.values() for row in rows}
        self._agent_pks = dict(Agent.objects.filter(slug__in=slugs).values_list("slug", "pk"))
        return changelist

    @admin.display(description="URL or command")
    def where(self, obj):
        return obj.url if obj.transport == McpTransport.HTTP else " ".join(obj.command or [])

    @admin.display(description="credential")
    def credential_state(self, obj):
        return "set" if obj is not None and obj.credential else "not set"

    @admin.display(description="Tools last checked", ordering="tools_checked_at")
    def tools_checked(self, obj):
        if obj.tools_checked_at is None:
            return "never"
        when = timezone.localtime(obj.tools_checked_at).strftime("%d %b %Y %H:%M %Z")
        return format_html('<time datetime="{}">{}</time> ({} ago) · {} tool{}', obj.tools_checked_at.isoformat(), when,
                           age(obj.tools_checked_at), len(obj.tools_seen or []), "" if len(obj.tools_seen or []) == 1 else "s")

    @admin.display(description="check error")
    def check_error_shown(self, obj):
        return obj.check_error or "—"

    @admin.display(description="Tools changed")
    def tools_changed(self, obj):
        drift = getattr(self, "_drift", {}).get(obj.pk)
        if drift is None:
            drift = mcp_server_drift(server_name=obj.name, tools_seen=obj.tools_seen or [])
        if not drift:
            return "—"
        pks = getattr(self, "_agent_pks", None)
        if pks is None:
            pks = dict(Agent.objects.filter(slug__in=[row["agent"] for row in drift]).values_list("slug", "pk"))
        return format_html_join(mark_safe("<br>"), '<a href="{}">{} v{}</a>: {} — save a new version to pick it up', (
            (reverse("admin:agents_agent_change", args=[pks[row["agent"]]]), row["agent"], row["version"],
             ", ".join(f"{tool} {what}" for tool, what in sorted(row["tools"].items())))
            for row in drift if row["agent"] in pks))

    @admin.display(description="Tools last checked")
    def tools_check(self, obj):
        # The button submits the page's own form (with its CSRF token) to the check view: nothing is saved.
        return format_html('{}<br><button type="submit" class="button" id="check-tools" formaction="{}" formnovalidate>'
                           "Check tools now</button>", self.tools_checked(obj),
                           reverse("admin:tools_app_mcpserver_check", args=[obj.pk]))

    @admin.display(description="tools last seen")
    def tools_last_seen(self, obj):
        # A list, not a table: a description is long, and a phone has no room for columns.
        tools = obj.tools_seen or []
        if not tools:
            return "—"
        return format_html('<ul class="desk-effects" id="mcp-tools">{}</ul>', format_html_join(
            "", '<li><strong>{}</strong> · {}<br><small class="desk-muted">{}</small></li>',
            ((tool["name"], _effect_words(tool), tool.get("description") or "no description") for tool in tools)))


def _effect_words(tool: dict) -> str:
    """"read", or a write and whether the server calls it destructive (the protocol's default for a write)."""
    if mcp_effect(tool) == ToolEffect.READ:
        return "read"
    return "write, not destructive" if (tool.get("annotations") or {}).get("destructiveHint") is False else "write, destructive"


def _check_and_tell(request, server: McpServer) -> None:
    """Ask the server for its tools and say what came of it, in one message."""
    try:
        tools = mcp_server_check(server=server, acting_user=request.user)
    except WardenError as refused:
        messages.error(request, f"{server.name}: {refused.message}")
        return
    if tools is None:
        server.refresh_from_db(fields=["check_error"])
        messages.error(request, f"{server.name}: {server.check_error}")
        return
    drift = mcp_server_drift(server_name=server.name, tools_seen=tools)
    changed = f"; tools changed for {', '.join(row['agent'] for row in drift)}" if drift else ""
    messages.success(request, f"{server.name}: {len(tools)} tool{'' if len(tools) == 1 else 's'} listed{changed}.")
