"""The desk's out-of-office delegations (issue 31, point 3): an operator who may decide operator
approvals names a stand-in for a period, and revokes it; a superuser does so for anyone. Setting and
revoking go through engine.actions.delegations, as the API does — audited and on the ledger — never
a save of the row; a refusal (an overlap, a period too long, oneself) is shown on the form.

The notification links (ApprovalLink) are listed read-only beside them: which decider was sent
which request, and whether the link was used."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import AdminSplitDateTime
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.utils import timezone

from access import policy as access
from approvals_app.models import ApprovalLink, Delegation
from config.errors import WardenError
from desk.base import FormForTheUser, PolicyScopedAdmin, form_refused
from desk.display import badge
from engine.actions.delegations import delegation_revoke, delegation_set


def _may_delegate(user) -> bool:
    return access.is_active(user) and (user.is_superuser or access.operator_powers(user)["decide_operator_approvals"])


class DelegationForm(forms.ModelForm):
    delegator = forms.ModelChoiceField(queryset=get_user_model().objects.none(), required=False,
                                       help_text="Whose decisions are delegated. Only a superuser chooses; otherwise it is you.")
    delegate = forms.ModelChoiceField(queryset=get_user_model().objects.none(),
                                      help_text="Who stands in: they decide in your name and theirs, never in their own session.")
    starts_at = forms.SplitDateTimeField(widget=AdminSplitDateTime, required=False, help_text="Empty: from now.")
    ends_at = forms.SplitDateTimeField(widget=AdminSplitDateTime, help_text="At most 90 days after the start.")
    reason = forms.CharField(required=False, max_length=300, widget=forms.Textarea(attrs={"rows": 2}),
                             help_text="Why (e.g. “on leave”): kept in the audit trail and the ledger.")

    class Meta:
        model = Delegation
        fields = ("delegator", "delegate", "starts_at", "ends_at", "reason")

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        people = get_user_model().objects.filter(is_active=True, is_staff=True).order_by("username")
        self.fields["delegate"].queryset = people.exclude(pk=user.pk) if not user.is_superuser else people
        if user.is_superuser:
            self.fields["delegator"].queryset = people
        else:
            del self.fields["delegator"]

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        try:
            self.instance = delegation_set(delegator=cleaned.get("delegator") or self.user, delegate=cleaned["delegate"],
                                           starts_at=cleaned.get("starts_at"), ends_at=cleaned["ends_at"],
                                           reason=cleaned.get("reason", ""), acting_user=self.user)
        except WardenError as refused:
            form_refused(self, refused)
        return cleaned


@admin.register(Delegation)
class DelegationAdmin(FormForTheUser, admin.ModelAdmin):
    """One's own delegations, given and held (a superuser sees all). Adding one sets it at once;
    "Revoke" ends it now. A delegation is never edited: revoke it and set another."""

    form = DelegationForm
    list_display = ("delegator", "delegate", "state", "starts_at", "ends_at", "reason", "created_by")
    list_select_related = ("delegator", "delegate", "created_by")
    actions = ("revoke_selected",)
    ordering = ("-starts_at", "-id")

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(Q(delegator_id=request.user.pk) | Q(delegate_id=request.user.pk))

    def get_fields(self, request, obj=None):
        fields = ("delegator", "delegate", "starts_at", "ends_at", "reason")
        return fields if request.user.is_superuser else fields[1:]  # one's own: the delegator is oneself

    def save_model(self, request, obj, form, change):
        pass  # delegation_set saved it (in the form's clean), audited

    def has_module_permission(self, request):
        return _may_delegate(request.user)

    def has_view_permission(self, request, obj=None):
        if obj is not None and request.user.pk in (obj.delegator_id, obj.delegate_id):
            return True
        return _may_delegate(request.user)

    def has_add_permission(self, request):
        return _may_delegate(request.user)

    def has_change_permission(self, request, obj=None):
        return False  # set or revoked, never edited

    def has_delete_permission(self, request, obj=None):
        return False

    def has_revoke_permission(self, request):
        return _may_delegate(request.user)

    @admin.display(description="state")
    def state(self, obj):
        now = timezone.now()
        if obj.revoked_at:
            return badge("revoked", "freeze-lifted")
        if obj.ends_at <= now:
            return badge("ended", "freeze-lifted")
        return badge("in force" if obj.starts_at <= now else "scheduled", "freeze-active")

    @admin.action(description="Revoke selected delegations (the stand-in's power ends now)", permissions=["revoke"])
    def revoke_selected(self, request, queryset):
        revoked = 0
        for delegation in queryset.filter(revoked_at__isnull=True).select_related("delegator"):
            try:
                delegation_revoke(delegation=delegation, acting_user=request.user)
                revoked += 1
            except WardenError as refused:
                self.message_user(request, f"{delegation}: {refused.message}", messages.ERROR)
        self.message_user(request, f"{revoked} delegation{'' if revoked == 1 else 's'} revoked.", messages.SUCCESS)


@admin.register(ApprovalLink)
class ApprovalLinkAdmin(PolicyScopedAdmin):
    """The decision links notifications carried: to whom, for which request, used or not. Read-only:
    a link is spent by the decision it carries, nothing else."""

    list_display = ("approval", "decider", "on_behalf_of", "stage", "created_at", "expires_at", "used_at")
    list_select_related = ("approval", "decider", "on_behalf_of")
    list_filter = ("stage",)

    def visible(self, user):
        return ApprovalLink.objects.filter(approval__in=access.visible_approvals(user=user))
