"""Seed the simulated order/payment service with the demo world's orders and customers."""

from decimal import Decimal

from django.core.management.base import BaseCommand
from django.db import transaction

from tools_app.demo.models import SimFault, SimOrderStatus, SimRefund
from tools_app.demo.services import sim_order_upsert, sim_user_level_upsert

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
                    + ". Try order 9527 (eligible, 25.00 USD) or 9528 (not eligible)."
                )
            )
