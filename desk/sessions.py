from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import HttpResponse
from django.template import engines
from django.urls import reverse

from desk.base import BusinessKeySearch, EstimatedCountPaginator, PolicyScopedAdmin, ReadOnlyAdmin, ReadOnlyInline
from runs_app.models import Run
from tools_app.selectors import run_ids_matching
from access import policy as access
from engine.actions.api_keys import api_key_issue, api_key_withdraw
from sessions_app.models import ApiKey, IdempotencyRecord, Message, PendingInput, RateCounter, Session


class MessageInline(ReadOnlyInline):
    model = Message
    fields = ("seq", "role", "content", "tool_name", "tool_call_id", "run", "created_at")
    readonly_fields = fields
    ordering = ("seq",)


class PendingInputInline(ReadOnlyInline):
    model = PendingInput
    fields = ("id", "mode", "resolved_mode", "content", "received_at", "consumed_at", "disposition", "consumed_by")
    readonly_fields = fields


class _PartOfSessionAdmin(PolicyScopedAdmin):
    """Messages and pending input are seen with their session."""

    def visible(self, user):
        sessions = access.visible_sessions(user=user)
        if not sessions.query.has_filters():
            return self.model.objects.all()
        return self.model.objects.filter(session__in=sessions)


@admin.register(Session)
class SessionAdmin(BusinessKeySearch, PolicyScopedAdmin):
    list_display = ("title", "owner", "created_at", "updated_at")
    list_select_related = ("owner",)
    search_help_text = "Title, customer, an order number or any tool argument of its runs, an idempotency key, or an id."
    show_full_result_count = False
    inlines = [MessageInline, PendingInputInline]

    def search_business_keys(self, queryset, term):
        # run_ids_matching covers titles, customers and ids too, through the session's runs;
        # a session without runs is found by its title or owner here.
        runs = Run.objects.filter(pk__in=run_ids_matching(term=term)).values("session_id")
        return queryset.filter(Q(pk__in=runs) | Q(title__icontains=term) | Q(owner__username__icontains=term))

    def visible(self, user):
        return access.visible_sessions(user=user)

    def can_see(self, user, obj) -> bool:
        return access.can_see_session(user=user, session=obj)


@admin.register(Message)
class MessageAdmin(_PartOfSessionAdmin):
    list_display = ("id", "session", "seq", "role", "short_content", "run", "created_at")
    list_select_related = ("session", "run")
    list_filter = ("role",)
    search_fields = ("=session__id", "=run__id")
    ordering = ("-id",)  # newest first, by the primary key (the model's order joins every session)
    paginator = EstimatedCountPaginator
    show_full_result_count = False

    @admin.display(description="content")
    def short_content(self, obj):
        return (obj.content[:80] + "…") if len(obj.content) > 80 else obj.content


@admin.register(PendingInput)
class PendingInputAdmin(_PartOfSessionAdmin):
    list_display = ("id", "session", "mode", "resolved_mode", "disposition", "received_at", "consumed_at")
    list_select_related = ("session",)
    list_filter = ("mode", "disposition")
    search_fields = ("=session__id",)
    ordering = ("-id",)


# The page shown once after an API key is created: the only time its secret is ever visible.
_SECRET_SHOWN_ONCE = """{% extends "admin/base_site.html" %}
{% block content %}
<p>API key <strong>{{ api_key.name }}</strong> for <strong>{{ api_key.owner }}</strong> was created.
Copy the secret now: it is not stored and cannot be shown again.</p>
<p><code style="font-size:1.1em;user-select:all">{{ secret }}</code></p>
<p>Clients send it as <code>Authorization: Bearer &lt;secret&gt;</code>.</p>
<p><a href="{{ changelist_url }}">Back to API keys</a></p>
{% endblock %}
"""


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are created here (the secret is shown once) and revoked by an action; never edited."""

    list_display = ("name", "owner", "prefix", "created_at", "last_used_at", "revoked_at")
    list_select_related = ("owner",)
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "=prefix", "owner__username")
    raw_id_fields = ("owner",)
    actions = ["revoke_keys"]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("owner", "name")
        return ("name", "owner", "prefix", "created_at", "last_used_at", "revoked_at")

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_revoke_permission(self, request):
        return request.user.has_perm("sessions_app.change_apikey")

    def get_changeform_initial_data(self, request):
        return {"owner": request.user.pk, **super().get_changeform_initial_data(request)}

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if obj is not None or request.user.is_superuser:
            return form

        class OwnKeyForm(form):
            """A key acts as its owner: with one for someone else, its creator could act as them
            (decide refunds, say). Only a superuser makes keys for others (service accounts)."""

            def clean_owner(self):
                owner = self.cleaned_data["owner"]
                if owner != request.user:
                    raise ValidationError("You can create API keys only for yourself; ask a superuser for anyone else's.")
                return owner

        return OwnKeyForm

    def save_model(self, request, obj, form, change):
        api_key, secret = api_key_issue(owner=form.cleaned_data["owner"], name=form.cleaned_data["name"],
                                         acting_user=request.user)
        for field in ("pk", "prefix", "secret_hash", "created_at"):
            setattr(obj, field, getattr(api_key, field))
        obj._state.adding = False
        obj._secret_shown_once = secret

    def response_add(self, request, obj, post_url_continue=None):
        context = {
            **self.admin_site.each_context(request),
            "title": "API key created",
            "opts": self.model._meta,
            "api_key": obj,
            "secret": obj._secret_shown_once,
            "changelist_url": reverse("admin:sessions_app_apikey_changelist"),
        }
        response = HttpResponse(engines["django"].from_string(_SECRET_SHOWN_ONCE).render(context, request))
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected API keys", permissions=["revoke"])
    def revoke_keys(self, request, queryset):
        revoked = sum(api_key_withdraw(api_key=key, acting_user=request.user) for key in queryset.select_related("owner"))
        self.message_user(request, f"Revoked {revoked} API key{'' if revoked == 1 else 's'}.", messages.SUCCESS)


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ReadOnlyAdmin):
    """API requests sent with an Idempotency-Key and the status they were answered with (the
    stored bodies stay out of the list); purged after WARDEN_IDEMPOTENCY_KEY_TTL_SECONDS."""

    list_display = ("created_at", "owner", "method", "path", "key", "status_code")
    list_select_related = ("owner",)
    list_filter = ("method", "status_code")
    search_fields = ("=key", "owner__username", "path")
    fields = ("created_at", "owner", "method", "path", "key", "request_hash", "status_code", "response_content_type")
    readonly_fields = fields


@admin.register(RateCounter)
class RateCounterAdmin(ReadOnlyAdmin):
    """Rate-limit counts per caller and window, where the cache is the database (config/throttling.py)."""

    list_display = ("key", "start", "count", "expires")
    search_fields = ("key",)
    readonly_fields = ("key", "start", "count", "expires")
