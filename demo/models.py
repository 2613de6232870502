"""Tables of the simulated order/payment service. They belong to the simulated downstream
system, not to Warden: Warden only ever reaches them over HTTP (SPEC §13, "Demo world")."""

from django.conf import settings
from django.db import models
from django.db.models import Q


class SimOrderStatus(models.TextChoices):
    PROCESSING = "processing"
    SHIPPED = "shipped"
    DELIVERED = "delivered"
    CANCELLED = "cancelled"


class SimOrder(models.Model):
    order_id = models.CharField(max_length=64, unique=True)
    user_id = models.CharField(max_length=64)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    currency = models.CharField(max_length=3, default="USD")
    status = models.CharField(max_length=12, choices=SimOrderStatus.choices, default=SimOrderStatus.DELIVERED)
    refund_eligible = models.BooleanField(default=True)
    ineligible_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["order_id"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="sim_order_amount_positive"),
            models.CheckConstraint(condition=Q(status__in=SimOrderStatus.values), name="sim_order_status_valid"),
        ]

    def __str__(self) -> str:
        return f"order {self.order_id}"


class SimUserLevel(models.Model):
    user_id = models.CharField(max_length=64, unique=True)
    level = models.CharField(max_length=20)  # gold, silver, bronze, … (free text in the simulated CRM)

    class Meta:
        ordering = ["user_id"]

    def __str__(self) -> str:
        return f"{self.user_id}: {self.level}"


class SimRefundStatus(models.TextChoices):
    BOOKED = "booked"


class SimRefund(models.Model):
    refund_id = models.CharField(max_length=40, unique=True)
    order = models.ForeignKey(SimOrder, on_delete=models.PROTECT, related_name="refunds")
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    currency = models.CharField(max_length=3)
    reason = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=12, choices=SimRefundStatus.choices, default=SimRefundStatus.BOOKED)
    idempotency_key = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            # One booking per key, whatever races the application code loses.
            models.UniqueConstraint(fields=["idempotency_key"], name="sim_refund_idempotency_key_unique"),
            # Refunds are full refunds: a second one for the same order is a double payout.
            models.UniqueConstraint(fields=["order"], name="sim_refund_one_per_order"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="sim_refund_amount_positive"),
        ]

    def __str__(self) -> str:
        return f"refund {self.refund_id} of order {self.order_id}"


class SimFaultTarget(models.TextChoices):
    REFUND = "refund"
    ORDER = "order"
    WEATHER = "weather"
    USER_LEVEL = "user_level"
    # Looking a refund up by idempotency key (what reconciliation asks).
    LOOKUP = "lookup"


class SimFaultMode(models.TextChoices):
    NONE = "none"
    DELAY = "delay"
    ERROR_BEFORE_BOOKING = "error_before_booking"
    TIMEOUT_AFTER_BOOKING = "timeout_after_booking"
    DROP_AFTER_BOOKING = "drop_after_booking"


class SimFault(models.Model):
    """An armed fault for one endpoint family. `remaining` counts the requests it still
    applies to; -1 means until cleared, 0 means spent."""

    target = models.CharField(max_length=12, choices=SimFaultTarget.choices, unique=True)
    mode = models.CharField(max_length=24, choices=SimFaultMode.choices)
    delay_seconds = models.FloatField(default=3.0)
    remaining = models.IntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["target"]
        constraints = [
            models.CheckConstraint(condition=Q(target__in=SimFaultTarget.values), name="sim_fault_target_valid"),
            models.CheckConstraint(condition=Q(mode__in=SimFaultMode.values), name="sim_fault_mode_valid"),
            models.CheckConstraint(condition=Q(remaining__gte=-1), name="sim_fault_remaining_valid"),
            models.CheckConstraint(condition=Q(delay_seconds__gte=0), name="sim_fault_delay_non_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.target}: {self.mode} ({self.remaining})"


class SimWebhookReceipt(models.Model):
    """What the demo's webhook receiver page (/sim/webhooks/, demo mode only) was sent: a
    stand-in for an on-call tool, so a person can watch Warden's notifications arrive."""

    webhook_id = models.CharField(max_length=100)
    webhook_timestamp = models.CharField(max_length=20)
    kind = models.CharField(max_length=60, blank=True)
    body = models.TextField()
    signature_valid = models.BooleanField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-received_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.webhook_id}"


class ShopAccount(models.Model):
    """Which customer of the simulated shop a Warden user is (the demo's own link, `manage.py
    demo_setup` makes alice u1): the demo tools show and refund that customer's orders only. A user
    without one — an operator trying things, a test — is not limited to one customer's orders."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="shop_account")
    shop_user_id = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"{self.user_id} → {self.shop_user_id}"
