"""The approval queue's decision pages: approve or reject one request, or several at once, through
a confirmation page with a note. Each decision is `approval_decide`, the same service the API
uses, called once per request — so each is permission-checked and audited on its own; this
module only asks for confirmation and reports the outcome."""

import json

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from desk.decision_facts import call_facts
from desk.display import amount_of, compact_arguments, expiry_line, time_to_expiry
from approvals_app.models import Approval, ApprovalStatus
from approvals_app.errors import ApprovalRefusal
from approvals_app.services import approval_approvers
from config.errors import WardenError
from engine.actions.approvals import EDIT_REASON_CHARS, approval_decide, approval_edit
from access import policy as access
from tools_app.outcomes import CUSTOMER_MESSAGE_CHARS, decision_text
from tools_app.registry import tool_get

DECISIONS = {"approve": "Approve", "reject": "Reject"}
# A bulk decision covers at most this many requests (one page of the queue, and then some).
BULK_LIMIT = 100


class DecisionForm(forms.Form):
    note = forms.CharField(
        label="Internal note", widget=forms.Textarea(attrs={"rows": 3, "cols": 70}), required=False, max_length=2000, strip=True
    )
    customer_message = forms.CharField(
        label="Message for the customer", widget=forms.Textarea(attrs={"rows": 2, "cols": 70}), required=False,
        max_length=CUSTOMER_MESSAGE_CHARS, strip=True,
        help_text="Optional. The model passes it on to the customer, word for word, after “An operator declined it.”",
    )

    def __init__(self, *args, decision: str, **kwargs):
        super().__init__(*args, **kwargs)
        if decision == "reject":
            # The note is for the next operator and the audit trail: a rejection without a reason helps nobody.
            self.fields["note"].required = True
            self.fields["note"].help_text = "Required. For the desk and the audit trail only: the customer and the model never see it."
        else:
            del self.fields["customer_message"]
            self.fields["note"].help_text = "Optional. For the desk and the audit trail only: the customer and the model never see it."


def requests_text(count: int) -> str:
    """ "1 request", "3 requests"."""
    return f"{count} request{'' if count == 1 else 's'}"


def _decided_message(decision: str, calls) -> str:
    what = "; ".join(f"{call.tool_name} ({compact_arguments(call.arguments)})" for call in calls)
    if decision == "approve":
        return f"Approved: {what}. The run resumes and executes it."
    return f"Rejected: {what}. The customer is told: {decision_text(rejected_by_customer=False)}"


def _approval_shown(request, model_admin, object_id: str):
    """The approval a page is about, or (None, the admin's "does not exist" redirect); PermissionDenied
    when the user may not see it."""
    approval = model_admin.get_object(request, unquote(object_id))
    if approval is None:
        return None, model_admin._get_obj_does_not_exist_redirect(request, model_admin.model._meta, object_id)
    if not model_admin.has_view_permission(request, approval):
        raise PermissionDenied
    return approval, None


def approval_decide_view(request, *, model_admin, object_id: str, decision: str):
    opts = model_admin.model._meta
    approval, missing = _approval_shown(request, model_admin, object_id)
    if missing:
        return missing
    change_url = reverse("admin:approvals_app_approval_change", args=[approval.pk])
    form = DecisionForm(request.POST or None, decision=decision)
    status = 200
    refusal = access.why_not_a_decider(user=request.user, approval=approval)
    # Without the permission in their own right, a stand-in decides in the name of whom they stand in for.
    principal = access.stand_in_for(user=request.user, approval=approval) if refusal else None
    if principal is not None:
        refusal = ""
    if refusal:
        # The action refuses too; this answers before anything is attempted.
        messages.error(request, f"You may not decide this approval: {refusal}")
        status = 403
    elif request.method == "POST" and form.is_valid():
        try:
            approval_decide(approval=approval, decision=decision, note=form.cleaned_data["note"], acting_user=request.user,
                            customer_message=form.cleaned_data.get("customer_message", ""), on_behalf_of=principal)
        except WardenError as error:
            if error.code is ApprovalRefusal.NOT_PERMITTED:
                messages.error(request, error.message)
                status = 403
            else:
                (messages.warning if error.code is ApprovalRefusal.ALREADY_DECIDED else messages.error)(request, error.message)
                return HttpResponseRedirect(change_url)
        else:
            approval.refresh_from_db(fields=["status"])
            if approval.status == ApprovalStatus.PENDING:
                # One approval of a quorum: recorded, nothing executes until the last one.
                approved = len(approval_approvers(approval=approval))
                messages.success(request, f"Your approval is recorded: {approved} of {approval.required_approvals} approvals "
                                          f"for {approval.tool_call.tool_name}. It runs once another operator approves it.")
            else:
                messages.success(request, _decided_message(decision, [approval.tool_call]))
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
        "step_label": DECISIONS[decision],
        "form": form,
        "can_decide": status == 200 and approval.status == ApprovalStatus.PENDING,
        "refusal": refusal,
        "standing_in": f"You decide for {principal.get_username()} (standing in)." if principal is not None else "",
        "arguments": model_admin.arguments_pretty(approval),
        "facts": call_facts(tool_call=approval.tool_call),
        "rule": model_admin.rule_applied(approval),
        "expiry": expiry_line(approval.expires_at, pending=approval.status == ApprovalStatus.PENDING),
        "change_url": change_url,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/approvals_app/approval/decide.html", context, status=status)


class EditForm(forms.Form):
    """One field per argument the tool declares (its pydantic model), as text — the tool's schema
    is the judge of what is valid, in the action — and the reason."""

    def __init__(self, *args, arguments: dict[str, str], current: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.structured = set()
        for name, description in arguments.items():
            value = current.get(name, "")
            if isinstance(value, (dict, list)):
                # Anything but a scalar is edited as JSON.
                self.structured.add(name)
                value = json.dumps(value)
            self.fields[f"arg_{name}"] = forms.CharField(
                label=name, initial="" if value is None else str(value), required=False, strip=True,
                help_text=description, widget=forms.TextInput(attrs={"class": "desk-edit-field", "autocomplete": "off"}))
        self.fields["reason"] = forms.CharField(
            label="Reason", widget=forms.Textarea(attrs={"rows": 3, "cols": 70}), max_length=EDIT_REASON_CHARS, strip=True,
            help_text="Required. Why the call should run with these arguments: for the desk and the audit trail; "
                      "the customer never sees it.")

    def arguments(self) -> dict:
        """The edited arguments: a field left empty is left out (the tool's default, or its
        schema's refusal if it is required)."""
        edited = {}
        for key, value in self.cleaned_data.items():
            if not key.startswith("arg_") or value == "":
                continue
            name = key[len("arg_"):]
            if name in self.structured:
                try:
                    value = json.loads(value)
                except ValueError:
                    raise WardenError(ApprovalRefusal.INVALID_EDIT, f"{name}: not valid JSON") from None
            edited[name] = value
        return edited


def approval_edit_view(request, *, model_admin, object_id: str):
    """Change a pending write's arguments before deciding (engine.actions.approvals.approval_edit):
    the page shows the call as asked, a field per argument and the reason; a refused edit says
    why and changes nothing."""
    opts = model_admin.model._meta
    approval, missing = _approval_shown(request, model_admin, object_id)
    if missing:
        return missing
    change_url = reverse("admin:approvals_app_approval_change", args=[approval.pk])
    call = approval.tool_call
    tool = tool_get(call.tool_name)
    status = 200
    refusal = access.why_not_an_editor(user=request.user, approval=approval)
    if not refusal and approval.status != ApprovalStatus.PENDING:
        refusal = f"Already {approval.status}: it can no longer be edited."
    if not refusal and tool is None:
        refusal = f"The tool {call.tool_name} is not installed here; its calls cannot be edited."
    form = EditForm(request.POST or None, arguments=tool.argument_fields(), current=call.arguments) if tool else None
    if refusal:
        messages.error(request, f"You may not edit this request: {refusal}")
        status = 403
    elif request.method == "POST" and form.is_valid():
        try:
            approval_edit(approval=approval, arguments=form.arguments(), reason=form.cleaned_data["reason"],
                          acting_user=request.user)
        except WardenError as error:
            messages.error(request, error.message)
            status = 403 if error.code is ApprovalRefusal.NOT_PERMITTED else 422
        else:
            approval.refresh_from_db()
            needs = (f"{approval.required_approvals} operators' approvals" if approval.required_approvals > 1
                     else "an operator's approval")
            money = tool.money_text(approval.tool_call.arguments)
            messages.success(request, f"Changed: {call.tool_name} ({compact_arguments(approval.tool_call.arguments)})"
                                      f"{f' — {money}' if money else ''}. It now needs {needs}; "
                                      "approvals given before the edit no longer count.")
            return HttpResponseRedirect(change_url)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Edit {call.tool_name} before deciding",
        "step_label": "Edit arguments",
        "opts": opts,
        "app_label": opts.app_label,
        "original": approval,
        "approval": approval,
        "form": form,
        "can_edit": not refusal,
        "refusal": refusal,
        "arguments": model_admin.arguments_pretty(approval),
        "asked": compact_arguments(call.proposed_arguments) if call.proposed_arguments is not None else "",
        "rule": model_admin.rule_applied(approval),
        "expiry": expiry_line(approval.expires_at, pending=approval.status == ApprovalStatus.PENDING),
        "change_url": change_url,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/approvals_app/approval/edit.html", context, status=status)


def _row(approval: Approval, user) -> dict:
    refusal = access.why_cannot_decide(user=user, approval=approval)
    return {
        "approval": approval,
        "amount": amount_of(approval.tool_call.arguments),
        "order": (approval.tool_call.arguments or {}).get("order_id", ""),
        "arguments": compact_arguments(approval.tool_call.arguments),
        "customer": approval.run.session.owner.get_username(),
        "expiry": time_to_expiry(approval.expires_at) if approval.status == ApprovalStatus.PENDING else "—",
        "refusal": refusal,
    }


def approvals_decide_action(model_admin, request, queryset, *, decision: str):
    """The changelist actions "Approve / Reject selected…": a confirmation page lists what will be
    decided (and what will be skipped, and why), then each request is decided on its own."""
    approvals = list(queryset.select_related("run__session__owner", "tool_call", "decided_by").order_by("requested_at")[:BULK_LIMIT + 1])
    if len(approvals) > BULK_LIMIT:
        messages.error(request, f"Select at most {BULK_LIMIT} requests at once.")
        return None
    rows = [_row(approval, request.user) for approval in approvals]
    form = DecisionForm(request.POST if request.POST.get("confirm") == "yes" else None, decision=decision)
    if request.POST.get("confirm") == "yes" and form.is_valid():
        decided = []
        for row in rows:
            approval = row["approval"]
            try:
                approval_decide(approval=approval, decision=decision, note=form.cleaned_data["note"], acting_user=request.user,
                                customer_message=form.cleaned_data.get("customer_message", ""))
            except WardenError as error:
                messages.warning(request, f"Not {decision}d — {approval.tool_call.tool_name} "
                                          f"({compact_arguments(approval.tool_call.arguments)}): {error.message}")
                continue
            approval.refresh_from_db(fields=["status"])
            if approval.status == ApprovalStatus.PENDING:
                # One approval of a quorum: recorded, it needs another operator before it runs.
                messages.info(request, f"Your approval of {approval.tool_call.tool_name} "
                                       f"({compact_arguments(approval.tool_call.arguments)}) is recorded: "
                                       f"{len(approval_approvers(approval=approval))} of {approval.required_approvals} approvals.")
                continue
            decided.append(approval.tool_call)
        if decided:
            messages.success(request, f"{requests_text(len(decided))} — " + _decided_message(decision, decided))
        return None
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{DECISIONS[decision]} {requests_text(len(rows))}?",
        "opts": opts,
        "app_label": opts.app_label,
        "rows": rows,
        "decidable": sum(1 for row in rows if not row["refusal"]),
        "decision": decision,
        "decision_label": DECISIONS[decision],
        "form": form,
        "action": f"{decision}_selected",
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/approvals_app/approval/decide_bulk.html", context,
                            status=400 if request.POST.get("confirm") == "yes" else 200)
