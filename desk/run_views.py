"""Cancelling runs from the operators' desk, through `run_cancel_request` (SPEC §9): the
request is recorded and audited; the run stops once no write is in flight."""

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from config.errors import WardenError
from engine.actions.cancel import run_cancel_request
from engine.actions.runs import run_retry
from runs_app.models import Run, RunStatus, WaitReason
from access import policy as access


class CancelForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        max_length=300,
        help_text="Required. Recorded with the request in the audit trail and the run's events.",
    )


def cancel_outcome(run: Run) -> str:
    if run.status == RunStatus.CANCELLED:
        return f"Run {run.pk} is cancelled."
    if run.status == RunStatus.WAITING and run.wait_reason == WaitReason.RECONCILIATION:
        return f"Cancel requested for run {run.pk}: it waits for its unknown write to be reconciled, then stops."
    return f"Cancel requested for run {run.pk}: its worker stops it at the next safe point."


def runs_cancel(request, *, runs, reason: str) -> None:
    """Request a cancel of each run and tell the operator what became of it."""
    for run in runs:
        if not access.can_cancel_run(user=request.user, run=run, even_if_ended=True):
            messages.error(request, f"Run {run.pk}: you may not cancel it.")
            continue
        try:
            run = run_cancel_request(run=run, acting_user=request.user, reason=reason)
        except WardenError as error:
            messages.warning(request, f"Run {run.pk}: {error.message}")
            continue
        messages.success(request, cancel_outcome(run))


def _render(request, model_admin, *, runs, form, bulk: bool, status: int = 200):
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Cancel runs?" if bulk else "Cancel this run?",
        "opts": opts,
        "app_label": opts.app_label,
        "runs": runs,
        "form": form,
        "bulk": bulk,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/runs_app/run/cancel.html", context, status=status)


def run_cancel_view(request, *, model_admin, object_id: str):
    run = model_admin.get_object(request, unquote(object_id))
    if run is None:
        return model_admin._get_obj_does_not_exist_redirect(request, model_admin.model._meta, object_id)
    if not access.can_cancel_run(user=request.user, run=run, even_if_ended=True):
        raise PermissionDenied
    change_url = reverse("admin:runs_app_run_change", args=[run.pk])
    if run.is_terminal:
        messages.warning(request, f"The run is already {run.status}.")
        return HttpResponseRedirect(change_url)
    form = CancelForm(request.POST or None)
    if request.method == "POST":
        if form.is_valid():
            runs_cancel(request, runs=[run], reason=form.cleaned_data["reason"])
            return HttpResponseRedirect(change_url)
        return _render(request, model_admin, runs=[run], form=form, bulk=False, status=400)
    return _render(request, model_admin, runs=[run], form=form, bulk=False)


def runs_cancel_action(model_admin, request, queryset):
    """The changelist action: an intermediate page asks for the reason, then cancels."""
    if request.POST.get("confirm") == "yes":
        form = CancelForm(request.POST)
        if form.is_valid():
            runs_cancel(request, runs=list(queryset), reason=form.cleaned_data["reason"])
            return None
    else:
        form = CancelForm()
    return _render(request, model_admin, runs=list(queryset), form=form, bulk=True)


def runs_retry_action(model_admin, request, queryset):
    """Retry each selected failed or cancelled run as a new run (audited, naming the operator)."""
    for run in queryset.select_related("session"):
        if not access.can_retry_run(user=request.user, run=run):
            messages.warning(request, f"Run {run.pk}: only a failed or cancelled run you may cancel can be retried.")
            continue
        try:
            retry = run_retry(run=run, acting_user=request.user, reason="retried from the desk")
        except WardenError as error:
            messages.warning(request, f"Run {run.pk}: {error.message}")
            continue
        messages.success(request, f"Run {run.pk} is retried as run {retry.pk}.")
