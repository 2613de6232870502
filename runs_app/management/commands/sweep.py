import logging
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections, connections

from engine.sweeper import sweep_once

logger = logging.getLogger("warden.sweeper")


class Command(BaseCommand):
    help = "Run the sweeper once, or forever with --loop (every WARDEN_SWEEP_SECONDS)."

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true")
        parser.add_argument("--interval", type=float, default=None)

    def handle(self, *args, loop, interval, **options):
        interval = interval or settings.WARDEN_SWEEP_SECONDS
        while True:
            close_old_connections()
            if not loop:
                self.stdout.write(str(sweep_once()))
                return
            try:
                sweep_once()
            except Exception:  # a dropped database connection must not end the sweeper
                logger.warning("sweep failed; retrying", exc_info=True)
                connections.close_all()
            time.sleep(interval)
