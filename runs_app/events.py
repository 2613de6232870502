"""The types of a run's lifecycle events: the public contract of the event log, the SSE stream
and the console's websocket. Each one, with its payload fields, is documented in
docs/EVENTS.md; `run_write` refuses any other type, and a test checks the document covers
every member."""

from django.db import models


class RunEventType(models.TextChoices):
    RUN_STATUS = "run_status"
    STEP_STARTED = "step_started"
    STEP_COMPLETED = "step_completed"
    STEP_DISCARDED = "step_discarded"
    TOOL_CALL = "tool_call"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    # One approval of a quorum that needs more: the request stays pending.
    APPROVAL_PROGRESS = "approval_progress"
    # An operator changed a pending write's arguments before deciding (SPEC §18).
    APPROVAL_EDITED = "approval_edited"
    APPROVAL_EXPIRED = "approval_expired"
    APPROVAL_WITHDRAWN = "approval_withdrawn"
    INPUT_REQUESTED = "input_requested"
    INPUT_ANSWERED = "input_answered"
    APPROVAL_EXPIRING = "approval_expiring"
    # A pending approval outlived its service level: a second group of deciders is told (it decides nothing).
    APPROVAL_ESCALATED = "approval_escalated"
    RECONCILIATION_ESCALATED = "reconciliation_escalated"
    INPUT_QUEUED = "input_queued"
    INPUT_CLASSIFIED = "input_classified"
    INPUT_APPLIED = "input_applied"
    CANCEL_REQUESTED = "cancel_requested"
    RUN_RETRIED = "run_retried"
    RUN_FORKED = "run_forked"


# What the session's customer reads in place of another person's username (issue 27, finding 8).
OPERATOR_ROLE = "operator"
_PERSON_FIELDS = ("decided_by", "approver", "edited_by", "by")
_PEOPLE_FIELDS = ("approved_by", "approvals_voided")


def event_payload_for_customer(event_type: str, payload: dict, *, customer_username: str) -> dict:
    """The payload as the session's customer sees it (access.policy.reads_desk_notes): an
    operator's note on a decision, reconciliation evidence and an operator's cancel reason
    become `""`, and anyone's username but the customer's own becomes `"operator"` — the fields
    stay, so the shape is the documented one."""
    payload = _without_notes(event_type, payload, customer_username=customer_username)
    names = {field: OPERATOR_ROLE for field in _PERSON_FIELDS
             if isinstance(payload.get(field), str) and payload[field] != customer_username}
    names |= {field: [name if name == customer_username else OPERATOR_ROLE for name in payload[field]]
              for field in _PEOPLE_FIELDS if isinstance(payload.get(field), list)}
    return {**payload, **names} if names else payload


def _without_notes(event_type: str, payload: dict, *, customer_username: str) -> dict:
    if event_type in (RunEventType.APPROVAL_DECIDED, RunEventType.APPROVAL_EXPIRED, RunEventType.APPROVAL_WITHDRAWN,
                      RunEventType.APPROVAL_PROGRESS):
        if payload.get("note") and payload.get("decided_by") != customer_username:
            return {**payload, "note": ""}
    elif event_type == RunEventType.APPROVAL_EDITED:
        if payload.get("reason"):
            return {**payload, "reason": ""}  # the operator's reason is for the desk and the audit trail
    elif event_type == RunEventType.TOOL_CALL:
        if payload.get("evidence"):
            return {**payload, "evidence": ""}
    elif event_type == RunEventType.CANCEL_REQUESTED:
        if payload.get("reason") and payload.get("by") not in (None, customer_username):
            return {**payload, "reason": ""}
    return payload


class LiveDeltaKind(models.TextChoices):
    """Stream pieces announced on the channel layer but never stored one row per token."""

    TEXT_DELTA = "text_delta"
    TOOL_CALL_DELTA = "tool_call_delta"
