"""The unknown-calls queue's pages: ask the downstream system now, or record the outcome with
evidence. Both call the reconciliation actions the sweeper uses (engine/actions/reconciliation.py);
this module only gathers the operator's input and reports what happened."""

import json
import uuid

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from desk.decision_facts import call_facts
from desk.display import compact_arguments, pretty_json
from config.errors import WardenError
from engine.actions.reconciliation import tool_call_reconcile_auto, tool_call_resolve
from tools_app.errors import ToolCallRefusal
from access import policy as access
from tools_app.models import Resolution, ToolCall


class ResolveForm(forms.Form):
    outcome = forms.ChoiceField(
        choices=[
            (Resolution.APPLIED, "Applied — the downstream system carried it out"),
            (Resolution.NOT_APPLIED, "Not applied — nothing happened downstream"),
        ],
        widget=forms.RadioSelect,
    )
    evidence = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "cols": 70}),
        max_length=4000,
        help_text="Required. What proves the outcome: the downstream reference, a statement line, a ticket.",
    )
    result = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "cols": 70}),
        required=False,
        help_text="Optional, for an applied call: the downstream system's answer as a JSON object. "
        "The model is shown it as the tool's result.",
    )

    def clean_result(self):
        text = self.cleaned_data["result"].strip()
        if not text:
            return None
        try:
            value = json.loads(text, parse_constant=_no_constant)
        except ValueError as error:
            raise forms.ValidationError(f"Not valid JSON: {error}.") from error
        if _holds_nul(value):
            raise forms.ValidationError("The result must not contain NUL characters (\\u0000).")
        if not isinstance(value, dict):
            raise forms.ValidationError("The result must be a JSON object, e.g. {\"refund_id\": \"rf_123\"}.")
        return value

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("outcome") == Resolution.NOT_APPLIED and cleaned.get("result"):
            self.add_error("result", "A call that was not applied has no result; leave this empty.")
        return cleaned


def _holds_nul(value) -> bool:
    # PostgreSQL text (and so jsonb strings and keys) cannot hold NUL.
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


def _no_constant(name: str):
    # NaN and Infinity are not JSON, and PostgreSQL's jsonb refuses them.
    raise ValueError(f"{name} is not a JSON value")


def _queue_url() -> str:
    return reverse("admin:tools_app_unknowntoolcall_changelist")


def _resolved_elsewhere(request, object_id) -> HttpResponseRedirect:
    """The call left the queue (resolved by someone, or never unknown): say so and show it."""
    call = ToolCall.objects.filter(pk=object_id).first() if _is_uuid(object_id) else None
    if call is None:
        messages.warning(request, "No such tool call.")
        return HttpResponseRedirect(_queue_url())
    messages.warning(request, f"This tool call is {call.status}, not unknown; nothing to reconcile.")
    return HttpResponseRedirect(reverse("admin:tools_app_toolcall_change", args=[call.pk]))


def _is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def tool_call_resolve_view(request, *, model_admin, object_id: str):
    object_id = unquote(object_id)
    if not model_admin.has_reconcile_permission(request):
        raise PermissionDenied  # before anything about the call is said
    call = model_admin.get_object(request, object_id)
    if call is None:
        return _resolved_elsewhere(request, object_id)
    form = ResolveForm(request.POST or None)
    status = 200
    refusal = access.why_not_a_reconciler(user=request.user, tool_call=call)
    if refusal:
        # The action refuses too; this answers before anything is attempted.
        messages.error(request, f"You may not record this outcome: {refusal}")
        status = 403
    elif request.method == "POST" and form.is_valid():
        applied = form.cleaned_data["outcome"] == Resolution.APPLIED
        try:
            tool_call_resolve(
                tool_call=call, applied=applied, evidence=form.cleaned_data["evidence"],
                acting_user=request.user, result=form.cleaned_data["result"],
            )
        except WardenError as error:
            if error.code is ToolCallRefusal.NOT_UNKNOWN:
                messages.warning(request, error.message)
                return HttpResponseRedirect(reverse("admin:tools_app_toolcall_change", args=[call.pk]))
            if error.code is ToolCallRefusal.EVIDENCE_REQUIRED:
                form.add_error("evidence", error.message)
                status = 400
            else:
                messages.error(request, error.message)
                status = 403
        else:
            outcome = "applied (succeeded)" if applied else "not applied (failed)"
            messages.success(request, f"Recorded: {call.tool_name} was {outcome}. The run resumes.")
            return HttpResponseRedirect(_queue_url())
    elif request.method == "POST":
        status = 400
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Record the outcome of {call.tool_name}",
        "opts": opts,
        "app_label": opts.app_label,
        "original": call,
        "call": call,
        "arguments": pretty_json(call.arguments),
        "arguments_summary": compact_arguments(call.arguments),
        "facts": call_facts(tool_call=call),
        "form": form,
        "refusal": refusal,
        "change_url": reverse("admin:tools_app_unknowntoolcall_change", args=[call.pk]),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/tools_app/unknowntoolcall/resolve.html", context, status=status)


def tool_call_query_view(request, *, model_admin, object_id: str):
    """POST only: one lookup by idempotency key, right now."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    object_id = unquote(object_id)
    if not model_admin.has_reconcile_permission(request):
        raise PermissionDenied  # before anything about the call is said
    call = model_admin.get_object(request, object_id)
    if call is None:
        return _resolved_elsewhere(request, object_id)
    if refusal := access.why_not_a_reconciler(user=request.user, tool_call=call):
        messages.error(request, f"You may not reconcile this call: {refusal}")
        return HttpResponseRedirect(reverse("admin:tools_app_unknowntoolcall_change", args=[call.pk]))
    outcome = query_downstream(request, call)
    if outcome == "resolved":
        return HttpResponseRedirect(reverse("admin:tools_app_toolcall_change", args=[call.pk]))
    return HttpResponseRedirect(reverse("admin:tools_app_unknowntoolcall_change", args=[call.pk]))


def query_downstream(request, call: ToolCall) -> str:
    """Ask the downstream system about one call and tell the operator what it said."""
    try:
        outcome = tool_call_reconcile_auto(tool_call=call, acting_user=request.user)
    except WardenError as error:
        messages.warning(request, f"{call.tool_name} {call.pk}: {error.message}")
        return "error"
    if outcome == "resolved":
        call.refresh_from_db(fields=["status", "resolution"])
        messages.success(
            request, f"{call.tool_name} {call.pk}: the downstream system answered — {call.resolution.replace('_', ' ')}; "
            f"the call is {call.status} and the run resumes.",
        )
    elif outcome == "unresolved":
        messages.warning(request, f"{call.tool_name} {call.pk}: the downstream system could not tell yet; it is asked again automatically.")
    else:
        messages.warning(
            request, f"{call.tool_name} {call.pk}: no automatic answer (no lookup for this tool, or attempts exhausted); "
            "record the outcome with evidence.",
        )
    return outcome
