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
    APPROVAL_EXPIRED = "approval_expired"
    APPROVAL_WITHDRAWN = "approval_withdrawn"
    INPUT_REQUESTED = "input_requested"
    INPUT_ANSWERED = "input_answered"
    APPROVAL_EXPIRING = "approval_expiring"
    RECONCILIATION_ESCALATED = "reconciliation_escalated"
    INPUT_QUEUED = "input_queued"
    INPUT_CLASSIFIED = "input_classified"
    INPUT_APPLIED = "input_applied"
    CANCEL_REQUESTED = "cancel_requested"
    RUN_RETRIED = "run_retried"


class LiveDeltaKind(models.TextChoices):
    """Stream pieces announced on the channel layer but never stored one row per token."""

    TEXT_DELTA = "text_delta"
    TOOL_CALL_DELTA = "tool_call_delta"
