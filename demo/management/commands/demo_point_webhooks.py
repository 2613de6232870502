from django.conf import settings
from django.core.management.base import BaseCommand

from demo.accounts import DEMO_WEBHOOK_ENDPOINT
from demo.management.commands.demo_setup import demo_webhook_url
from notifications.models import WebhookEndpoint


class Command(BaseCommand):
    help = ("Point the demo's webhook endpoint at this instance's simulated services (WARDEN_SIM_BASE_URL); "
            "`serve_all` runs it, so an instance on other ports never sends its webhooks to another's receiver.")

    def handle(self, *args, **options):
        if not settings.WARDEN_DEMO:
            return
        url = demo_webhook_url()
        changed = WebhookEndpoint.objects.filter(name=DEMO_WEBHOOK_ENDPOINT).exclude(url=url).update(url=url)
        if changed:
            self.stdout.write(f"demo webhooks now go to {url}")
