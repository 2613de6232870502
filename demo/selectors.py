"""Reads of the simulated order/payment service, and the JSON shapes its endpoints answer with."""

import hashlib

from demo.models import SimFault, SimOrder, SimRefund, SimUserLevel

WEATHER_SUMMARIES = ("sunny", "partly cloudy", "overcast", "light rain", "showers", "windy", "foggy", "snow")


def sim_order_detail(*, order_id: str) -> dict | None:
    order = SimOrder.objects.filter(order_id=order_id).first()
    if order is None:
        return None
    return {
        "order_id": order.order_id,
        "user_id": order.user_id,
        "amount": str(order.amount),
        "currency": order.currency,
        "status": order.status,
        "refund_eligible": order.refund_eligible,
        "ineligible_reason": order.ineligible_reason,
        "refunded": order.refunds.exists(),
    }


def sim_user_level_detail(*, user_id: str) -> dict | None:
    level = SimUserLevel.objects.filter(user_id=user_id).first()
    return None if level is None else {"user_id": level.user_id, "level": level.level}


def sim_refund_payload(refund: SimRefund) -> dict:
    return {
        "refund_id": refund.refund_id,
        "order_id": refund.order.order_id,
        "amount": str(refund.amount),
        "currency": refund.currency,
        "reason": refund.reason,
        "status": refund.status,
        "idempotency_key": refund.idempotency_key,
        "created_at": refund.created_at.isoformat(),
    }


def sim_refund_get_by_key(*, idempotency_key: str) -> SimRefund | None:
    return SimRefund.objects.select_related("order").filter(idempotency_key=idempotency_key).first()


def sim_refund_count(*, order_id: str | None = None) -> int:
    refunds = SimRefund.objects.all()
    if order_id is not None:
        refunds = refunds.filter(order__order_id=order_id)
    return refunds.count()


def sim_fault_list() -> list[dict]:
    return [
        {
            "target": fault.target,
            "mode": fault.mode,
            "delay_seconds": fault.delay_seconds,
            "remaining": fault.remaining,
            "created_at": fault.created_at.isoformat(),
        }
        for fault in SimFault.objects.all()
    ]


def sim_weather_for(*, city: str) -> dict:
    """The same city always has the same weather, so demos and tests can rely on it."""
    digest = hashlib.sha256(city.strip().lower().encode()).digest()
    return {
        "city": city.strip(),
        "summary": WEATHER_SUMMARIES[digest[0] % len(WEATHER_SUMMARIES)],
        "temperature_c": digest[1] % 40 - 5,
    }
