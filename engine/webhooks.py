"""Delivering the webhook outbox (runs_app.notifications; docs/OPERATIONS.md, "Notifications").

A delivery is claimed with a locking read that skips rows others hold and a claim that expires
(`claimed_until`), its attempt row is committed, and only then does the request go out — outside
any transaction, so no run waits on a receiver. The outcome is recorded only while the claim is
still ours. A deliverer that dies mid-attempt leaves its claim to expire and an unfinished
attempt row; the next deliverer sends the same delivery again, with the same `webhook-id`, so a
receiver that de-duplicates by it sees every notification once. Failures (no answer, or anything
but 2xx) are retried with exponential backoff and jitter, up to WARDEN_WEBHOOK_MAX_ATTEMPTS.

Who delivers: a django-q2 task asked for after each commit that wrote deliveries
(`engine.tasks.deliver_webhooks`), a thread of `manage.py sweep --loop`, and the sweeper's
schedule — any number at once, since the claim decides.
"""

import logging
import random
import time
from datetime import timedelta

import httpx
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from config.logs import log_context
from config.tracing import span, span_set
from runs_app import liveness
from runs_app.models import DeliveryStatus, WebhookAttempt, WebhookDelivery
from runs_app.notifications import webhook_body_bytes, webhook_signature

logger = logging.getLogger("warden.webhooks")

_CLAIM_SQL = """
UPDATE "runs_app_webhookdelivery"
SET "claimed_by" = %s, "claimed_until" = now() + %s * interval '1 second', "attempts" = "attempts" + 1
WHERE "id" = (
    SELECT "id" FROM "runs_app_webhookdelivery"
    WHERE "status" = 'pending' AND "next_attempt_at" <= now() AND ("claimed_until" IS NULL OR "claimed_until" < now())
    ORDER BY "next_attempt_at" LIMIT 1 FOR UPDATE SKIP LOCKED
)
RETURNING "id", "attempts"
"""


def claim_seconds() -> float:
    """How long a claim outlives its attempt's start: a request cannot outlast it."""
    return 2 * settings.WARDEN_WEBHOOK_TIMEOUT_SECONDS + 5


def retry_delay(attempts: int) -> float:
    delay = min(settings.WARDEN_WEBHOOK_RETRY_BASE_SECONDS * 2 ** (attempts - 1), 3600)
    return delay * random.uniform(0.8, 1.2)


def webhooks_deliver_due(*, limit: int = 50, budget_seconds: float = 30.0) -> int:
    """Attempt deliveries that are due, one claim at a time, until none is left, `limit` attempts
    were made or `budget_seconds` passed. Returns the number of attempts made."""
    deliverer = liveness.process_identity()
    ends = time.monotonic() + budget_seconds
    made = 0
    with httpx.Client(timeout=settings.WARDEN_WEBHOOK_TIMEOUT_SECONDS, trust_env=False, follow_redirects=False) as client:
        while made < limit and time.monotonic() < ends:
            claimed = _claim(deliverer)
            if claimed is None:
                break
            _attempt(client, claimed, deliverer)
            made += 1
    return made


def _claim(deliverer: str):
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_CLAIM_SQL, [deliverer, claim_seconds()])
            row = cursor.fetchone()
        if row is None:
            return None
        delivery = WebhookDelivery.objects.select_related("endpoint").get(pk=row[0])
        # Written before the request leaves: an attempt cut short by a crash stays visible.
        attempt = WebhookAttempt.objects.create(delivery=delivery, number=row[1], deliverer=deliverer,
                                                started_at=timezone.now())
    return delivery, attempt


def _attempt(client: httpx.Client, claimed, deliverer: str) -> None:
    delivery, attempt = claimed
    body = webhook_body_bytes(delivery.body)
    timestamp = int(time.time())
    webhook_id = str(delivery.id)
    headers = {
        "content-type": "application/json",
        "user-agent": "Warden-Webhooks/1",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": webhook_signature(secret=delivery.endpoint.secret, webhook_id=webhook_id,
                                               timestamp=timestamp, body=body),
    }
    status_code, error, excerpt = None, "", ""
    with log_context(run_id=str(delivery.run_id) if delivery.run_id else None), span(
        "webhook.delivery", delivery=webhook_id, kind=delivery.kind, attempt=attempt.number, endpoint=delivery.endpoint_id,
        run_id=delivery.run_id,
    ) as current:
        try:
            response = client.post(delivery.endpoint.url, content=body, headers=headers)
            status_code, excerpt = response.status_code, response.text[:500]
            if not 200 <= status_code < 300:
                error = f"HTTP {status_code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
        span_set(current, status_code=status_code, error=error or None)
    _record(delivery, attempt, deliverer=deliverer, status_code=status_code, error=error, excerpt=excerpt)


def _record(delivery: WebhookDelivery, attempt: WebhookAttempt, *, deliverer: str, status_code, error: str, excerpt: str) -> None:
    now = timezone.now()
    ours = WebhookDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING, claimed_by=deliverer,
                                          attempts=attempt.number)
    released = {"claimed_by": "", "claimed_until": None, "last_status_code": status_code, "last_error": error}
    with transaction.atomic():
        WebhookAttempt.objects.filter(pk=attempt.pk).update(finished_at=now, status_code=status_code, error=error,
                                                            response_excerpt=excerpt)
        if not error:
            updated = ours.update(status=DeliveryStatus.DELIVERED, delivered_at=now, **released)
            outcome = "delivered"
        elif attempt.number >= settings.WARDEN_WEBHOOK_MAX_ATTEMPTS:
            updated = ours.update(status=DeliveryStatus.FAILED, **released)
            outcome = "failed"
        else:
            updated = ours.update(next_attempt_at=now + timedelta(seconds=retry_delay(attempt.number)), **released)
            outcome = "retry"
    if not updated:
        # Our claim ran out and another deliverer took the delivery over; its outcome stands.
        outcome = "claim-lost"
    log = logger.info if outcome == "delivered" else logger.warning
    log("webhook %s (%s) attempt %d to %s: %s%s", delivery.id, delivery.kind, attempt.number, delivery.endpoint.url,
        outcome, f" ({error})" if error else "",
        extra={"webhook_id": str(delivery.id), "attempt": attempt.number, "outcome": outcome})
