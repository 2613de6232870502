"""Human approval (SPEC §7): a write waits for a recorded decision by an authorized person;
nothing the model writes counts. Each function is one transaction across the approval, its
tool call, the session's history and the run; a change made outside the run's worker takes the
session's lock first, then the run's row, as posting input does (sessions_app.services.session_lock)."""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from pydantic import ValidationError
from django.utils import timezone
from django.utils.timesince import timesince, timeuntil

from approvals_app.errors import ApprovalRefusal
from approvals_app.ledger import ledger_approval_decision, ledger_approval_edit
from approvals_app.links import why_link_unusable
from approvals_app.models import Approval, ApprovalDecision, ApprovalLink, ApprovalPolicy, ApprovalStatus, LinkStage
from approvals_app.services import (
    approval_approvers,
    approval_assignment_set,
    approval_create,
    approval_decision_record,
    approval_event_payload,
    audit_record,
)
from access import policy as access
from config.errors import WardenError
from engine.actions.runs import run_resume
from engine.guards import write_recheck
from agents.limits import TIER_ORDER
from agents.selectors import run_tool
from notifications.notices import approval_notices
from notifications.outbox import deliveries_soon
from engine.state import approval_close, run_event_append, run_transition, tool_call_transition
from runs_app.events import RunEventType
from runs_app.models import Run, RunEvent, RunStatus, WaitReason
from sessions_app.services import messages_append, session_lock
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.outcomes import CUSTOMER_MESSAGE_CHARS, code_text, decision_text
from tools_app.services import tool_call_digest, tool_call_event, tool_call_message


def approval_request(*, run: Run, tool_call: ToolCall, policy: str, lease_token: int, required_approvals: int = 1,
                     rule: str = "", rule_reason: str = "") -> Approval:
    """Suspend the run on a write that needs a human: the Approval row (with the agent's rule that
    asked for it, and why) and `waiting / approval` in one commit."""
    expires_at = timezone.now() + timedelta(seconds=settings.WARDEN_APPROVAL_TTL_SECONDS)
    with transaction.atomic():
        approval = approval_create(run=run, tool_call=tool_call, policy=policy, expires_at=expires_at,
                                   required_approvals=required_approvals, rule=rule, rule_reason=rule_reason)
        run_transition(
            run=run,
            to=RunStatus.WAITING,
            wait_reason=WaitReason.APPROVAL,
            lease_token=lease_token,
            extra_events=[(RunEventType.APPROVAL_REQUESTED, approval_event_payload(approval) | {
                "tool": tool_call.tool_name, "arguments": tool_call.arguments,
            })],
            wait_type="approval",
            request_id=str(approval.id),
            expires_at=expires_at,
            resume_target=str(tool_call.id),
        )
    return approval


def approval_decide(*, approval: Approval, decision: str, note: str = "", acting_user, customer_message: str = "",
                    on_behalf_of=None, link: ApprovalLink | None = None) -> Approval:
    """Approve or reject. Exactly one decision is recorded even when many people click at once
    (a conditional UPDATE on `pending`); the others are refused (ApprovalRefusal.ALREADY_DECIDED) naming the winner.
    Audited. Approval resumes the same run; rejection cancels the tool call and tells the model
    so — in plain words, with `customer_message` if the decider gave one; the `note` is the
    decider's own, for the desk and the audit trail, and the model never sees it.

    `on_behalf_of`: the person `acting_user` stands in for (a delegation in force; both names are
    recorded). Left out, a user who may not decide for want of the permission alone decides for the
    first delegator they may stand in for (access.stand_in_for). `link`: the notification link the
    decision came through (approvals_app.links): it must still be usable by `acting_user` for the
    call as it stands, and is spent in the decision's transaction — a refused decision leaves it."""
    if decision not in ("approve", "reject"):
        raise WardenError(ApprovalRefusal.INVALID_DECISION, f"decision must be 'approve' or 'reject', not {decision!r}")
    customer_message = " ".join((customer_message or "").split())
    if len(customer_message) > CUSTOMER_MESSAGE_CHARS:
        raise WardenError(ApprovalRefusal.INVALID_DECISION,
                          f"The message for the customer may hold at most {CUSTOMER_MESSAGE_CHARS} characters.")
    approval = Approval.objects.select_related("run__session", "tool_call").get(pk=approval.pk)
    if link is not None:
        if link.approval_id != approval.pk:
            raise WardenError(ApprovalRefusal.LINK_UNUSABLE, "This link is for another request.")
        if why := why_link_unusable(link=link, user=acting_user):
            raise WardenError(ApprovalRefusal.LINK_UNUSABLE, why)
        on_behalf_of = link.on_behalf_of
    refusal = access.why_not_a_decider(user=acting_user, approval=approval, on_behalf_of=on_behalf_of)
    if refusal and on_behalf_of is None and link is None and (
            principal := access.stand_in_for(user=acting_user, approval=approval)):
        on_behalf_of, refusal = principal, ""
    if refusal:
        counted = access.has_approved(user=acting_user, approval=approval) or (
            on_behalf_of is not None and access.has_approved(user=on_behalf_of, approval=approval))
        raise WardenError(ApprovalRefusal.ALREADY_DECIDED if counted else ApprovalRefusal.NOT_PERMITTED, refusal)
    if approval.status == ApprovalStatus.PENDING and approval.expires_at <= timezone.now():
        # Past its expiry a request can no longer be approved, even if the sweeper has not
        # closed it yet: close it now and say so.
        approval_expire(approval=approval)
        raise WardenError(ApprovalRefusal.EXPIRED, f"This request expired at {_clock(approval.expires_at)} "
                                                   f"({_ago(approval.expires_at)}); it can no longer be decided.")
    to = ApprovalStatus.APPROVED if decision == "approve" else ApprovalStatus.REJECTED
    with transaction.atomic():
        session_lock(session_id=approval.run.session_id)  # before the run's row: see session_lock
        if link is not None:
            # Spent here, once: under the session's lock an edit cannot slip between this check and the decision.
            if not Approval.objects.filter(pk=approval.pk, digest=link.digest).exists():
                raise WardenError(ApprovalRefusal.LINK_UNUSABLE, "The request changed after this link was sent "
                                  "(an operator edited it): this link decides nothing.")
            if not ApprovalLink.objects.filter(pk=link.pk, used_at__isnull=True).update(used_at=timezone.now()):
                raise WardenError(ApprovalRefusal.LINK_UNUSABLE, "This link was already used: a link decides once.")
        # Under the session's lock every decision on this approval takes its turn: what is
        # counted here is exact, so a quorum is reached once and executes once — and a person
        # counts once, whether they decided or someone stood in for them.
        people = [acting_user.pk] + ([on_behalf_of.pk] if on_behalf_of is not None else [])
        if approval.required_approvals > 1 and approval.status == ApprovalStatus.PENDING:
            if ApprovalDecision.objects.filter(Q(decided_by_id__in=people) | Q(on_behalf_of_id__in=people),
                                               approval_id=approval.pk, voided_at__isnull=True).exists():
                raise WardenError(ApprovalRefusal.ALREADY_DECIDED, access.ALREADY_APPROVED)
            if Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).exists():
                approval_decision_record(approval=approval, decided_by=acting_user, decision=decision, note=note,
                                         on_behalf_of=on_behalf_of)
                approved = len(approval_approvers(approval=approval))
                if decision == "approve" and approved < approval.required_approvals:
                    return _quorum_progress(approval=approval, acting_user=acting_user, note=note, approved=approved,
                                            on_behalf_of=on_behalf_of)
        elif approval.status == ApprovalStatus.PENDING and Approval.objects.filter(
                pk=approval.pk, status=ApprovalStatus.PENDING).exists():
            approval_decision_record(approval=approval, decided_by=acting_user, decision=decision, note=note,
                                     on_behalf_of=on_behalf_of)
        if approval.status != ApprovalStatus.PENDING or not approval_close(
            approval=approval, to=to, decided_by=acting_user, note=note, customer_message=customer_message,
        ):
            current = Approval.objects.select_related("decided_by").get(pk=approval.pk)
            who = current.decided_by.get_username() if current.decided_by_id else "nobody (the clock)"
            when = f" at {_clock(current.decided_at)} ({_ago(current.decided_at)})" if current.decided_at else ""
            raise WardenError(ApprovalRefusal.ALREADY_DECIDED, f"Already {current.status} by {who}{when}.")
        after = {"status": to} | ({"customer_message": customer_message} if customer_message else {})
        if approval.required_approvals > 1:
            after["approved_by"] = approval_approvers(approval=approval)
        if on_behalf_of is not None:
            after["on_behalf_of"] = on_behalf_of.get_username()
        audit_record(
            actor=acting_user, action=decision, obj=approval, run_id=approval.run_id,
            before={"status": ApprovalStatus.PENDING}, after=after, note=note,
        )
        ledger_approval_decision(approval=approval, decision=decision, acting_user=acting_user, note=note, status=to,
                                 approved_by=after.get("approved_by"), on_behalf_of=on_behalf_of)
        if to == ApprovalStatus.REJECTED:
            tool_call_close_for_decision(approval=approval)
        run_resume(run_id=approval.run_id, wait_reasons=[WaitReason.APPROVAL], event_payload={"approval": str(approval.id)})
    return approval


EDIT_REASON_CHARS = 2000


def approval_edit(*, approval: Approval, arguments: dict, reason: str, acting_user, tool_name: str | None = None) -> Approval:
    """An operator changes a pending write's arguments before it is decided (SPEC §18), saying
    why. The edited call is validated by the tool's schema and re-evaluated as if the model had
    asked for it — its business or per-run key, the agent's limits, the agent's rules — and the
    request goes to the stricter of its tier and the new one (never lower: an operator edited it).
    Every approval so far is void (a quorum starts again), the request's digest is the edited
    call's, and the call keeps what the model asked (`proposed_arguments`). Audited with both
    versions; the run is told (`approval_edited`, and the call as it now stands). The run keeps
    waiting: the edit is not a decision. The tool itself is never changed."""
    reason = " ".join((reason or "").split())
    approval = Approval.objects.select_related("run__session", "tool_call").get(pk=approval.pk)
    call = approval.tool_call
    refusal = access.why_not_an_editor(user=acting_user, approval=approval)
    if refusal:
        raise WardenError(ApprovalRefusal.NOT_PERMITTED, refusal)
    if tool_name is not None and tool_name != call.tool_name:
        raise WardenError(ApprovalRefusal.TOOL_CHANGE_REFUSED,
                          f"An edit may change the arguments of this {call.tool_name} call, not the tool ({tool_name!r}). "
                          "Reject it instead, and say what the customer should ask for.")
    if approval.status != ApprovalStatus.PENDING:
        raise WardenError(ApprovalRefusal.ALREADY_DECIDED, f"Already {approval.status}: it can no longer be edited.")
    if approval.expires_at <= timezone.now():
        approval_expire(approval=approval)
        raise WardenError(ApprovalRefusal.EXPIRED, f"This request expired at {_clock(approval.expires_at)}; "
                                                   "it can no longer be edited.")
    if not reason:
        raise WardenError(ApprovalRefusal.INVALID_EDIT, "Say why you change the request: a reason is required.")
    if len(reason) > EDIT_REASON_CHARS:
        raise WardenError(ApprovalRefusal.INVALID_EDIT, f"The reason may hold at most {EDIT_REASON_CHARS} characters.")
    tool = run_tool(run=approval.run, name=call.tool_name)
    if tool is None:
        raise WardenError(ApprovalRefusal.INVALID_EDIT, f"The tool {call.tool_name} is not installed here; "
                                                        "its calls cannot be edited.")
    if not isinstance(arguments, dict):
        raise WardenError(ApprovalRefusal.INVALID_EDIT, "The arguments must be an object of the tool's fields.")
    try:
        validated = tool.arguments.model_validate(arguments)
    except ValidationError as error:
        raise WardenError(ApprovalRefusal.INVALID_EDIT, "The arguments do not fit the tool's schema: " + "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or 'arguments'}: {problem['msg']}"
            for problem in error.errors(include_url=False))) from None
    edited = validated.model_dump(mode="json", exclude_unset=True)
    if edited == call.arguments:
        raise WardenError(ApprovalRefusal.INVALID_EDIT, "Nothing changed: these are the arguments the call has.")
    with transaction.atomic():
        session_lock(session_id=approval.run.session_id)  # before the run's row: see session_lock
        locked = (Approval.objects.select_for_update().filter(pk=approval.pk, status=ApprovalStatus.PENDING)
                  .values_list("policy", "required_approvals", "rule", "rule_reason", "editors").first())
        if locked is not None:
            # As it stands under the lock: an edit a moment ago may have changed it.
            approval.policy, approval.required_approvals, approval.rule, approval.rule_reason, approval.editors = locked
        else:
            current = Approval.objects.get(pk=approval.pk)
            raise WardenError(ApprovalRefusal.ALREADY_DECIDED, f"Already {current.status}: it can no longer be edited.")
        call = ToolCall.objects.select_for_update().get(pk=call.pk)
        digest_before = tool_call_digest(call)
        before = {"arguments": call.arguments, "idempotency_key": call.idempotency_key, "policy": approval.policy,
                  "required_approvals": approval.required_approvals,
                  "approved_by": approval_approvers(approval=approval)}
        recheck = write_recheck(run=approval.run, call=call, tool=tool, arguments=edited, validated=validated)
        if recheck.refused:
            raise WardenError(ApprovalRefusal.INVALID_EDIT, f"Not changed: the edited call would be {recheck.refused}.")
        needed = recheck.requirement
        tier_now, tier_needed = ((TIER_ORDER[approval.policy], approval.required_approvals),
                                 (TIER_ORDER[needed.approval], needed.approvers))
        if tier_needed > tier_now:
            approval.policy, approval.required_approvals = needed.approval, needed.approvers
        approval.rule, approval.rule_reason = needed.rule[:300], needed.reason[:500]
        if tier_needed < tier_now:
            approval.rule_reason = (f"{needed.reason}; it keeps the tier it was asked at, since an operator "
                                    "edited it")[:500]
        if call.proposed_arguments is None:
            call.proposed_arguments = call.arguments  # what the model asked, kept once
        call.arguments, call.guard = edited, recheck.guard
        call.business_key, call.idempotency_key = recheck.business_key, recheck.idempotency_key
        ToolCall.objects.filter(pk=call.pk).update(
            arguments=call.arguments, proposed_arguments=call.proposed_arguments, guard=call.guard,
            business_key=call.business_key, idempotency_key=call.idempotency_key)
        voided = ApprovalDecision.objects.filter(approval_id=approval.pk, voided_at__isnull=True).update(
            voided_at=timezone.now())
        approval.tool_call = call
        approval.digest = tool_call_digest(call)
        if acting_user.pk not in approval.editors:
            approval.editors = [*approval.editors, acting_user.pk]  # a party to the write from now on
        Approval.objects.filter(pk=approval.pk).update(policy=approval.policy, required_approvals=approval.required_approvals,
                                                       rule=approval.rule, rule_reason=approval.rule_reason,
                                                       digest=approval.digest, editors=approval.editors)
        after = {"arguments": call.arguments, "idempotency_key": call.idempotency_key, "policy": approval.policy,
                 "required_approvals": approval.required_approvals, "approved_by": []}
        audit_record(actor=acting_user, action="edit", obj=approval, run_id=approval.run_id, before=before, after=after,
                     note=reason)
        ledger_approval_edit(approval=approval, acting_user=acting_user, digest_before=digest_before, reason=reason,
                             before=before, after=after, approvals_voided=before["approved_by"] if voided else [])
        run_event_append(run_id=approval.run_id, events=[
            tool_call_event(call),
            (RunEventType.APPROVAL_EDITED, {
                **approval_event_payload(approval), "edited_by": acting_user.get_username(), "reason": reason,
                "arguments_before": before["arguments"], "arguments": call.arguments,
                "approvals_voided": before["approved_by"] if voided else [],
            }),
        ])
    return approval


def _quorum_progress(*, approval: Approval, acting_user, note: str, approved: int, on_behalf_of=None) -> Approval:
    """One more approval of a quorum that needs more: audited, announced on the run
    (`approval_progress`), and the request stays pending — nothing executes yet."""
    after = {"status": ApprovalStatus.PENDING, "approvals": approved, "required": approval.required_approvals}
    if on_behalf_of is not None:
        after["on_behalf_of"] = on_behalf_of.get_username()
    audit_record(actor=acting_user, action="approve", obj=approval, run_id=approval.run_id,
                 before={"status": ApprovalStatus.PENDING, "approvals": approved - 1}, after=after, note=note)
    ledger_approval_decision(approval=approval, decision="approve", acting_user=acting_user, note=note,
                             status=ApprovalStatus.PENDING, approved_by=approval_approvers(approval=approval),
                             on_behalf_of=on_behalf_of)
    approver = acting_user.get_username() + (f" for {on_behalf_of.get_username()}" if on_behalf_of is not None else "")
    run_event_append(run_id=approval.run_id, events=[(RunEventType.APPROVAL_PROGRESS, {
        **approval_event_payload(approval), "approver": approver,
    })])
    return approval


def approval_expire(*, approval: Approval, lease_token: int | None = None) -> bool:
    """An approval past its expiry is closed by the clock; its tool call never runs. Without a
    lease (the sweeper, a late click) the waiting run resumes to tell the model."""
    with transaction.atomic():
        session_lock(session_id=_session_of(approval))  # before the run's row: see session_lock
        if not approval_close(approval=approval, to=ApprovalStatus.EXPIRED, decided_by=None,
                              note="expired without a decision", lease_token=lease_token):
            return False
        tool_call_close_for_decision(approval=approval, lease_token=lease_token)
        if lease_token is None:
            run_resume(run_id=approval.run_id, wait_reasons=[WaitReason.APPROVAL], event_payload={"approval": str(approval.id)})
    return True


def approval_expiry_warn(*, approval: Approval) -> bool:
    """An `approval_expiring` event on the run, once per pending approval (so subscribers are told
    in time that nobody has decided yet). False when it was already warned, or is no longer
    pending."""
    with transaction.atomic():
        approval = Approval.objects.select_for_update().select_related("tool_call").filter(
            pk=approval.pk, status=ApprovalStatus.PENDING).first()
        if approval is None or RunEvent.objects.filter(
                run_id=approval.run_id, type=RunEventType.APPROVAL_EXPIRING, payload__approval=str(approval.id)).exists():
            return False
        run_event_append(run_id=approval.run_id, events=[(RunEventType.APPROVAL_EXPIRING, {
            "approval": str(approval.id), "tool_call": str(approval.tool_call_id), "policy": approval.policy,
            "status": approval.status, "expires_at": approval.expires_at.isoformat(), "tool": approval.tool_call.tool_name,
            "arguments": approval.tool_call.arguments,
        })])
    return True


def _clock(moment) -> str:
    return timezone.localtime(moment).strftime("%H:%M:%S %Z, %d %b %Y")


def _ago(moment) -> str:
    """'just now', '42 seconds ago', '3 minutes ago' — never "0 minutes"."""
    seconds = (timezone.now() - moment).total_seconds()
    if abs(seconds) < 5:
        return "just now"
    if abs(seconds) < 60:
        return f"{int(abs(seconds))} seconds {'ago' if seconds > 0 else 'from now'}"
    text = f"{timesince(moment)} ago" if seconds > 0 else f"in {timeuntil(moment)}"
    return text.replace("\xa0", " ")  # plain text (API messages), not HTML


def tool_call_close_for_decision(*, approval: Approval, lease_token: int | None = None) -> None:
    """Rejected, expired or withdrawn: the tool call is cancelled and a tool message tells the
    model why, so the history never holds a dangling tool call. What it says is for the customer
    (tools_app.outcomes): who declined in general terms and the decider's message to them, never
    the decider's note."""
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    if call.status != ToolCallStatus.PENDING:
        return
    reason = {ApprovalStatus.REJECTED: "approval_rejected", ApprovalStatus.WITHDRAWN: "approval_withdrawn"}.get(
        approval.status, "approval_expired")
    if approval.status == ApprovalStatus.REJECTED:
        detail = decision_text(rejected_by_customer=approval.policy == ApprovalPolicy.USER,
                               customer_message=approval.customer_message)
    else:
        detail = code_text(tool_name=call.tool_name, error_code=reason)
    with transaction.atomic():
        session_id = _session_of(approval)
        session_lock(session_id=session_id)  # before the run's row (the announcement writes it): see session_lock
        if tool_call_transition(tool_call=call, to=ToolCallStatus.CANCELLED, lease_token=lease_token, announce=True,
                                error_code=reason, error_detail=detail):
            messages_append(session_id=session_id, messages=[tool_call_message(call)])


def _session_of(approval: Approval):
    return Run.objects.values_list("session_id", flat=True).get(pk=approval.run_id)


def approval_remind(*, approval: Approval) -> bool:
    """The service level's reminder (docs/NOTIFICATIONS.md): the first group is told again, each
    with a new link, once per approval. A conditional UPDATE on `reminded_at` decides who reminds,
    so two sweepers never both do; nothing is decided. False when it was reminded already, was
    escalated, or is no longer pending."""
    with transaction.atomic():
        reminded = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING, policy=ApprovalPolicy.OPERATOR,
                                           reminded_at__isnull=True, escalated_at__isnull=True
                                           ).update(reminded_at=timezone.now())
        if reminded and approval_notices(approval_id=approval.pk, stage=LinkStage.REMINDER,
                                         decider_refusal=access.why_not_a_decider):
            transaction.on_commit(deliveries_soon)
    return bool(reminded)


def approval_escalate(*, approval: Approval, group: str, after: str) -> bool:
    """The service level's escalation: `group` is told (its own links), `escalated_at` and
    `escalated_to` say so on the desk, and an `approval_escalated` event goes on the run — which the
    outbox turns into the group's notices and `approval.escalated` webhooks. Once per approval (a
    conditional UPDATE), under the session's lock like every change of a run made outside its
    worker. It never approves: the request stays pending until someone decides or it expires."""
    with transaction.atomic():
        session_lock(session_id=_session_of(approval))
        now = timezone.now()
        escalated = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING, policy=ApprovalPolicy.OPERATOR,
                                            escalated_at__isnull=True).update(escalated_at=now, escalated_to=group)
        if not escalated:
            return False
        approval = Approval.objects.select_related("tool_call").get(pk=approval.pk)
        run_event_append(run_id=approval.run_id, events=[(RunEventType.APPROVAL_ESCALATED, {
            "approval": str(approval.id), "tool_call": str(approval.tool_call_id), "policy": approval.policy,
            "status": approval.status, "expires_at": approval.expires_at.isoformat(), "escalated_to": group,
            "escalate_after": after, "tool": approval.tool_call.tool_name, "arguments": approval.tool_call.arguments,
        })])
    return True


NO_ASSIGN_PERMISSION = "Assigning requests needs the approvals_app.decide_approval permission."


def approval_assign(*, approvals, assignee, acting_user) -> list[Approval]:
    """Put pending requests in `assignee`'s hands (None: back in nobody's), for the team on shift
    (issue 29). Only someone who may decide operator requests assigns; the assignee must be someone
    who may decide each of them — four eyes and quorums included, asked of the access policy — so a
    request is never handed to a person who could not act on it. All or nothing, in one transaction:
    a refusal names the request and why. Each change is audited (`assign` / `unassign`); a request
    already in those hands is left as it is. Returns the requests that changed."""
    if not access.operator_powers(acting_user)["decide_operator_approvals"]:
        raise WardenError(ApprovalRefusal.NOT_PERMITTED, NO_ASSIGN_PERMISSION)
    ids = sorted(approval.pk for approval in approvals)
    changed = []
    with transaction.atomic():
        # One row lock each, in one order, so two operators assigning overlapping selections take turns.
        locked = list(Approval.objects.select_for_update(no_key=True, of=("self",))
                      .select_related("run__session", "tool_call", "assigned_to").filter(pk__in=ids).order_by("pk"))
        if len(locked) != len(ids):
            raise WardenError(ApprovalRefusal.NOT_PERMITTED, "Some of these requests do not exist (any more).")
        for approval in locked:
            label = f"{approval.tool_call.tool_name} requested {_ago(approval.requested_at)}"
            if not access.can_see_approval(user=acting_user, approval=approval):
                raise WardenError(ApprovalRefusal.NOT_PERMITTED, f"You may not see the request {approval.pk}.")
            if approval.status != ApprovalStatus.PENDING:
                raise WardenError(ApprovalRefusal.ALREADY_DECIDED,
                                  f"{label} is already {approval.status}: only a pending request is assigned.")
            if assignee is not None and (refusal := access.why_not_a_decider(user=assignee, approval=approval)):
                who = "you" if assignee.pk == acting_user.pk else assignee.get_username()
                raise WardenError(ApprovalRefusal.NOT_PERMITTED, f"Not assigned to {who}: {label} — {refusal}")
            if approval.assigned_to_id == (assignee.pk if assignee is not None else None):
                continue
            before = {"assigned_to": approval.assigned_to.get_username() if approval.assigned_to_id else None}
            approval_assignment_set(approval=approval, assignee=assignee)
            audit_record(actor=acting_user, action="assign" if assignee is not None else "unassign", obj=approval,
                         run_id=approval.run_id, before=before,
                         after={"assigned_to": assignee.get_username() if assignee is not None else None})
            changed.append(approval)
    return changed
