"""The webhook outbox (SPEC §17): endpoints, one delivery per notification and endpoint, and each
attempt at it."""

import base64
import secrets
import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone


class NotificationKind(models.TextChoices):
    """What a webhook endpoint may subscribe to: the moments a person must act (SPEC §17)."""

    APPROVAL_REQUESTED = "approval.requested", "An approval was requested"
    APPROVAL_EXPIRING = "approval.expiring", "A pending approval is about to expire"
    RECONCILIATION_NEEDED = "tool_call.needs_reconciliation", "A write needs a person to reconcile it"
    RUN_FAILED = "run.failed", "A run failed"
    RUN_COMPLETED = "run.completed", "A run completed"
    APPROVAL_ESCALATED = "approval.escalated", "An approval was escalated past its service level"


class WebhookFormat(models.TextChoices):
    """What a receiver reads: Warden's own signed JSON, or a chat's incoming webhook (a message with
    the request and its action links, docs/NOTIFICATIONS.md)."""

    STANDARD = "standard", "Standard Webhooks JSON"
    SLACK = "slack", "Slack-compatible chat message"
    TEAMS = "teams", "Microsoft Teams-compatible chat message"


def webhook_secret_new() -> str:
    """A Standard Webhooks secret: `whsec_` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


class WebhookEndpoint(models.Model):
    """A receiver of notifications, configured in the admin: which kinds it wants, and the secret
    its deliveries are signed with."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=100)
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=100, default=webhook_secret_new,
                              help_text="Standard Webhooks secret (whsec_…); receivers verify signatures with it.")
    kinds = ArrayField(models.CharField(max_length=40, choices=NotificationKind.choices), default=list, blank=True)
    format = models.CharField(max_length=12, choices=WebhookFormat.choices, default=WebhookFormat.STANDARD)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        # The tables keep the names they had in runs_app (migrations notifications/0001, runs_app/0015).
        db_table = "runs_app_webhookendpoint"
        ordering = ["name", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(secret__startswith="whsec_"), name="webhook_endpoint_secret_format"),
            models.CheckConstraint(condition=Q(format__in=WebhookFormat.values), name="webhook_endpoint_format_valid"),
        ]

    def __str__(self) -> str:
        return self.name


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # waiting for its (next) attempt
    DELIVERED = "delivered"  # the receiver answered 2xx
    FAILED = "failed"  # given up after WARDEN_WEBHOOK_MAX_ATTEMPTS


class WebhookDelivery(models.Model):
    """The transactional outbox: one row per notification and endpoint, written in the same
    transaction as the run event that causes it (notifications.outbox), so nothing is sent for
    something that did not commit. Its id is the `webhook-id` header of every attempt: receivers
    de-duplicate by it. Delivered by engine/webhooks.py outside any run's transaction."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.PROTECT, related_name="deliveries")
    kind = models.CharField(max_length=40, choices=NotificationKind.choices)
    run = models.ForeignKey("runs_app.Run", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    event_seq = models.PositiveBigIntegerField(null=True, blank=True)  # the run event it announces
    body = models.JSONField()  # {"type", "timestamp", "data"}: the same bytes on every attempt
    status = models.CharField(max_length=12, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # A deliverer's claim: another may take the delivery over only once it has passed (the
    # deliverer died mid-attempt), so two never send one delivery at once.
    claimed_by = models.CharField(max_length=160, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "runs_app_webhookdelivery"
        ordering = ["-created_at"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.CheckConstraint(condition=Q(status__in=DeliveryStatus.values), name="webhook_delivery_status_valid"),
            models.CheckConstraint(condition=~Q(status=DeliveryStatus.DELIVERED) | Q(delivered_at__isnull=False),
                                   name="webhook_delivery_delivered_has_time"),
            # One delivery per event and endpoint, whatever the code does.
            models.UniqueConstraint(fields=["endpoint", "run", "event_seq"], condition=Q(event_seq__isnull=False),
                                    name="webhook_delivery_once_per_event"),
        ]
        indexes = [
            models.Index(fields=["next_attempt_at"], condition=Q(status="pending"), name="webhook_delivery_due"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} → {self.endpoint_id} ({self.status})"


class WebhookAttempt(models.Model):
    """One try at a delivery: written before the request goes out, finished when it returns — an
    attempt left unfinished was cut short by its deliverer's death."""

    id = models.BigAutoField(primary_key=True)
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.PROTECT, related_name="attempt_log")
    number = models.PositiveIntegerField()
    deliverer = models.CharField(max_length=160)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    response_excerpt = models.CharField(max_length=500, blank=True)

    class Meta:
        db_table = "runs_app_webhookattempt"
        ordering = ["delivery", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="webhook_attempt_number_unique")]

    def __str__(self) -> str:
        return f"attempt {self.number} ({self.status_code or self.error or 'in flight'})"


class EmailDelivery(models.Model):
    """The e-mail outbox (docs/NOTIFICATIONS.md): one message to one person, written in the
    transaction that causes it (an approval requested, reminded, escalated), so nothing is sent for
    what rolled back; sent through Django's e-mail backend by engine/mailer.py, claimed, retried with
    backoff like a webhook delivery. The body holds a signed decision link: it is shown to nobody
    but its recipient (the desk lists recipient, subject and status only)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=40, choices=NotificationKind.choices)
    recipient = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    to = models.EmailField(max_length=254)
    subject = models.CharField(max_length=200)
    body = models.TextField()
    run = models.ForeignKey("runs_app.Run", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    approval_id = models.UUIDField(null=True, blank=True)
    status = models.CharField(max_length=12, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claimed_by = models.CharField(max_length=160, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "e-mail deliveries"
        constraints = [
            models.CheckConstraint(condition=Q(status__in=DeliveryStatus.values), name="email_delivery_status_valid"),
            models.CheckConstraint(condition=~Q(status=DeliveryStatus.DELIVERED) | Q(sent_at__isnull=False),
                                   name="email_delivery_sent_has_time"),
        ]
        indexes = [
            models.Index(fields=["next_attempt_at"], condition=Q(status="pending"), name="email_delivery_due"),
            models.Index(fields=["approval_id"], name="email_delivery_approval"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} → {self.to} ({self.status})"
