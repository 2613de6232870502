from decimal import Decimal

import factory

from demo.models import SimFault, SimFaultMode, SimFaultTarget, SimOrder, SimRefund, SimUserLevel


class SimOrderFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SimOrder
        django_get_or_create = ("order_id",)

    order_id = factory.Sequence(lambda n: str(5000 + n))
    user_id = "u1"
    amount = Decimal("25.00")
    currency = "USD"
    refund_eligible = True


class SimUserLevelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SimUserLevel
        django_get_or_create = ("user_id",)

    user_id = factory.Sequence(lambda n: f"user{n}")
    level = "gold"


class SimRefundFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SimRefund

    refund_id = factory.Sequence(lambda n: f"rf_factory{n}")
    order = factory.SubFactory(SimOrderFactory)
    amount = factory.LazyAttribute(lambda r: r.order.amount)
    currency = factory.LazyAttribute(lambda r: r.order.currency)
    reason = "customer request"
    idempotency_key = factory.Sequence(lambda n: f"key-{n}")


class SimFaultFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SimFault
        django_get_or_create = ("target",)

    target = SimFaultTarget.REFUND
    mode = SimFaultMode.ERROR_BEFORE_BOOKING
    delay_seconds = 1.0
    remaining = 1
