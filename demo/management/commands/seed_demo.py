"""Seed the simulated order/payment service with the demo world's orders and customers (demo mode only)."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

NOT_IN_DEMO_MODE = (
    "The demo world (its orders, refunds and simulated payment service) exists only in demo mode: "
    "set WARDEN_DEMO=1 (`make run` does) to seed it."
)


class Command(BaseCommand):
    help = "Create or update the demo orders and user levels of the simulated service (idempotent; demo mode only)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--reset", action="store_true", help="Also delete every simulated refund and armed fault first."
        )

    def handle(self, *args, reset: bool = False, **options):
        if not settings.WARDEN_DEMO:
            raise CommandError(NOT_IN_DEMO_MODE)
        from demo.services import DEMO_ORDERS, DEMO_USER_LEVELS, sim_world_seed  # installed only in demo mode

        created = sim_world_seed(reset=reset)
        if options.get("verbosity", 1) > 0:
            self.stdout.write(
                self.style.SUCCESS(
                    f"Demo world: {len(DEMO_ORDERS)} orders ({created} new), "
                    f"{len(DEMO_USER_LEVELS)} user levels"
                    + (", refunds and faults cleared" if reset else "")
                    + ". Try order 9527 (eligible, 25.00 USD) or 9528 (not eligible); docs/DEMO.md has one order per path."
                )
            )
