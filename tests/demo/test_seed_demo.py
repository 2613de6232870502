from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command

from tests.support.factories import SimFaultFactory, SimRefundFactory
from demo.models import SimFault, SimOrder, SimRefund, SimUserLevel


@pytest.mark.django_db
def test_seed_demo_is_idempotent_and_restores_the_demo_orders():
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert "24 orders (24 new)" in out.getvalue()
    SimOrder.objects.filter(order_id="9527").update(amount=Decimal("1.00"))
    call_command("seed_demo", verbosity=0, stdout=(quiet := StringIO()))
    assert quiet.getvalue() == ""
    assert SimOrder.objects.count() == 24 and SimUserLevel.objects.count() == 2
    eligible = SimOrder.objects.get(order_id="9527")
    assert (eligible.amount, eligible.currency, eligible.user_id, eligible.refund_eligible) == (Decimal("25.00"), "USD", "u1", True)
    ineligible = SimOrder.objects.get(order_id="9528")
    assert not ineligible.refund_eligible and ineligible.ineligible_reason == "delivered more than 30 days ago"
    assert SimOrder.objects.get(order_id="9529").amount == Decimal("120.00")
    assert SimOrder.objects.filter(order_id__in=[str(n) for n in range(1001, 1011)], refund_eligible=True).count() == 10
    assert dict(SimUserLevel.objects.values_list("user_id", "level")) == {"u1": "gold", "u2": "silver"}


@pytest.mark.django_db
def test_seed_demo_keeps_refunds_unless_asked_to_reset():
    call_command("seed_demo", verbosity=0)
    SimRefundFactory(order=SimOrder.objects.get(order_id="9527"))
    SimFaultFactory()
    call_command("seed_demo", verbosity=0)
    assert SimRefund.objects.count() == 1
    call_command("seed_demo", "--reset", verbosity=0)
    assert not SimRefund.objects.exists() and not SimFault.objects.exists()
