"""Delivering the webhook outbox (notifications.outbox; docs/OPERATIONS.md, "Notifications").

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
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.conf import settings

from config.logs import log_context
from config.tracing import span, span_set
from notifications.outbox import webhook_body_bytes, webhook_signature
from notifications.services import url_redacted, webhook_attempt_record, webhook_delivery_claim
from notifications.targets import Target, TargetRefused, webhook_target
from operations import liveness

logger = logging.getLogger("warden.webhooks")

def webhooks_deliver_due(*, limit: int = 50, budget_seconds: float = 30.0) -> int:
    """Attempt deliveries that are due, one claim at a time, until none is left, `limit` attempts
    were made or `budget_seconds` passed. Returns the number of attempts made."""
    deliverer = liveness.process_identity()
    ends = time.monotonic() + budget_seconds
    made = 0
    with httpx.Client(timeout=settings.WARDEN_WEBHOOK_TIMEOUT_SECONDS, trust_env=False, follow_redirects=False) as client:
        while made < limit and time.monotonic() < ends:
            claimed = webhook_delivery_claim(deliverer=deliverer)
            if claimed is None:
                break
            _attempt(client, claimed, deliverer)
            made += 1
    return made


def _pinned(url: str, target: Target) -> tuple[str, str, dict]:
    """`url` aimed at the address that was checked (so a second resolution cannot send it elsewhere),
    with the Host header and, for https, the TLS server name of the host as written."""
    parts = urlsplit(url)
    address = f"[{target.address}]" if ":" in target.address else target.address
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (f"{userinfo}@" if userinfo else "") + address + (f":{parts.port}" if parts.port else "")
    host_header = target.host + (f":{parts.port}" if parts.port else "")
    extensions = {"sni_hostname": target.host} if parts.scheme == "https" else {}
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")), host_header, extensions


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
    try:
        target = webhook_target(delivery.endpoint.url)  # resolved and checked now, every attempt
    except TargetRefused as refused:
        target, error = None, f"refused: {refused}"[:500]
    with log_context(run_id=str(delivery.run_id) if delivery.run_id else None), span(
        "webhook.delivery", delivery=webhook_id, kind=delivery.kind, attempt=attempt.number, endpoint=delivery.endpoint_id,
        run_id=delivery.run_id,
    ) as current:
        try:
            if target is not None:
                url, host_header, extensions = _pinned(delivery.endpoint.url, target)
                response = client.post(url, content=body, headers={**headers, "host": host_header}, extensions=extensions)
                # Status and size only: what a receiver answers is not ours to keep or show.
                status_code, excerpt = response.status_code, f"{len(response.content)} bytes"
                if not 200 <= status_code < 300:
                    error = f"HTTP {status_code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
        span_set(current, status_code=status_code, error=error or None)
    outcome = webhook_attempt_record(delivery=delivery, attempt=attempt, deliverer=deliverer, status_code=status_code,
                                     error=error, excerpt=excerpt)
    log = logger.info if outcome == "delivered" else logger.warning
    log("webhook %s (%s) attempt %d to %s: %s%s", delivery.id, delivery.kind, attempt.number,
        url_redacted(delivery.endpoint.url), outcome, f" ({error})" if error else "",
        extra={"webhook_id": str(delivery.id), "attempt": attempt.number, "outcome": outcome})


