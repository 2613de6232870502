"""Model endpoints (docs/EXTENDING.md, "Model endpoints"): where an agent's model calls go, the
models offered there, and the credential — write-only: the page says whether one is set, a new one
replaces it, and no page, list or message ever shows it. Saved through
engine.actions.endpoints.endpoint_save (sealed, audited); workers use the change on their next call."""

from django import forms
from django.contrib import admin, messages

from access import policy as access
from agents.selectors import endpoint_models_in_use
from desk.base import ReadOnlyAdmin
from engine.actions.endpoints import (MODEL_FIELDS, endpoint_base_url_problem, endpoint_credential_problem,
                                     endpoint_provider_problem, endpoint_save)
from runs_app.models import EndpointModel, ModelEndpoint


class ModelEndpointForm(forms.ModelForm):
    # Never rendered back (render_value=False): the page says "set" or "not set" beside it.
    new_credential = forms.CharField(
        label="New credential", required=False, strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="The API key (sent as a bearer token; to Anthropic as x-api-key). Leave blank to keep the one "
                  "set; a new one is used by the next model call, without restarting workers.")
    credential_clear = forms.BooleanField(label="Remove the credential", required=False)
    base_url = forms.URLField(max_length=300, assume_scheme="https",
                              help_text="Chat Completions and Responses: e.g. https://api.openai.com/v1 (…/chat/completions or "
                                        "…/responses is added); Anthropic Messages: https://api.anthropic.com (…/v1/messages "
                                        "is added).")

    class Meta:
        model = ModelEndpoint
        fields = ("name", "kind", "provider", "base_url", "max_concurrency", "timeout_seconds", "connect_timeout_seconds")

    def clean_base_url(self):
        base_url = self.cleaned_data["base_url"]
        if problem := endpoint_base_url_problem(base_url):
            raise forms.ValidationError(problem)
        return base_url

    def clean_new_credential(self):
        credential = self.cleaned_data.get("new_credential") or ""
        if credential and (problem := endpoint_credential_problem(credential)):
            raise forms.ValidationError(problem)  # says what is wrong, never echoes it
        return credential

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("new_credential") and cleaned.get("credential_clear"):
            self.add_error("credential_clear", "Either a new credential or its removal, not both.")
        if "kind" in cleaned and (problem := endpoint_provider_problem(kind=cleaned["kind"],
                                                                      provider=cleaned.get("provider") or "")):
            self.add_error("provider", problem[:1].upper() + problem[1:] + ".")
        return cleaned


class EndpointModelFormSet(forms.BaseInlineFormSet):
    """An offered model an agent's current version names stays offered (removing or renaming it
    would leave that agent calling a model the endpoint no longer lists)."""

    def clean(self):
        super().clean()
        if self.instance.pk is None:
            return
        used = endpoint_models_in_use(endpoint_id=self.instance.pk)
        for form in self.forms:
            before = form.initial.get("name")
            gone = form in self.deleted_forms or (before and form.cleaned_data.get("name") not in (None, before))
            if before in used and gone:
                raise forms.ValidationError(f"{before} is the model of {', '.join(used[before])}: point "
                                            f"{'them' if len(used[before]) > 1 else 'it'} at another model first.")


class EndpointModelInline(admin.TabularInline):
    model = EndpointModel
    formset = EndpointModelFormSet
    fields = ("name", "input_price_per_million", "output_price_per_million", "context_window")
    extra = 1

    def has_view_permission(self, request, obj=None):
        return access.can_see_model_endpoints(user=request.user)

    def has_add_permission(self, request, obj=None):
        return access.can_manage_model_endpoints(user=request.user)

    def has_change_permission(self, request, obj=None):
        return access.can_manage_model_endpoints(user=request.user)

    def has_delete_permission(self, request, obj=None):
        return access.can_manage_model_endpoints(user=request.user)


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(admin.ModelAdmin):
    """Defining endpoints needs runs_app.change_modelendpoint (the access policy); agent definers
    and holders of view_modelendpoint may read them. None is deleted: agent versions point at it."""

    form = ModelEndpointForm
    list_display = ("name", "kind", "base_url", "offered", "credential_state", "max_concurrency", "updated_at")
    inlines = [EndpointModelInline]
    readonly_fields = ("credential_state", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "kind", "provider", "base_url")}),
        ("Credential", {"fields": ("credential_state", "new_credential", "credential_clear")}),
        ("Limits", {"fields": ("max_concurrency", "timeout_seconds", "connect_timeout_seconds")}),
        (None, {"fields": ("created_at", "updated_at")}),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("offered_models")

    def get_fieldsets(self, request, obj=None):
        if self.has_change_permission(request, obj):
            return self.fieldsets
        # Read-only: no field to type a credential into.
        return tuple((title, {"fields": tuple(f for f in spec["fields"] if f not in ("new_credential", "credential_clear"))})
                     for title, spec in self.fieldsets)

    def has_module_permission(self, request):
        return access.can_see_model_endpoints(user=request.user)

    def has_view_permission(self, request, obj=None):
        return access.can_see_model_endpoints(user=request.user)

    def has_add_permission(self, request):
        return access.can_manage_model_endpoints(user=request.user)

    def has_change_permission(self, request, obj=None):
        return access.can_manage_model_endpoints(user=request.user)

    def has_delete_permission(self, request, obj=None):
        return False  # agent versions (and so runs) point at it for good

    def save_model(self, request, obj, form, change):
        """Saved with its models in save_related: one call of endpoint_save, one audit entry."""

    def save_related(self, request, form, formsets, change):
        """The endpoint and the models its inline lists, saved by endpoint_save in one transaction
        and audited together (a repriced or dropped model is a change an auditor asks about); the
        inline's rows are never written by the admin itself."""
        obj = form.instance
        had = bool(obj.pk) and ModelEndpoint.objects.filter(pk=obj.pk).exclude(credential="").exists()
        models, changed = None, list(form.changed_data)
        for formset in formsets:
            formset.save(commit=False)  # what the change message lists; writes nothing
            if formset.model is EndpointModel and formset.has_changed():
                models, changed = _offered_after(obj, formset), [*changed, "models"]
        endpoint_save(endpoint=obj, acting_user=request.user, changed=changed,
                      credential=form.cleaned_data.get("new_credential") or None,
                      credential_clear=bool(form.cleaned_data.get("credential_clear")), models=models)
        if form.cleaned_data.get("new_credential"):
            messages.info(request, f"Credential {'rotated' if had else 'set'}: the next model call uses it.")

    @admin.display(description="credential")
    def credential_state(self, obj):
        return "set" if obj is not None and obj.credential else "not set"

    @admin.display(description="models")
    def offered(self, obj):
        return ", ".join(m.name for m in obj.offered_models.all()) or "—"


@admin.register(EndpointModel)
class EndpointModelAdmin(ReadOnlyAdmin):
    """Every model every endpoint offers, with its prices and window (edited on its endpoint's page)."""

    list_display = ("name", "endpoint", "input_price_per_million", "output_price_per_million", "context_window")
    list_select_related = ("endpoint",)

    def has_module_permission(self, request):
        return access.can_see_model_endpoints(user=request.user)

    def has_view_permission(self, request, obj=None):
        return access.can_see_model_endpoints(user=request.user)


def _offered_after(endpoint: ModelEndpoint, formset) -> list[dict]:
    """The models the endpoint offers once the inline is applied, as Django's formset would leave
    them: the rows it does not list stay, a listed one is changed or deleted, a new one is added."""
    offered = {row.pk: {field: getattr(row, field) for field in MODEL_FIELDS}
               for row in (EndpointModel.objects.filter(endpoint=endpoint) if endpoint.pk else [])}
    added = []
    for form in formset.forms:
        pk = form.instance.pk
        if form in formset.deleted_forms:
            offered.pop(pk, None)
        elif form.has_changed() and form.cleaned_data.get("name"):
            values = {field: form.cleaned_data[field] for field in MODEL_FIELDS}
            if pk in offered:
                offered[pk] = values
            else:
                added.append(values)
    return [*offered.values(), *added]

