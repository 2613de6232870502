"""The desk's freezes (SPEC §18): an operator with approvals_app.freeze_money freezes an agent's, a
tool's or a customer's money movement and lifts it — through engine.actions.freezes, as the API
does, audited; a refusal (a freeze that exists already, a target that does not) is shown on the form."""

from django import forms
from django.contrib import admin, messages

from access import policy as access
from approvals_app.models import Freeze, FreezeMode, FreezeScope
from config.errors import WardenError
from desk.base import FormForTheUser, form_refused
from desk.display import badge
from engine.actions.freezes import freeze_lift, freeze_set


class FreezeForm(forms.ModelForm):
    scope = forms.ChoiceField(choices=FreezeScope.choices)
    target = forms.CharField(max_length=150, help_text="The agent's slug, the write tool's name, or the customer's username.")
    mode = forms.ChoiceField(choices=[(FreezeMode.WAIT, "wait: the writes wait until it is lifted"),
                                      (FreezeMode.REFUSE, "refuse: the writes fail, nothing is sent")])
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), help_text="Why: kept in the audit trail.")

    class Meta:
        model = Freeze
        fields = ("scope", "target", "mode", "reason")

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        try:
            self.instance = freeze_set(scope=cleaned["scope"], target=cleaned["target"], mode=cleaned["mode"],
                                       reason=cleaned["reason"], acting_user=self.user)
        except WardenError as refused:
            form_refused(self, refused)
        return cleaned


@admin.register(Freeze)
class FreezeAdmin(FormForTheUser, admin.ModelAdmin):
    """Freezes in force first. Adding one freezes at once (its commit is the moment); "Lift" resumes
    the runs it held."""

    form = FreezeForm
    list_display = ("scope", "target", "state", "reason", "created_by", "created_at", "lifted_by", "lifted_at")
    list_filter = ("scope", "mode")
    actions = ("lift_selected",)
    ordering = ("lifted_at", "-created_at")

    def save_model(self, request, obj, form, change):
        pass  # freeze_set saved it (in the form's clean), audited

    def has_module_permission(self, request):
        return access.can_freeze(user=request.user)

    def has_view_permission(self, request, obj=None):
        return access.can_freeze(user=request.user)

    def has_add_permission(self, request):
        return access.can_freeze(user=request.user)

    def has_change_permission(self, request, obj=None):
        return False  # a freeze is set or lifted, never edited

    def has_delete_permission(self, request, obj=None):
        return False

    def has_lift_permission(self, request):
        return access.can_freeze(user=request.user)

    @admin.display(description="state")
    def state(self, obj):
        if obj.lifted_at:
            return badge("lifted", "freeze-lifted")
        return badge(f"in force · {obj.mode}", "freeze-active")

    @admin.action(description="Lift selected freezes (the runs they held resume)", permissions=["lift"])
    def lift_selected(self, request, queryset):
        lifted = 0
        for freeze in queryset.filter(lifted_at__isnull=True):
            try:
                freeze_lift(freeze=freeze, acting_user=request.user, note="lifted on the desk")
                lifted += 1
            except WardenError as refused:
                self.message_user(request, f"{freeze}: {refused.message}", messages.ERROR)
        self.message_user(request, f"{lifted} freeze{'' if lifted == 1 else 's'} lifted.", messages.SUCCESS)
