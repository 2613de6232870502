"""Notifications for the moments a person must act (SPEC §17): the transactional outbox.

`notifications_for_events` runs inside `run_write`, in the transaction that writes the run's
events: for each event that is a notification kind (approval requested, escalated or about to
expire, a write handed to a person for reconciliation, a run failed or completed) it writes one
`WebhookDelivery` row per active endpoint subscribed to that kind — and for an approval requested or
escalated, the deciders' own notices (notifications.notices: e-mails and chat messages, each with a
decision link). So a notification exists
exactly when its event committed; a rolled-back transaction leaves neither. Delivery — signed,
retried with backoff, outside any run's transaction — is engine/webhooks.py.
"""

import base64
import hashlib
import hmac
import json
import logging
from typing import Iterable

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.tasks import async_task

from approvals_app.models import LinkStage
from runs_app.events import RunEventType
from notifications.models import NotificationKind, WebhookDelivery, WebhookEndpoint, WebhookFormat
from notifications.notices import DeciderRefusal, approval_notices, chat_text_message
from runs_app.models import RunEvent, RunStatus

# The task that delivers what is due (engine/tasks.py), by the dotted path django-q2 stores: asked
# for after the commit that wrote deliveries, so they go out now rather than at the next sweep.
DELIVER_TASK = "engine.tasks.deliver_webhooks"

logger = logging.getLogger("warden.webhooks")


def notification_kind(event_type: str, payload: dict) -> str | None:
    """The notification an event stands for, if any."""
    if event_type == RunEventType.APPROVAL_REQUESTED:
        return NotificationKind.APPROVAL_REQUESTED
    if event_type == RunEventType.APPROVAL_EXPIRING:
        return NotificationKind.APPROVAL_EXPIRING
    if event_type == RunEventType.APPROVAL_ESCALATED:
        return NotificationKind.APPROVAL_ESCALATED
    if event_type == RunEventType.RECONCILIATION_ESCALATED:
        return NotificationKind.RECONCILIATION_NEEDED
    if event_type == RunEventType.RUN_STATUS:
        status = payload.get("status")
        if status == RunStatus.FAILED:
            return NotificationKind.RUN_FAILED
        if status == RunStatus.COMPLETED:
            return NotificationKind.RUN_COMPLETED
    return None


def notifications_for_events(*, run_id, session_id, events: Iterable[RunEvent],
                             decider_refusal: DeciderRefusal | None = None) -> int:
    """Outbox rows for the notification events among `events` (just inserted, same transaction):
    the standard body for standard endpoints, a chat message for chat ones, and for an approval
    requested or escalated the deciders' notices (notifications.notices: e-mails and chat messages
    with their links; `decider_refusal` is the access policy's `why_not_a_decider`). Returns how
    many deliveries were written."""
    wanted = [(kind, event) for event in events if (kind := notification_kind(event.type, event.payload))]
    if not wanted:
        return 0
    endpoints = list(WebhookEndpoint.objects.filter(active=True, kinds__overlap=[kind for kind, _ in wanted]))
    rows = [
        WebhookDelivery(endpoint=endpoint, kind=kind, run_id=run_id, event_seq=event.seq,
                        body=_body_for(endpoint=endpoint, kind=kind, run_id=run_id, session_id=session_id, event=event))
        for kind, event in wanted
        for endpoint in endpoints
        if kind in endpoint.kinds and not (endpoint.format != WebhookFormat.STANDARD and _is_notice(kind, event))
    ]
    WebhookDelivery.objects.bulk_create(rows)
    written = len(rows) + sum(
        approval_notices(approval_id=event.payload["approval"], stage=_NOTICE_STAGES[kind],
                         decider_refusal=decider_refusal, group=event.payload.get("escalated_to", ""),
                         event_seq=event.seq)
        for kind, event in wanted if _is_notice(kind, event))
    if written:
        transaction.on_commit(deliveries_soon)
    return written


# The notifications that tell the deciders themselves, each with their own link (notifications.notices).
_NOTICE_STAGES = {NotificationKind.APPROVAL_REQUESTED: LinkStage.REQUESTED,
                  NotificationKind.APPROVAL_ESCALATED: LinkStage.ESCALATION}


def _is_notice(kind: str, event: RunEvent) -> bool:
    return kind in _NOTICE_STAGES and bool(event.payload.get("approval"))


def _body_for(*, endpoint: WebhookEndpoint, kind: str, run_id, session_id, event: RunEvent) -> dict:
    body = _body(kind=kind, run_id=run_id, session_id=session_id, event=event)
    if endpoint.format == WebhookFormat.STANDARD:
        return body
    return chat_text_message(format=endpoint.format, text=f"{NotificationKind(kind).label} (run {run_id})",
                             url=body["data"]["links"]["run"])


def deliveries_soon() -> None:
    """Ask for the delivery task now (after a commit that wrote outbox rows)."""
    try:
        async_task(DELIVER_TASK, task_name="deliver-webhooks")
    except Exception:  # noqa: BLE001 - the sweeper delivers what is due anyway
        logger.warning("could not enqueue webhook delivery; the sweeper will send it", exc_info=True)


def _body(*, kind: str, run_id, session_id, event: RunEvent) -> dict:
    """The Standard Webhooks payload shape: type, timestamp, data. `data` carries the event's own
    payload (docs/EVENTS.md) with the ids and desk links a person needs to act."""
    links = {"run": f"{settings.WARDEN_PUBLIC_URL}/admin/runs_app/run/{run_id}/change/"}
    if event.payload.get("approval"):
        links["approval"] = f"{settings.WARDEN_PUBLIC_URL}/admin/approvals_app/approval/{event.payload['approval']}/change/"
    if kind == NotificationKind.RECONCILIATION_NEEDED and event.payload.get("tool_call"):
        links["tool_call"] = f"{settings.WARDEN_PUBLIC_URL}/admin/tools_app/unknowntoolcall/{event.payload['tool_call']}/change/"
    return {
        "type": str(kind),
        "timestamp": (event.created_at or timezone.now()).isoformat(),
        "data": {"run": str(run_id), "session": str(session_id), "event_seq": event.seq, "event_type": event.type,
                 **event.payload, "links": links},
    }


def webhook_body_bytes(body: dict) -> bytes:
    """The bytes sent (and signed): the same on every attempt."""
    return json.dumps(body, separators=(",", ":"), sort_keys=True, default=str).encode()


def webhook_signature(*, secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """Standard Webhooks: `v1,` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")), the key
    being the base64 after `whsec_`."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def webhook_signature_valid(*, secret: str, webhook_id: str, timestamp: str, body: bytes, signatures: str,
                            tolerance_seconds: int = 300) -> bool:
    """A receiver's check: the timestamp is recent and one of the space-separated signatures
    matches (constant-time)."""
    try:
        sent_at = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs(timezone.now().timestamp() - sent_at) > tolerance_seconds:
        return False
    expected = webhook_signature(secret=secret, webhook_id=webhook_id, timestamp=sent_at, body=body)
    return any(hmac.compare_digest(expected, candidate) for candidate in (signatures or "").split())
