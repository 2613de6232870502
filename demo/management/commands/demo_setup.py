from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from engine.actions.agents import agent_definition_of, agent_save
from agents.definitions import agent_definition_check
from agents.models import Agent
from notifications.models import NotificationKind, WebhookEndpoint

from demo.accounts import DEMO_CUSTOMER, DEMO_CUSTOMER_SHOP_ID, DEMO_OPERATOR, DEMO_WEBHOOK_ENDPOINT
from demo.models import ShopAccount


def demo_webhook_url() -> str:
    return settings.WARDEN_SIM_BASE_URL.rstrip("/") + "/webhooks/"


class Command(BaseCommand):
    help = "Create the demo operator and customer accounts and seed the demo world (idempotent; demo mode only)."

    def handle(self, *args, **options):
        if not settings.WARDEN_DEMO:
            # Well-known passwords and a superuser have no place in a real deployment.
            raise CommandError(
                "demo_setup creates the demo accounts (with well-known passwords) and the demo world, which exist "
                "only in demo mode: set WARDEN_DEMO=1 (`make run` does)."
            )
        with transaction.atomic():
            self._accounts_and_world()
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo accounts — operator (admin): {DEMO_OPERATOR[0]} / {DEMO_OPERATOR[1]}; "
                f"customer: {DEMO_CUSTOMER[0]} / {DEMO_CUSTOMER[1]}; webhooks arrive at {demo_webhook_url()}; "
                "new sessions use the agent \"Refund desk (demo)\""
            )
        )

    def _accounts_and_world(self):
        User = get_user_model()
        operator, _ = User.objects.get_or_create(username=DEMO_OPERATOR[0], defaults={"is_staff": True})
        operator.is_staff = True
        operator.is_superuser = True
        operator.set_password(DEMO_OPERATOR[1])
        operator.save()
        customer, _ = User.objects.get_or_create(username=DEMO_CUSTOMER[0])
        customer.set_password(DEMO_CUSTOMER[1])
        customer.save()
        ShopAccount.objects.update_or_create(user=customer, defaults={"shop_user_id": DEMO_CUSTOMER_SHOP_ID})
        try:
            operator.user_permissions.add(Permission.objects.get(codename="decide_approval"))
        except Permission.DoesNotExist:
            pass
        # The demo's webhook endpoint: every notification kind, to the receiver page of the simulated
        # services (demo mode only), so a person can watch deliveries arrive.
        WebhookEndpoint.objects.update_or_create(
            name=DEMO_WEBHOOK_ENDPOINT,
            defaults={"url": demo_webhook_url(), "kinds": list(NotificationKind.values), "active": True},
        )
        call_command("seed_demo", verbosity=0)
        self._demo_agent(operator)

    def _demo_agent(self, operator):
        """"Refund desk (demo)": a new version only when its definition changed, so running
        demo_setup again leaves the demo's runs and their version alone."""
        from demo.agent import DEMO_AGENT, DEMO_LEADS_GROUP, DEMO_SERVICE_LEVELS  # installed only in demo mode, checked above

        # The group its approvals escalate to, with the demo operator in it so an escalation reaches
        # someone; it must exist before the definition names it.
        leads, _ = Group.objects.get_or_create(name=DEMO_LEADS_GROUP)
        leads.permissions.add(*Permission.objects.filter(codename="decide_approval"))
        operator.groups.add(leads)
        definition = DEMO_AGENT
        if settings.WARDEN_APPROVAL_TTL_SECONDS > 30 * 60:  # an escalation must come before the expiry
            definition = {**DEMO_AGENT, "approval_service_levels": DEMO_SERVICE_LEVELS}
        agent = Agent.objects.filter(slug=definition["slug"]).select_related("current_version__agent").first()
        if agent is not None and agent.current_version_id:
            current = agent_definition_of(agent.current_version)
            if all(current.get(field) == value for field, value in agent_definition_check(definition).items()):
                return
        agent_save(definition=definition, acting_user=operator, agent=agent)
