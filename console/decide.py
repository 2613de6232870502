"""The decision link's page (issue 31, point 1): `/console/decide/<token>/`, the link a notification
carries (approvals_app.links). Signed out, it sends the decider to the console's login and back; signed
in, it shows the request as the desk's decision page does — the call, the money, the rule, the
customer's conversation, the expiry — and whom the decider decides as. A GET changes nothing, not even
the link. Only the page's POST (CSRF) decides, through engine.actions.approvals.approval_decide with the
link, which asks the same access policy as the desk (four eyes, quorum, stand-ins) and spends the link
in the decision's transaction. A used, expired, altered or outdated link, or one the signed-in person
may not use, says why and shows no buttons."""

import json
from dataclasses import dataclass, field

from django.contrib.auth.views import redirect_to_login
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from access import policy as access
from approvals_app.errors import ApprovalRefusal
from approvals_app.links import LinkTampered, link_from_token, why_link_unusable
from approvals_app.models import Approval, ApprovalLink, ApprovalPolicy, ApprovalStatus
from approvals_app.selectors import approval_conversation, approval_read_results
from approvals_app.services import approval_approvers
from config.errors import CommonRefusal, WardenError
from console.actions import DECISION_NOTE_CHARS, console_text, console_write_counted
from console.presenters import tool_label
from console.views import LOGIN_URL
from engine.actions.approvals import approval_decide
from sessions_app.models import MessageRole
from tools_app.outcomes import CUSTOMER_MESSAGE_CHARS, decision_text
from tools_app.registry import tool_get

TEMPLATE = "console/decide.html"
DECISIONS = ("approve", "reject")


@dataclass
class DecisionPage:
    """What the page shows; `refusal` set means it decides nothing and shows no buttons."""

    refusal: str = ""
    outcome: str = ""
    link: ApprovalLink | None = None
    request: dict = field(default_factory=dict)
    acting_as: str = ""

    @property
    def can_decide(self) -> bool:
        return self.link is not None and not self.refusal and not self.outcome


@require_http_methods(["GET", "POST"])
def console_decide_view(request, token: str):
    if not request.user.is_authenticated:
        # The decider signs in and lands back here; nothing about the request is shown before.
        return redirect_to_login(request.get_full_path(), LOGIN_URL)
    try:
        link = link_from_token(token)
    except LinkTampered as error:
        return _render(request, DecisionPage(refusal=str(error)), status=400)
    if link is None:
        return _render(request, DecisionPage(refusal="This link is unknown: no decision link with this number exists "
                                                     "(it may have been erased). It decides nothing."), status=404)
    if request.method == "POST":
        return _decide(request, link)
    refusal, status = _why_not(link=link, user=request.user)
    return _render(request, _page(link=link, user=request.user, refusal=refusal), status=status)


def _why_not(*, link: ApprovalLink, user) -> tuple[str, int]:
    """Why this link may not carry `user`'s decision now ('' if it may), and the page's status —
    the link's own state first, then the access policy, as approval_decide asks them."""
    if why := why_link_unusable(link=link, user=user):
        return why, ApprovalRefusal.LINK_UNUSABLE.status
    if why := access.why_not_a_decider(user=user, approval=link.approval, on_behalf_of=link.on_behalf_of):
        return why, ApprovalRefusal.NOT_PERMITTED.status
    return "", 200


def _decide(request, link: ApprovalLink):
    decision = request.POST.get("decision", "")
    try:
        console_write_counted(request.user)
        if decision not in DECISIONS:
            raise WardenError(ApprovalRefusal.INVALID_DECISION, "Choose Approve or Reject.")
        note = console_text(request.POST.get("note"), field="note", limit=DECISION_NOTE_CHARS)
        customer_message = console_text(request.POST.get("customer_message"), field="message for the customer",
                                        limit=CUSTOMER_MESSAGE_CHARS) if decision == "reject" else ""
        approval = approval_decide(approval=link.approval, decision=decision, note=note, customer_message=customer_message,
                                   acting_user=request.user, link=link)
    except WardenError as error:
        if error.code in (CommonRefusal.THROTTLED, CommonRefusal.BAD_REQUEST, ApprovalRefusal.INVALID_DECISION):
            # Nothing was decided and the link is unspent: the buttons stay, with what went wrong.
            refusal, _ = _why_not(link=link, user=request.user)
            return _render(request, _page(link=link, user=request.user, refusal=refusal), status=error.code.status,
                           problem=error.message)
        link.refresh_from_db()
        return _render(request, _page(link=link, user=request.user, refusal=error.message), status=error.code.status)
    link.refresh_from_db()
    page = _page(link=link, user=request.user, refusal="")
    page.outcome = _outcome(approval=Approval.objects.select_related("tool_call").get(pk=approval.pk), decision=decision)
    return _render(request, page)


def _outcome(*, approval: Approval, decision: str) -> str:
    call = approval.tool_call
    tool = tool_get(call.tool_name)
    money = (tool.money_text(call.arguments) or "") if tool is not None else ""
    what = f"the {call.tool_name} call" + (f" ({money})" if money else "")
    if approval.status == ApprovalStatus.PENDING:
        approved = len(approval_approvers(approval=approval))
        return (f"Your approval is recorded: {approved} of {approval.required_approvals} approvals. "
                f"{what[0].upper()}{what[1:]} is made once another operator approves it.")
    if decision == "approve":
        return f"Approved — the run resumes and makes {what} now."
    told = decision_text(rejected_by_customer=False, customer_message=approval.customer_message)
    return f"Rejected — {what} is not made. The customer is told: {told}"


def _page(*, link: ApprovalLink, user, refusal: str) -> DecisionPage:
    approval = Approval.objects.select_related("run__session__owner", "tool_call", "decided_by").get(pk=link.approval_id)
    # The request itself only to whom the link may carry a decision, or who may see it anyway: an
    # operator's link opened by someone else says why it decides nothing and shows no customer's data.
    shown = not refusal or access.can_see_approval(user=user, approval=approval)
    name = link.decider.get_username()
    acting_as = (f"You decide as {name}, standing in for {link.on_behalf_of.get_username()}."
                 if link.on_behalf_of_id else f"You decide as {name}.")
    return DecisionPage(refusal=refusal, link=link, request=_request_shown(approval) if shown else {}, acting_as=acting_as)


def _request_shown(approval: Approval) -> dict:
    call = approval.tool_call
    tool = tool_get(call.tool_name)
    who = "An operator's approval" if approval.policy == ApprovalPolicy.OPERATOR else "The customer's confirmation"
    rule = (f"agent rule {approval.rule}" if approval.rule
            else f"tool policy: every {call.tool_name}" if tool is not None else "tool no longer registered")
    approvers = approval_approvers(approval=approval)
    return {
        "approval": approval,
        "tool": call.tool_name,
        "label": tool_label(call.tool_name),
        "arguments": [(name, _value_text(value)) for name, value in (call.arguments or {}).items()],
        "asked": [(name, _value_text(value)) for name, value in (call.proposed_arguments or {}).items()],
        "money": (tool.money_text(call.arguments) or "") if tool is not None else "",
        "who": who,
        "rule": rule,
        "rule_reason": approval.rule_reason,
        "quorum": (f"{len(approvers)} of {approval.required_approvals} approvals so far"
                   + (f" (by {', '.join(approvers)})" if approvers else "")) if approval.required_approvals > 1 else "",
        "customer": approval.run.session.owner.get_username(),
        "conversation": [_said(message) for message in approval_conversation(approval=approval)],
        "found": [(read.tool_name, _value_text(read.arguments), _value_text(read.result))
                  for read in approval_read_results(approval=approval)],
    }


def _said(message) -> dict:
    if message.role == MessageRole.TOOL:
        text = f"{message.tool_name or 'tool'} answered: {message.content}"
    elif message.tool_calls:
        asked = ", ".join(f"{call.get('name')}({call.get('arguments')})" for call in message.tool_calls)
        text = f"{message.content} — asks for {asked}".strip(" —")
    else:
        text = message.content
    return {"role": message.role, "text": text[:500] + ("…" if len(text) > 500 else ""), "at": message.created_at}


def _value_text(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _render(request, page: DecisionPage, *, status: int = 200, problem: str = ""):
    response = render(request, TEMPLATE, {"page": page, "problem": problem, "note_chars": DECISION_NOTE_CHARS,
                                          "customer_message_chars": CUSTOMER_MESSAGE_CHARS}, status=status)
    # A decision page is about one moment of one request: never cached, never shown from history.
    response["Cache-Control"] = "no-store"
    return response
