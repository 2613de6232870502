"""The one write path of a webhook delivery's state: claimed by a deliverer, an attempt recorded,
delivered, failed for good, or asked to go again at once (the desk). Delivery itself — the HTTP
request, outside any transaction — is engine/webhooks.py. An e-mail delivery's state goes the same
way (`email_delivery_claim`, `email_attempt_record`); sending it is engine/mailer.py."""

import random
from urllib.parse import urlsplit, urlunsplit
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from notifications.models import DeliveryStatus, EmailDelivery, WebhookAttempt, WebhookDelivery

def _claim_sql(table: str, returning: str) -> str:
    """The next due row of an outbox `table` (webhook or e-mail deliveries), claimed: due, not held by
    a live claim, skipping rows another deliverer is claiming this moment."""
    return f"""
UPDATE "{table}"
SET "claimed_by" = %s, "claimed_until" = now() + %s * interval '1 second', "attempts" = "attempts" + 1
WHERE "id" = (
    SELECT "id" FROM "{table}"
    WHERE "status" = 'pending' AND "next_attempt_at" <= now() AND ("claimed_until" IS NULL OR "claimed_until" < now())
    ORDER BY "next_attempt_at" LIMIT 1 FOR UPDATE SKIP LOCKED
)
RETURNING {returning}
"""


_CLAIM_SQL = _claim_sql("runs_app_webhookdelivery", '"id", "attempts"')


def url_redacted(url: str) -> str:
    """A receiver's URL as logs and lists show it (issue 27, finding 9): without the user and
    password before the host and without the query, where receivers put their tokens —
    `https://***@hooks.example.com/in?…`."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    netloc = ("***@" if parts.username or parts.password else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "…" if parts.query else "", ""))


def claim_seconds() -> float:
    """How long a claim outlives its attempt's start: a request cannot outlast it."""
    return 2 * settings.WARDEN_WEBHOOK_TIMEOUT_SECONDS + 5


def retry_delay(attempts: int) -> float:
    delay = min(settings.WARDEN_WEBHOOK_RETRY_BASE_SECONDS * 2 ** (attempts - 1), 3600)
    return delay * random.uniform(0.8, 1.2)


def webhook_delivery_claim(*, deliverer: str):
    """The next due delivery, claimed by `deliverer` until its claim runs out, with its attempt row
    committed — before the request leaves, so an attempt cut short by a crash stays visible. None
    when nothing is due (or another deliverer holds what is)."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_CLAIM_SQL, [deliverer, claim_seconds()])
            row = cursor.fetchone()
        if row is None:
            return None
        delivery = WebhookDelivery.objects.select_related("endpoint").get(pk=row[0])
        attempt = WebhookAttempt.objects.create(delivery=delivery, number=row[1], deliverer=deliverer,
                                                started_at=timezone.now())
    return delivery, attempt


def webhook_attempt_record(*, delivery: WebhookDelivery, attempt: WebhookAttempt, deliverer: str, status_code, error: str,
                           excerpt: str) -> str:
    """An attempt's outcome, and what it makes of the delivery — delivered, failed for good (after
    WARDEN_WEBHOOK_MAX_ATTEMPTS) or due again after a backoff — recorded only while the claim is
    still ours. Returns 'delivered', 'failed', 'retry' or 'claim-lost'."""
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
    # Not updated: our claim ran out and another deliverer took the delivery over; its outcome stands.
    return outcome if updated else "claim-lost"


def webhook_deliveries_retry_now(*, deliveries: QuerySet[WebhookDelivery]) -> int:
    """Every one of `deliveries` not yet delivered is due again now (a failed one gets a new round
    of attempts). Returns how many."""
    return deliveries.exclude(status=DeliveryStatus.DELIVERED).update(status=DeliveryStatus.PENDING,
                                                                      next_attempt_at=timezone.now())


_EMAIL_CLAIM_SQL = _claim_sql("notifications_emaildelivery", '"id"')


def email_claim_seconds() -> float:
    """How long an e-mail's claim outlives its attempt's start: an SMTP conversation cannot outlast it."""
    return 2 * settings.EMAIL_TIMEOUT + 5 if settings.EMAIL_TIMEOUT else claim_seconds()


def email_delivery_claim(*, deliverer: str) -> EmailDelivery | None:
    """The next due e-mail, claimed by `deliverer` (its attempt counted) until the claim runs out —
    committed before the message leaves. None when nothing is due or another sender holds what is."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_EMAIL_CLAIM_SQL, [deliverer, email_claim_seconds()])
            row = cursor.fetchone()
        if row is None:
            return None
        return EmailDelivery.objects.get(pk=row[0])


def email_attempt_record(*, delivery: EmailDelivery, deliverer: str, error: str) -> str:
    """An attempt's outcome — sent, failed for good (after WARDEN_WEBHOOK_MAX_ATTEMPTS) or due again
    after a backoff — recorded only while the claim is still ours. Returns 'delivered', 'failed',
    'retry' or 'claim-lost'."""
    now = timezone.now()
    ours = EmailDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING, claimed_by=deliverer,
                                        attempts=delivery.attempts)
    released = {"claimed_by": "", "claimed_until": None, "last_error": error[:500]}
    if not error:
        updated, outcome = ours.update(status=DeliveryStatus.DELIVERED, sent_at=now, **released), "delivered"
    elif delivery.attempts >= settings.WARDEN_WEBHOOK_MAX_ATTEMPTS:
        updated, outcome = ours.update(status=DeliveryStatus.FAILED, **released), "failed"
    else:
        updated = ours.update(next_attempt_at=now + timedelta(seconds=retry_delay(delivery.attempts)), **released)
        outcome = "retry"
    return outcome if updated else "claim-lost"


def email_deliveries_retry_now(*, deliveries: QuerySet[EmailDelivery]) -> int:
    """Every one of `deliveries` not yet sent is due again now (a failed one gets a new round of
    attempts). Returns how many."""
    return deliveries.exclude(status=DeliveryStatus.DELIVERED).update(status=DeliveryStatus.PENDING,
                                                                      next_attempt_at=timezone.now())
