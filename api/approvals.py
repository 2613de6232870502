"""Approvals over HTTP: the queue of what the caller may decide, and the decision itself,
through `approval_decide` like the admin's buttons (SPEC §7)."""

import uuid
from datetime import datetime
from typing import Literal

from django.utils import timezone
from ninja import Field, Query, Router, Schema

from config.pagination import CURSOR_PATTERN
from config.errors import CommonRefusal, WardenError
from approvals_app.errors import ApprovalRefusal
from api.errors import not_found
from approvals_app.models import ApprovalPolicy, ApprovalStatus
from approvals_app.selectors import approval_get, approval_list
from approvals_app.services import approval_approvers
from api.base import COMMON_ERRORS, BodyIn, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, ShownJSON, StorableJSON, StorableText, errors
from engine.actions.approvals import EDIT_REASON_CHARS, approval_decide, approval_edit
from config.fair_share import session_turn
from access import policy as access
from runs_app.events import OPERATOR_ROLE
from tools_app.models import ToolCallStatus
from tools_app.registry import tool_get

router = Router(tags=["approvals"])


class ApprovalToolCallOut(Schema):
    id: uuid.UUID
    tool_name: str
    arguments: ShownJSON = Field(description="what executes if approved")
    proposed_arguments: ShownJSON = Field(None, description="what the model asked, when an operator edited the arguments; "
                                                      "null otherwise")
    status: ToolCallStatus
    idempotency_key: str | None
    money: str | None = Field(description='the amount with its currency, as the tool declares them, e.g. "9.00 EUR"')

    @staticmethod
    def resolve_money(call) -> str | None:
        tool = tool_get(call.tool_name)
        return tool.money_text(call.arguments) if tool is not None else None


class ApprovalOut(Schema):
    id: uuid.UUID
    run_id: uuid.UUID
    session_id: uuid.UUID
    tool_call: ApprovalToolCallOut
    policy: ApprovalPolicy
    status: ApprovalStatus
    requested_at: datetime
    expires_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    note: str = Field(description="the decider's internal note (desk and audit trail): the session's customer gets \"\" "
                                  "unless they decided it themselves")
    customer_message: str = Field(description="what the decider chose to tell the customer; the model is told it")
    can_decide: bool = Field(description="whether the caller may decide it now")
    required_approvals: int = Field(description="distinct operators who must approve (a quorum from the agent's rule); "
                                                "one rejection rejects")
    approved_by: list[str] = Field(description="who has approved so far, in order")
    approvals_missing: int = Field(description="approvals still needed while pending")
    rule: str = Field(description="the agent's rule that asked for this approval; \"\": the tool's own policy")
    rule_reason: str = Field(description="why that rule applied to these arguments")

    @staticmethod
    def resolve_approved_by(approval, context) -> list[str]:
        names = approval_approvers(approval=approval) if approval.required_approvals > 1 else (
            [approval.decided_by.get_username()] if approval.status == ApprovalStatus.APPROVED and approval.decided_by_id else [])
        return _as_seen(names, approval, context)

    @staticmethod
    def resolve_approvals_missing(approval) -> int:
        if approval.status != ApprovalStatus.PENDING:
            return 0
        return approval.required_approvals - (len(approval_approvers(approval=approval)) if approval.required_approvals > 1 else 0)

    @staticmethod
    def resolve_session_id(approval) -> uuid.UUID:
        return approval.run.session_id

    @staticmethod
    def resolve_decided_by(approval, context) -> str | None:
        return _as_seen([approval.decided_by.get_username()], approval, context)[0] if approval.decided_by_id else None

    @staticmethod
    def resolve_note(approval, context) -> str:
        user = context["request"].auth
        if approval.decided_by_id == user.pk or access.reads_desk_notes(user=user, session_owner_id=approval.run.session.owner_id):
            return approval.note
        return ""

    @staticmethod
    def resolve_can_decide(approval, context) -> bool:
        user = context["request"].auth
        return access.can_decide_approval(user=user, approval=approval)


def _as_seen(names: list[str], approval, context) -> list[str]:
    """Usernames as the caller may see them: the session's customer reads "operator" for anyone
    but themselves; whoever reads the desk's notes reads the names."""
    user = context["request"].auth
    if access.reads_desk_notes(user=user, session_owner_id=approval.run.session.owner_id):
        return names
    return [name if name == user.get_username() else OPERATOR_ROLE for name in names]


class ApprovalPage(Schema):
    items: list[ApprovalOut]
    next_cursor: str | None


class DecisionIn(BodyIn):
    decision: Literal["approve", "reject"]
    note: StorableText = Field("", max_length=2000, description="why: an internal note for the desk and the audit trail; "
                                                                 "the customer and the model never see it")
    customer_message: StorableText = Field("", max_length=300, description="on rejection, what the customer is told "
                                                                           "(the model passes it on after \"An operator declined it.\")")


class EditIn(BodyIn):
    arguments: StorableJSON = Field(description="the call's arguments as they should execute, all of them; "
                                                  "validated by the tool's schema")
    reason: StorableText = Field(min_length=1, max_length=EDIT_REASON_CHARS,
                                 description="why: for the desk and the audit trail; the customer never sees it")
    tool: str | None = Field(None, max_length=100, description="the tool, if given: it must be the call's own — "
                                                              "an edit never changes the tool")


def _visible_approval(request, approval_id):
    approval = approval_get(approvals=access.visible_approvals(user=request.auth), approval_id=approval_id)
    if approval is None:
        raise not_found("approval")
    return approval


@router.get("", response={200: ApprovalPage, **COMMON_ERRORS}, summary="List approvals")
def approvals_list(
    request,
    status: list[ApprovalStatus] = Query([ApprovalStatus.PENDING], description="default pending; repeat for several"),
    decidable: bool = Query(True, description="only those the caller may decide now; false: all the caller may see"),
    run: uuid.UUID | None = None,
    cursor: str | None = Query(None, max_length=60, pattern=CURSOR_PATTERN,
                                 description="`next_cursor` of the page before"),
    limit: int = Query(DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE),
):
    """By default the caller's queue: pending approvals they may decide, oldest first —
    user-level confirmations of their own runs and, with approvals_app.decide_approval,
    operator approvals of other people's runs."""
    items, next_cursor = approval_list(
        approvals=access.visible_approvals(user=request.auth), statuses=status,
        decidable=access.decidable_approvals(user=request.auth) if decidable else None, run_id=run, cursor=cursor, limit=limit,
    )
    return {"items": items, "next_cursor": next_cursor}


@router.get("/{approval_id}", response={200: ApprovalOut, **COMMON_ERRORS}, summary="Approval detail")
def approvals_get(request, approval_id: uuid.UUID):
    return _visible_approval(request, approval_id)


@router.post(
    "/{approval_id}/decision",
    response={200: ApprovalOut, **COMMON_ERRORS, **errors(400, 403, 409)},
    summary="Approve or reject",
)
def approvals_decide(request, approval_id: uuid.UUID, payload: DecisionIn):
    """Recorded exactly once, whoever clicks first: a late decision gets 409 naming the
    winner. Approval resumes the run; rejection cancels the tool call and tells the model so, in
    plain words and with `customer_message` — never the `note`."""
    approval = _visible_approval(request, approval_id)
    refusal = access.why_not_a_decider(user=request.auth, approval=approval)
    # Without the permission in their own right, a stand-in decides in the name of whom they stand in for.
    principal = access.stand_in_for(user=request.auth, approval=approval) if refusal else None
    if refusal and principal is None:
        if access.has_approved(user=request.auth, approval=approval):
            # The caller's own approval of this quorum is in (perhaps from a request a moment ago): a conflict.
            raise WardenError(ApprovalRefusal.ALREADY_DECIDED, access.ALREADY_APPROVED)
        # Why, in words (no permission, four eyes and how the caller is a party): nothing about the object.
        raise WardenError(CommonRefusal.NOT_PERMITTED, f"You may not decide this approval. {refusal}")
    if approval.status == ApprovalStatus.PENDING and approval.expires_at <= timezone.now():
        # The sweeper has not closed it yet, but its time is up: no decision can count now.
        raise WardenError(ApprovalRefusal.EXPIRED, "This approval request has expired.")
    with session_turn(approval.run.session_id):
        approval_decide(approval=approval, decision=payload.decision, note=payload.note, acting_user=request.auth,
                        customer_message=payload.customer_message, on_behalf_of=principal)
    return _visible_approval(request, approval_id)


@router.post(
    "/{approval_id}/edit",
    response={200: ApprovalOut, **COMMON_ERRORS, **errors(403, 409)},
    summary="Change a pending write's arguments",
)
def approvals_edit(request, approval_id: uuid.UUID, payload: EditIn):
    """Before deciding, an operator who may decide the request changes the write's arguments
    (never its tool), saying why. The edited call is validated by the tool's schema and re-checked
    against the agent's rules and limits: it goes to a higher tier or quorum if it now needs one,
    every approval so far is void, and the decision that follows binds to the edited call. The
    run keeps waiting for that decision. 422 `invalid_edit` (with the reason) or
    `tool_change_refused` leaves everything as it was."""
    approval = _visible_approval(request, approval_id)
    with session_turn(approval.run.session_id):
        approval_edit(approval=approval, arguments=payload.arguments, reason=payload.reason, acting_user=request.auth,
                      tool_name=payload.tool)
    return _visible_approval(request, approval_id)
