import logging
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections, connection, connections

from engine.mailer import mails_send_due
from engine.sweeper import sweep_once
from engine.webhooks import webhooks_deliver_due

logger = logging.getLogger("warden.sweeper")


def _deliver_forever(interval: float) -> None:
    """Webhook deliveries and e-mails that are due (retries, and those whose deliverer died), on a
    thread of their own: a slow receiver must not hold up lease revocation."""
    while True:
        try:
            close_old_connections()
            webhooks_deliver_due()
            mails_send_due()
        except Exception:  # noqa: BLE001 - the database or a receiver is away: try again next round
            logger.warning("webhook delivery round failed; retrying", exc_info=True)
            connection.close()
        time.sleep(interval)


class Command(BaseCommand):
    help = "Run the sweeper once, or forever with --loop (every WARDEN_SWEEP_SECONDS), delivering due webhooks too."

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true")
        parser.add_argument("--interval", type=float, default=None)
        parser.add_argument("--no-webhooks", action="store_true", help="leave webhook and e-mail deliveries to other processes")

    def handle(self, *args, loop, interval, no_webhooks, **options):
        interval = interval or settings.WARDEN_SWEEP_SECONDS
        if loop and not no_webhooks:
            threading.Thread(target=_deliver_forever, args=(interval,), name="webhook-deliverer", daemon=True).start()
        while True:
            close_old_connections()
            if not loop:
                counts = sweep_once()
                if not no_webhooks:
                    counts["webhooks_attempted"] = webhooks_deliver_due()
                    counts["emails_attempted"] = mails_send_due()
                self.stdout.write(str(counts))
                return
            try:
                sweep_once()
            except Exception:  # a dropped database connection must not end the sweeper
                logger.warning("sweep failed; retrying", exc_info=True)
                connections.close_all()
            time.sleep(interval)
