"""The approval queue's decision pages: approve or reject one request through a confirmation
page with a note. The decision itself is `approval_decide`, the same service the API uses; this
module only asks for confirmation and reports the outcome."""

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from approvals_app.admin_display import compact_arguments, time_to_expiry
from approvals_app.models import ApprovalStatus
from approvals_app.services import ApprovalAlreadyDecided, ApprovalError, ApprovalNotPermitted
from engine.actions.approvals import approval_decide
from sessions_app import access

DECISIONS = {"approve": "Approve", "reject": "Reject"}


class DecisionForm(forms.Form):
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}), required=False, max_length=2000, strip=True
    )

    def __init__(self, *args, decision: str, **kwargs):
        super().__init__(*args, **kwargs)
        if decision == "reject":
            # The note is what the model is told; a rejection without a reason helps nobody.
            self.fields["note"].required = True
            self.fields["note"].help_text = "Required. The model is told this reason and tells the user."
        else:
            self.fields["note"].help_text = "Optional. Recorded with your decision in the audit trail."


def approval_decide_view(request, *, model_admin, object_id: str, decision: str):
    opts = model_admin.model._meta
    approval = model_admin.get_object(request, unquote(object_id))
    if approval is None:
        return model_admin._get_obj_does_not_exist_redirect(request, opts, object_id)
    if not model_admin.has_view_permission(request, approval):
        raise PermissionDenied
    change_url = reverse("admin:approvals_app_approval_change", args=[approval.pk])
    form = DecisionForm(request.POST or None, decision=decision)
    status = 200
    refusal = access.why_not_a_decider(user=request.user, approval=approval)
    if refusal:
        # The action refuses too; this answers before anything is attempted.
        messages.error(request, f"You may not decide this approval: {refusal}")
        status = 403
    elif request.method == "POST" and form.is_valid():
        try:
            approval_decide(approval=approval, decision=decision, note=form.cleaned_data["note"], acting_user=request.user)
        except ApprovalNotPermitted as error:
            messages.error(request, error.message)
            status = 403
        except ApprovalAlreadyDecided as error:
            messages.warning(request, error.message)
            return HttpResponseRedirect(change_url)
        except ApprovalError as error:
            messages.error(request, error.message)
            return HttpResponseRedirect(change_url)
        else:
            call = approval.tool_call
            if decision == "approve":
                messages.success(request, f"Approved: {call.tool_name} ({compact_arguments(call.arguments)}). The run resumes and executes it.")
            else:
                messages.success(request, f"Rejected: {call.tool_name} ({compact_arguments(call.arguments)}). The model is told why.")
            return HttpResponseRedirect(reverse("admin:approvals_app_approval_changelist"))
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{DECISIONS[decision]} {approval.tool_call.tool_name}?",
        "opts": opts,
        "app_label": opts.app_label,
        "original": approval,
        "approval": approval,
        "decision": decision,
        "decision_label": DECISIONS[decision],
        "form": form,
        "can_decide": status == 200 and approval.status == ApprovalStatus.PENDING,
        "arguments": model_admin.arguments_pretty(approval),
        "read_results": model_admin.read_results(approval),
        "expiry": time_to_expiry(approval.expires_at) if approval.status == ApprovalStatus.PENDING else "—",
        "change_url": change_url,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/approvals_app/approval/decide.html", context, status=status)
