"""Approval notices as a deployment gets them: a real SMTP server (aiosmtpd) on a free port behind
Django's SMTP backend, a real HTTP server standing in for a chat's incoming webhook, and the people
who may — and may not — decide."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import transaction
from django.utils import timezone

from engine.actions.approvals import approval_request
from notifications.models import NotificationKind, WebhookEndpoint, WebhookFormat
from runs_app.models import RunPhase, RunStatus
from tests.support.factories import AgentFactory, RunFactory, SessionFactory, StepFactory, ToolCallFactory, UserFactory
from tests.support.mail import ChatReceiver, Mailbox, smtp_server_start
from tools_app.models import ToolEffect

REFUND = {"order_id": "9527", "amount": "250.00", "currency": "EUR", "reason": "damaged"}


@pytest.fixture
def smtp(settings):
    """A running SMTP server, and Django's SMTP backend pointed at it with approval e-mails on."""
    mailbox = Mailbox()
    controller = smtp_server_start(mailbox)
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    settings.EMAIL_USE_TLS = False
    settings.EMAIL_TIMEOUT = 10
    settings.WARDEN_APPROVAL_EMAIL = True
    mailbox.controller = controller
    yield mailbox
    controller.stop()


@pytest.fixture
def chat(settings):
    settings.WARDEN_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    receiver = ChatReceiver()
    receiver.thread.start()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


@pytest.fixture
def slack_endpoint(chat):
    return WebhookEndpoint.objects.create(
        name="approvals channel", url=chat.url, format=WebhookFormat.SLACK,
        kinds=[NotificationKind.APPROVAL_REQUESTED, NotificationKind.APPROVAL_ESCALATED])


def decider(username: str, *groups: str, email: bool = True):
    """An operator who may decide operator approvals (the permission through their group when they
    are in one), with an e-mail address."""
    user = UserFactory(username=username, email=f"{username}@example.test" if email else "", is_staff=True)
    permission = Permission.objects.get(content_type__app_label="approvals_app", codename="decide_approval")
    for name in groups:
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(permission)
        user.groups.add(group)
    if not groups:
        user.user_permissions.add(permission)
    return user


@pytest.fixture
def people(db):
    """alice and bob decide (the operators group); lee decides too (leads); carol has an address but
    not the permission; the customer holds the permission but it is their session (four eyes)."""
    return {
        "alice": decider("alice", "operators"),
        "bob": decider("bob", "operators"),
        "lee": decider("lee", "leads"),
        "carol": UserFactory(username="carol", email="carol@example.test"),
        "customer": decider("customer"),
    }


def agent_with(service_levels: dict | None = None):
    """A version carrying `service_levels` (AgentVersion rows are immutable: set when created)."""
    agent = AgentFactory(version__approval_service_levels=service_levels or {},
                         version__tools=["query_order", "execute_refund"])
    return agent.current_version


def request_refund(*, owner, version=None, arguments: dict | None = None, policy: str = "operator"):
    """A run of `owner`'s, leased, that asks for an approval of a refund (an operator's by default) — through the one
    write path (engine.actions.approvals.approval_request), in its own transaction."""
    session = SessionFactory(owner=owner)
    run = RunFactory(session=session, status=RunStatus.RUNNING, phase=RunPhase.EXECUTING_TOOLS, lease_owner="w1",
                     lease_expires_at=timezone.now() + timedelta(minutes=5), lease_token=7, agent_version=version)
    step = StepFactory(run=run, index=0, lease_token=7)
    call = ToolCallFactory(step=step, run=run, tool_name="execute_refund", effect=ToolEffect.WRITE,
                           arguments=arguments or REFUND, idempotency_key=f"execute_refund:{run.pk}:9527")
    with transaction.atomic():
        return approval_request(run=run, tool_call=call, policy=policy, lease_token=7,
                                rule="execute_refund[0]: amount > 100 → operator", rule_reason="amount 250.00 > 100")
