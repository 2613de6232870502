"""Sending the e-mail outbox (notifications.models.EmailDelivery; docs/NOTIFICATIONS.md).

Like a webhook delivery (engine/webhooks.py): an e-mail is claimed with a locking read that skips
rows others hold and a claim that expires, the claim is committed, and only then does the message go
out — through Django's configured e-mail backend (SMTP: EMAIL_HOST, EMAIL_PORT…), outside any
transaction. A failure (the server down, a refusal) is retried with backoff up to
WARDEN_WEBHOOK_MAX_ATTEMPTS. A sender that dies mid-attempt leaves its claim to expire and the next
one sends the message again: a recipient may, rarely, get it twice; never not at all.

The body holds the recipient's decision link: it is never logged — the log names the delivery,
its kind and its outcome only.

Who sends: the task asked for after each commit that wrote outbox rows
(`engine.tasks.deliver_webhooks`), a thread of `manage.py sweep --loop`, and the sweeper's
schedule — any number at once, since the claim decides.
"""

import logging
import time

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from config.tracing import span, span_set
from notifications.models import EmailDelivery
from notifications.services import email_attempt_record, email_delivery_claim
from operations import liveness

logger = logging.getLogger("warden.mailer")


def mails_send_due(*, limit: int = 50, budget_seconds: float = 30.0) -> int:
    """Attempt the e-mails that are due, one claim at a time, until none is left, `limit` attempts
    were made or `budget_seconds` passed. Returns the number of attempts made."""
    deliverer = liveness.process_identity()
    ends = time.monotonic() + budget_seconds
    made = 0
    while made < limit and time.monotonic() < ends:
        delivery = email_delivery_claim(deliverer=deliverer)
        if delivery is None:
            break
        _attempt(delivery, deliverer)
        made += 1
    return made


def _attempt(delivery: EmailDelivery, deliverer: str) -> None:
    error = ""
    with span("email.delivery", delivery=str(delivery.id), kind=delivery.kind, attempt=delivery.attempts) as current:
        try:
            connection = get_connection(fail_silently=False, timeout=settings.EMAIL_TIMEOUT or None)
            EmailMessage(subject=delivery.subject, body=delivery.body, from_email=settings.DEFAULT_FROM_EMAIL,
                         to=[delivery.to], connection=connection,
                         headers={"X-Warden-Delivery": str(delivery.id)}).send()
        except Exception as exc:  # noqa: BLE001 - any failure to hand the message over is retried
            error = f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
        span_set(current, error=error or None)
    outcome = email_attempt_record(delivery=delivery, deliverer=deliverer, error=error)
    log = logger.info if outcome == "delivered" else logger.warning
    log("e-mail %s (%s) attempt %d: %s%s", delivery.id, delivery.kind, delivery.attempts, outcome,
        f" ({error})" if error else "",
        extra={"email_id": str(delivery.id), "attempt": delivery.attempts, "outcome": outcome})
