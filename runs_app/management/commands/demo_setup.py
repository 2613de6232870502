import os

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from runs_app.models import NotificationKind, WebhookEndpoint
from tools_app.demo.views import DEMO_WEBHOOK_ENDPOINT

DEMO_OPERATOR = ("operator", "operator-demo-pass")
DEMO_CUSTOMER = ("alice", "alice-demo-pass")


class Command(BaseCommand):
    help = "Create the demo operator and customer accounts and seed the demo world (idempotent)."

    @transaction.atomic
    def handle(self, *args, **options):
        User = get_user_model()
        operator, _ = User.objects.get_or_create(username=DEMO_OPERATOR[0], defaults={"is_staff": True})
        operator.is_staff = True
        operator.is_superuser = True
        operator.set_password(DEMO_OPERATOR[1])
        operator.save()
        customer, _ = User.objects.get_or_create(username=DEMO_CUSTOMER[0])
        customer.set_password(DEMO_CUSTOMER[1])
        customer.save()
        try:
            operator.user_permissions.add(Permission.objects.get(codename="decide_approval"))
        except Permission.DoesNotExist:
            pass
        # The demo's webhook endpoint: every notification kind, to the receiver page at /sim/webhooks/
        # (served in demo mode only), so a person can watch deliveries arrive.
        WebhookEndpoint.objects.update_or_create(
            name=DEMO_WEBHOOK_ENDPOINT,
            defaults={"url": f"{settings.WARDEN_PUBLIC_URL}/sim/webhooks/", "kinds": list(NotificationKind.values), "active": True},
        )
        if os.environ.get("WARDEN_SKIP_DEMO_SEED") != "1":
            try:
                call_command("seed_demo", verbosity=0)
            except Exception as exc:  # the demo world arrives with the engine; accounts work without it
                if "Unknown command" not in str(exc):
                    raise
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo accounts — operator (admin): {DEMO_OPERATOR[0]} / {DEMO_OPERATOR[1]}; "
                f"customer: {DEMO_CUSTOMER[0]} / {DEMO_CUSTOMER[1]}; "
                f"webhooks arrive at {settings.WARDEN_PUBLIC_URL}/sim/webhooks/"
            )
        )
