"""Seed the simulated order/payment service with the demo world's orders and customers."""

from decimal import Decimal

from django.core.management.base import BaseCommand
from django.db import transaction

from tools_app.demo.models import SimFault, SimOrderStatus, SimRefund
from tools_app.demo.services import sim_order_upsert, sim_user_level_upsert

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
    # Small eligible orders for load tests, one refund each.
    *({"order_id": str(n), "user_id": "u2", "amount": Decimal(n - 995)} for n in range(1001, 1011)),
]
DEMO_USER_LEVELS = {"u1": "gold", "u2": "silver"}


class Command(BaseCommand):
    help = "Create or update the demo orders and user levels of the simulated service (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--reset", action="store_true", help="Also delete every simulated refund and armed fault first."
        )

    @transaction.atomic
    def handle(self, *args, reset: bool = False, **options):
        if reset:
            SimRefund.objects.all().delete()
            SimFault.objects.all().delete()
        created = sum(sim_order_upsert(**order)[1] for order in DEMO_ORDERS)
        for user_id, level in DEMO_USER_LEVELS.items():
            sim_user_level_upsert(user_id=user_id, level=level)
        if options.get("verbosity", 1) > 0:
            self.stdout.write(
                self.style.SUCCESS(
                    f"Demo world: {len(DEMO_ORDERS)} orders ({created} new), "
                    f"{len(DEMO_USER_LEVELS)} user levels"
                    + (", refunds and faults cleared" if reset else "")
                    + ". Try order 9527 (eligible, 25.00 USD) or 9528 (not eligible); docs/DEMO.md has one order per path."
                )
            )
