"""Tool calls over HTTP: list and read them, and — for operators with
tools_app.reconcile_toolcall — resolve calls whose outcome is unknown, by asking the
downstream system again or by recording what happened with evidence (SPEC §6)."""

import uuid
from datetime import datetime
from typing import Literal

from django.core.exceptions import ObjectDoesNotExist
from ninja import Field, Query, Router, Schema

from tools_app.errors import ToolCallRefusal
from config.pagination import CURSOR_PATTERN
from config.errors import CommonRefusal, WardenError
from config.fair_share import session_turn
from api.errors import not_found
from api.base import COMMON_ERRORS, BodyIn, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, ShownJSON, StorableJSON, StorableText, errors
from tools_app.models import Resolution, ToolCallStatus, ToolEffect
from engine.actions.reconciliation import tool_call_reconcile_auto, tool_call_resolve
from access import policy as access
from tools_app.outcomes import tool_call_customer_text
from tools_app.registry import tool_get
from tools_app.selectors import tool_call_get, tool_call_list

router = Router(tags=["tool calls"])


class ToolCallOut(Schema):
    id: uuid.UUID
    run_id: uuid.UUID
    step_id: int
    index: int
    tool_call_id: str = Field(description="the model's id of the call (not a business key)")
    tool_name: str
    arguments: ShownJSON = Field(description="what executes (or executed)")
    proposed_arguments: ShownJSON = Field(None, description="what the model asked, when an operator edited the arguments "
                                                      "before approving; null otherwise")
    effect: ToolEffect
    status: ToolCallStatus
    attempts: int
    idempotency_key: str | None
    business_key: str | None = Field(description="the write's business key: the same in every run and session that "
                                                 "asks for the same business fact (docs/EXTENDING.md)")
    reused_from: uuid.UUID | None = Field(description="the earlier call with the same key whose outcome answered "
                                                     "this one; this call was not executed")
    reused_from_run: uuid.UUID | None = Field(description="that call's run, when the caller may see it")
    money: str | None = Field(description='the amount with its currency, as the tool declares them, e.g. "9.00 EUR"')
    result: ShownJSON
    error_code: str
    error_detail: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    approval_id: uuid.UUID | None
    reconcile_attempts: int
    next_attempt_at: datetime | None
    resolution: Resolution | None
    resolved_by: str | None = Field(description="the operator; null when reconciled automatically or unresolved")
    resolved_at: datetime | None
    evidence: str = Field(description="what showed an unknown call's outcome; for the desk: the session's customer gets \"\"")
    message: str = Field(description="where the call stands in plain words, for the customer")

    @staticmethod
    def resolve_approval_id(call) -> uuid.UUID | None:
        try:
            return call.approval.pk
        except ObjectDoesNotExist:
            return None

    @staticmethod
    def resolve_money(call) -> str | None:
        tool = tool_get(call.tool_name)
        return tool.money_text(call.arguments) if tool is not None else None

    @staticmethod
    def resolve_reused_from(call) -> uuid.UUID | None:
        return call.reused_from_id

    @staticmethod
    def resolve_reused_from_run(call, context) -> uuid.UUID | None:
        if not call.reused_from_id:
            return None
        original = call.reused_from  # rare: a query or two for a call answered by an earlier one
        return original.run_id if access.can_see_run(user=context["request"].auth, run=original.run) else None

    @staticmethod
    def resolve_resolution(call) -> str | None:
        return call.resolution or None

    @staticmethod
    def resolve_resolved_by(call) -> str | None:
        return call.resolved_by.get_username() if call.resolved_by_id else None

    @staticmethod
    def resolve_evidence(call, context) -> str:
        if not call.evidence:
            return ""
        # Every selector that pages tool calls loads run__session with them.
        owner_id = call.run.session.owner_id
        return call.evidence if access.reads_desk_notes(user=context["request"].auth, session_owner_id=owner_id) else ""

    @staticmethod
    def resolve_message(call) -> str:
        return tool_call_customer_text(tool_name=call.tool_name, effect=call.effect, status=call.status,
                                       error_code=call.error_code, error_detail=call.error_detail)


class ToolCallPage(Schema):
    items: list[ToolCallOut]
    next_cursor: str | None


class ResolveIn(BodyIn):
    applied: bool = Field(description="true: the downstream system did apply it (→ succeeded); false: it did not (→ failed)")
    evidence: StorableText = Field(min_length=1, max_length=5000, description="what shows it, e.g. the ledger entry")
    result: StorableJSON | None = Field(None, description="the call's result when applied")


class ReconcileOut(Schema):
    outcome: Literal["resolved", "unresolved", "manual"] = Field(
        description="`resolved`: the downstream system answered; `unresolved`: it could not tell yet (retried "
                    "automatically); `manual`: an operator must resolve it")
    tool_call: ToolCallOut


def _visible_call(request, tool_call_id):
    call = tool_call_get(tool_calls=access.visible_tool_calls(user=request.auth), tool_call_id=tool_call_id)
    if call is None:
        raise not_found("tool call")
    return call


def _reconcilable(request, tool_call_id):
    call = _visible_call(request, tool_call_id)
    if refusal := access.why_not_a_reconciler(user=request.auth, tool_call=call):
        raise WardenError(CommonRefusal.NOT_PERMITTED, refusal)
    if call.status != ToolCallStatus.UNKNOWN:
        raise WardenError(ToolCallRefusal.NOT_UNKNOWN, f"This tool call is {call.status}, not unknown; nothing to reconcile.")
    return call


@router.get("", response={200: ToolCallPage, **COMMON_ERRORS}, summary="List tool calls")
def tool_calls_list(
    request,
    status: list[ToolCallStatus] = Query(None, description="e.g. unknown; repeat for several"),
    run: uuid.UUID | None = None,
    tool: str | None = Query(None, max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$"),
    cursor: str | None = Query(None, max_length=60, pattern=CURSOR_PATTERN,
                                 description="`next_cursor` of the page before"),
    limit: int = Query(DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE),
):
    """Tool calls the caller may see, newest first. `?status=unknown` is the reconciliation queue."""
    items, next_cursor = tool_call_list(tool_calls=access.visible_tool_calls(user=request.auth), statuses=status, run_id=run,
                                        tool_name=tool, cursor=cursor, limit=limit)
    return {"items": items, "next_cursor": next_cursor}


@router.get("/{tool_call_id}", response={200: ToolCallOut, **COMMON_ERRORS}, summary="Tool call detail")
def tool_calls_get(request, tool_call_id: uuid.UUID):
    return _visible_call(request, tool_call_id)


@router.post(
    "/{tool_call_id}/resolve",
    response={200: ToolCallOut, **COMMON_ERRORS, **errors(400, 403, 409)},
    summary="Record the outcome of an unknown tool call",
)
def tool_calls_resolve(request, tool_call_id: uuid.UUID, payload: ResolveIn):
    """An operator records, with evidence, whether the write took effect downstream. Audited;
    the run resumes once none of its calls is unknown. 403 in one's own session (four eyes);
    409 unless the call is `unknown`."""
    call = _reconcilable(request, tool_call_id)
    with session_turn(call.run.session_id):
        tool_call_resolve(tool_call=call, applied=payload.applied, evidence=payload.evidence, result=payload.result,
                          acting_user=request.auth)
    return _visible_call(request, tool_call_id)


@router.post(
    "/{tool_call_id}/reconcile",
    response={200: ReconcileOut, **COMMON_ERRORS, **errors(403, 409)},
    summary="Ask the downstream system now",
)
def tool_calls_reconcile(request, tool_call_id: uuid.UUID):
    """Runs the tool's reconcile lookup (by idempotency key) now instead of waiting for the
    scheduled job. `manual` means the tool cannot tell: resolve it with evidence instead.
    403 in one's own session (four eyes)."""
    call = _reconcilable(request, tool_call_id)
    with session_turn(call.run.session_id):
        outcome = tool_call_reconcile_auto(tool_call=call, acting_user=request.auth)
    return {"outcome": outcome, "tool_call": _visible_call(request, tool_call_id)}
