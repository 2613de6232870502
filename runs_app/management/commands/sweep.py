import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from runs_app.engine.sweeper import sweep_once


class Command(BaseCommand):
    help = "Run the sweeper once, or forever with --loop (every WARDEN_SWEEP_SECONDS)."

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true")
        parser.add_argument("--interval", type=float, default=None)

    def handle(self, *args, loop, interval, **options):
        interval = interval or settings.WARDEN_SWEEP_SECONDS
        while True:
            close_old_connections()
            counts = sweep_once()
            if not loop:
                self.stdout.write(str(counts))
                return
            time.sleep(interval)
