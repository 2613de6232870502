"""Writes of the simulated order/payment service: booking refunds, arming faults, seeding.
Each function owns its transaction; a refused request raises SimError and books nothing."""

import secrets
from decimal import Decimal

from django.db import IntegrityError, transaction

from demo.models import SimFault, SimFaultMode, SimFaultTarget, SimOrder, SimOrderStatus, SimRefund, SimUserLevel

CENT = Decimal("0.01")


class SimError(Exception):
    """A definite refusal, answered as `{"error": {"code": …, "detail": …}}` with `status`."""

    def __init__(self, status: int, code: str, detail: str = ""):
        super().__init__(f"{code}: {detail}" if detail else code)
        self.status = status
        self.code = code
        self.detail = detail


def sim_refund_book(*, order_id: str, amount: Decimal, reason: str, idempotency_key: str) -> tuple[SimRefund, bool]:
    """Book a full refund once per idempotency key. Returns (refund, replayed): a repeated key
    with the same order and amount gets the refund booked the first time, never a second one."""
    amount = amount.quantize(CENT)
    existing = SimRefund.objects.select_related("order").filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        return _refund_replay(existing, order_id=order_id, amount=amount), True
    try:
        with transaction.atomic():
            # The order lock serialises bookings for one order, so the checks below cannot
            # interleave with a concurrent booking of the same order.
            order = SimOrder.objects.select_for_update().filter(order_id=order_id).first()
            if order is None:
                raise SimError(404, "order_not_found", f"no order {order_id}")
            existing = SimRefund.objects.filter(idempotency_key=idempotency_key).first()
            if existing is not None:
                return _refund_replay(existing, order_id=order_id, amount=amount), True
            if not order.refund_eligible:
                raise SimError(409, "not_eligible", order.ineligible_reason or "order is not eligible for a refund")
            if order.refunds.exists():
                raise SimError(409, "already_refunded", f"order {order_id} has already been refunded")
            if amount > order.amount:
                raise SimError(422, "amount_exceeds_order", f"order {order_id} is {order.amount} {order.currency}")
            refund = SimRefund.objects.create(
                refund_id=f"rf_{secrets.token_hex(8)}",
                order=order,
                amount=amount,
                currency=order.currency,
                reason=reason,
                idempotency_key=idempotency_key,
            )
            return refund, False
    except IntegrityError:
        # A concurrent request with the same key (for another order, which the lock above
        # does not cover) committed first: its refund is the answer.
        existing = SimRefund.objects.select_related("order").filter(idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return _refund_replay(existing, order_id=order_id, amount=amount), True


def _refund_replay(refund: SimRefund, *, order_id: str, amount: Decimal) -> SimRefund:
    if refund.order.order_id != order_id or refund.amount != amount:
        raise SimError(
            422,
            "idempotency_key_reused",
            f"key already used for order {refund.order.order_id}, amount {refund.amount}",
        )
    return refund


def sim_fault_set(
    *, target: str, mode: str, delay_seconds: float = 3.0, count: int = 1
) -> SimFault | None:
    """Arm `mode` for the next `count` requests to `target` (-1: until cleared), replacing
    whatever was armed there. Mode `none` disarms the target."""
    if target not in SimFaultTarget.values:
        raise SimError(400, "invalid_fault", f"target must be one of {', '.join(SimFaultTarget.values)}")
    if mode not in SimFaultMode.values:
        raise SimError(400, "invalid_fault", f"mode must be one of {', '.join(SimFaultMode.values)}")
    if not 0 <= delay_seconds <= 600:
        raise SimError(400, "invalid_fault", "delay_seconds must be between 0 and 600")
    if count != -1 and count < 1:
        raise SimError(400, "invalid_fault", "count must be positive, or -1 for until cleared")
    with transaction.atomic():
        if mode == SimFaultMode.NONE:
            SimFault.objects.filter(target=target).delete()
            return None
        fault, _ = SimFault.objects.update_or_create(
            target=target, defaults={"mode": mode, "delay_seconds": delay_seconds, "remaining": count}
        )
        return fault


def sim_fault_clear(*, target: str | None = None) -> int:
    """Disarm every fault (or one target's); returns how many were removed."""
    faults = SimFault.objects.all() if target is None else SimFault.objects.filter(target=target)
    deleted, _ = faults.delete()
    return deleted


def sim_fault_consume(*, target: str) -> SimFault | None:
    """Take one use of the fault armed for `target`, if any. The row lock makes concurrent
    requests take distinct uses, so a count of 1 fires exactly once."""
    with transaction.atomic():
        fault = SimFault.objects.select_for_update().filter(target=target).exclude(remaining=0).first()
        if fault is None:
            return None
        if fault.remaining > 0:
            fault.remaining -= 1
            fault.save(update_fields=["remaining"])
        return fault


def sim_order_upsert(
    *,
    order_id: str,
    user_id: str,
    amount: Decimal,
    currency: str = "USD",
    status: str = "delivered",
    refund_eligible: bool = True,
    ineligible_reason: str = "",
) -> tuple[SimOrder, bool]:
    return SimOrder.objects.update_or_create(
        order_id=order_id,
        defaults={
            "user_id": user_id,
            "amount": amount,
            "currency": currency,
            "status": status,
            "refund_eligible": refund_eligible,
            "ineligible_reason": ineligible_reason,
        },
    )


def sim_user_level_upsert(*, user_id: str, level: str) -> tuple[SimUserLevel, bool]:
    return SimUserLevel.objects.update_or_create(user_id=user_id, defaults={"level": level})


# One order per path of docs/DEMO.md, so walking one path never spoils another (a refund is
# booked once per order): the console walk-through refunds 9527, the README's API example 9540.
DEMO_ORDERS = [
    {"order_id": "9527", "user_id": "u1", "amount": Decimal("25.00")},
    {
        "order_id": "9528",
        "user_id": "u1",
        "amount": Decimal("42.50"),
        "refund_eligible": False,
        "ineligible_reason": "delivered more than 30 days ago",
    },
    {"order_id": "9529", "user_id": "u2", "amount": Decimal("120.00"), "status": SimOrderStatus.SHIPPED},
    {"order_id": "9530", "user_id": "u1", "amount": Decimal("60.00")},  # timeout after booking
    {"order_id": "9531", "user_id": "u1", "amount": Decimal("35.00")},  # 503 before booking
    {"order_id": "9532", "user_id": "u1", "amount": Decimal("48.00")},  # reconciled by a person
    {"order_id": "9533", "user_id": "u2", "amount": Decimal("15.00")},  # rejected by the operator
    {"order_id": "9534", "user_id": "u2", "amount": Decimal("11.00")},  # bulk approval, three at once
    {"order_id": "9535", "user_id": "u2", "amount": Decimal("12.00")},
    {"order_id": "9536", "user_id": "u2", "amount": Decimal("13.00")},
    {"order_id": "9540", "user_id": "u1", "amount": Decimal("19.99")},  # the README's API example
    # The demo agent's approval branches (demo/agent.py): none, the customer, two operators.
    {"order_id": "9541", "user_id": "u1", "amount": Decimal("4.50")},
    {"order_id": "9542", "user_id": "u1", "amount": Decimal("8.00")},
    {"order_id": "9543", "user_id": "u2", "amount": Decimal("250.00")},
    # Small eligible orders for load tests, one refund each.
    *({"order_id": str(n), "user_id": "u2", "amount": Decimal(n - 995)} for n in range(1001, 1011)),
]
DEMO_USER_LEVELS = {"u1": "gold", "u2": "silver"}


@transaction.atomic
def sim_world_seed(*, reset: bool = False) -> int:
    """Create or update the demo world's orders and user levels (idempotent); with `reset`, also
    delete every simulated refund and armed fault first. Returns how many orders were new."""
    if reset:
        SimRefund.objects.all().delete()
        SimFault.objects.all().delete()
    created = sum(sim_order_upsert(**order)[1] for order in DEMO_ORDERS)
    for user_id, level in DEMO_USER_LEVELS.items():
        sim_user_level_upsert(user_id=user_id, level=level)
    return created
