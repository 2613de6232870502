"""A factory for every model of the project (tests/foundation/test_factories.py checks there is one),
with the sane defaults each needs; the demo world's included, since the suite runs in demo mode."""

import functools
import uuid
from datetime import timedelta
from decimal import Decimal

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.utils import timezone

from agents.models import Agent, AgentVersion
from approvals_app.ledger import ledger_append
from approvals_app.models import Approval, ApprovalDecision, ApprovalPolicy, AuditEntry, Freeze, FreezeScope, LedgerEntry
from demo.models import (
    ShopAccount, SimFault, SimFaultMode, SimFaultTarget, SimOrder, SimRefund, SimUserLevel, SimWebhookReceipt,
)
from notifications.models import NotificationKind, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from operations.models import OpenStream, ProcessHeartbeat, ProcessRole
from config.secrets import secret_seal
from runs_app.models import ContextSummary, EndpointModel, ModelEndpoint, Run, RunEvent, Step, StepKind
from sessions_app.models import IdempotencyRecord, Message, MessageRole, PendingInput, RateCounter, Session
from tools_app.models import ToolCall, ToolEffect

TEST_PASSWORD = "pw-for-tests"


@functools.cache
def _test_password_hash() -> str:
    # Hashing is deliberately slow; hash the shared test password once per process.
    return make_password(TEST_PASSWORD)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.LazyFunction(_test_password_hash)


class SessionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Session

    owner = factory.SubFactory(UserFactory)
    title = factory.Sequence(lambda n: f"Session {n}")


class MessageFactory(factory.django.DjangoModelFactory):
    """Appends with the next seq; messages are append-only, so this never updates a row."""

    class Meta:
        model = Message

    session = factory.SubFactory(SessionFactory)
    role = MessageRole.USER
    content = factory.Faker("sentence")
    seq = factory.LazyAttribute(lambda m: (m.session.messages.order_by("-seq").values_list("seq", flat=True).first() or 0) + 1)


class PendingInputFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PendingInput

    session = factory.SubFactory(SessionFactory)
    content = factory.Faker("sentence")


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    session = factory.SubFactory(SessionFactory)
    created_by = factory.LazyAttribute(lambda r: r.session.owner)
    max_model_calls = 10
    max_tokens = 100_000
    deadline = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))


class StepFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Step

    run = factory.SubFactory(RunFactory)
    index = factory.Sequence(lambda n: n)
    kind = StepKind.MODEL


class RunEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = RunEvent

    run = factory.SubFactory(RunFactory)
    seq = factory.Sequence(lambda n: n + 1)
    type = "input_queued"


class ToolCallFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ToolCall

    step = factory.SubFactory(StepFactory)
    run = factory.LazyAttribute(lambda t: t.step.run)
    index = 0
    tool_call_id = factory.Sequence(lambda n: f"call_{n}")
    tool_name = "query_order"
    arguments = factory.LazyFunction(lambda: {"order_id": "9527"})
    effect = ToolEffect.READ


class ApprovalFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Approval

    tool_call = factory.SubFactory(
        ToolCallFactory, tool_name="execute_refund", effect=ToolEffect.WRITE, arguments={"order_id": "9527", "amount": "10.00"}
    )
    run = factory.LazyAttribute(lambda a: a.tool_call.run)
    policy = ApprovalPolicy.OPERATOR
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))


class AuditEntryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AuditEntry

    actor = factory.SubFactory(UserFactory)
    action = "approve"
    object_type = "approval"
    object_id = factory.Sequence(lambda n: str(n))


class LedgerEntryFactory(factory.django.DjangoModelFactory):
    """An entry appended through the ledger's one write path (numbered, stamped and hashed by the
    database), never inserted by hand."""

    class Meta:
        model = LedgerEntry

    kind = "approval_approve"
    actor = factory.SubFactory(UserFactory)
    subject = factory.Sequence(lambda n: f"approval:{uuid.UUID(int=n)}")
    payload = factory.LazyFunction(dict)

    @classmethod
    def _create(cls, model_class, *, kind, actor, subject, payload):
        return model_class.objects.get(seq=ledger_append(kind=kind, actor=actor, subject=subject, payload=payload))


class ApiKeyFactory(factory.django.DjangoModelFactory):
    """Created through api_key_create; the secret, shown once, is kept on `.secret` for tests."""

    class Meta:
        model = "sessions_app.ApiKey"

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"key {n}")

    @classmethod
    def _create(cls, model_class, *, owner, name, **kwargs):
        from sessions_app.api_keys import api_key_create

        api_key, secret = api_key_create(owner=owner, name=name)
        api_key.secret = secret
        return api_key


class ContextSummaryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ContextSummary

    session = factory.SubFactory(SessionFactory)
    covers_through_seq = factory.Sequence(lambda n: n + 1)
    content = "Numbers mentioned: 9527. Said: user: refund order 9527"


class IdempotencyRecordFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = IdempotencyRecord

    owner = factory.SubFactory(UserFactory)
    key = factory.Sequence(lambda n: f"idem-{n}")
    request_hash = "0" * 64
    method = "POST"
    path = "/api/v1/sessions"
    status_code = 201
    response_body = b'{"id": "x"}'
    response_content_type = "application/json"


class ApprovalDecisionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ApprovalDecision

    approval = factory.SubFactory(ApprovalFactory)
    decided_by = factory.SubFactory(UserFactory)
    decision = "approve"


class FreezeFactory(factory.django.DjangoModelFactory):
    """A freeze in force, as a row (engine.actions.freezes sets them, audited)."""

    class Meta:
        model = Freeze

    scope = FreezeScope.TOOL
    target = factory.Sequence(lambda n: f"frozen_tool_{n}")
    reason = "an incident"
    created_by = factory.SubFactory(UserFactory)


class ApprovalLinkFactory(factory.django.DjangoModelFactory):
    """A decision link as approvals_app.links.link_create writes it (unsigned here: link_token signs it)."""

    class Meta:
        model = "approvals_app.ApprovalLink"

    approval = factory.SubFactory(ApprovalFactory)
    decider = factory.SubFactory(UserFactory)
    digest = factory.LazyAttribute(lambda link: link.approval.digest)
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))


class DelegationFactory(factory.django.DjangoModelFactory):
    """A delegation in force for a week (engine.actions.delegations.delegation_set sets real ones)."""

    class Meta:
        model = "approvals_app.Delegation"

    delegator = factory.SubFactory(UserFactory)
    delegate = factory.SubFactory(UserFactory)
    created_by = factory.LazyAttribute(lambda delegation: delegation.delegator)
    starts_at = factory.LazyFunction(timezone.now)
    ends_at = factory.LazyFunction(lambda: timezone.now() + timedelta(days=7))


class ShopAccountFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ShopAccount

    user = factory.SubFactory(UserFactory)
    shop_user_id = factory.Sequence(lambda n: f"u{n + 100}")


class AgentFactory(factory.django.DjangoModelFactory):
    """An agent with one version, its current one (versions are immutable: a new one is agent_save's)."""

    class Meta:
        model = Agent
        django_get_or_create = ("slug",)
        skip_postgeneration_save = True  # the hook writes what it sets itself

    slug = factory.Sequence(lambda n: f"agent-{n}")
    name = factory.LazyAttribute(lambda a: a.slug.replace("-", " ").capitalize())

    @factory.post_generation
    def version(agent, create, extracted, **kwargs):
        if not create or agent.current_version_id:
            return
        version = AgentVersionFactory(agent=agent, name=agent.name, **kwargs)
        Agent.objects.filter(pk=agent.pk).update(current_version=version)
        agent.current_version = version


class AgentVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AgentVersion

    agent = factory.SubFactory(AgentFactory, version=None)
    number = factory.LazyAttribute(lambda v: (v.agent.versions.order_by("-number").values_list("number", flat=True).first() or 0) + 1)
    name = factory.LazyAttribute(lambda v: v.agent.name)
    instructions = "You help customers with their orders."
    provider = "scripted"
    tools = factory.LazyFunction(lambda: ["query_order"])


class ModelEndpointFactory(factory.django.DjangoModelFactory):
    """An endpoint; `credential` is the plain text, stored sealed as endpoint_save stores it."""

    class Meta:
        model = ModelEndpoint

    name = factory.Sequence(lambda n: f"endpoint-{n}")
    base_url = factory.Sequence(lambda n: f"https://models{n}.example.com/v1")
    credential = factory.Sequence(lambda n: f"sk-test-{n}")

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        if kwargs.get("credential"):
            kwargs["credential"] = secret_seal(kwargs["credential"])
        return super()._create(model_class, *args, **kwargs)


class EndpointModelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = EndpointModel

    endpoint = factory.SubFactory(ModelEndpointFactory)
    name = factory.Sequence(lambda n: f"model-{n}")
    input_price_per_million = Decimal("0.15")
    output_price_per_million = Decimal("0.60")
    context_window = 128_000


class WebhookEndpointFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = WebhookEndpoint

    name = factory.Sequence(lambda n: f"receiver {n}")
    url = factory.Sequence(lambda n: f"https://hooks.example.com/{n}")
    kinds = factory.LazyFunction(lambda: [NotificationKind.APPROVAL_REQUESTED])


class WebhookDeliveryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = WebhookDelivery

    endpoint = factory.SubFactory(WebhookEndpointFactory)
    kind = NotificationKind.APPROVAL_REQUESTED
    body = factory.LazyFunction(lambda: {"type": "approval.requested", "timestamp": "2026-01-01T00:00:00Z", "data": {}})


class WebhookAttemptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = WebhookAttempt

    delivery = factory.SubFactory(WebhookDeliveryFactory)
    number = factory.Sequence(lambda n: n + 1)
    deliverer = "host:1:deliverer"
    started_at = factory.LazyFunction(timezone.now)


class EmailDeliveryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "notifications.EmailDelivery"

    kind = NotificationKind.APPROVAL_REQUESTED
    recipient = factory.SubFactory(UserFactory)
    to = factory.LazyAttribute(lambda e: f"{e.recipient.username}@example.test")
    subject = "[Warden] Approval requested"
    body = "Your decision link: https://warden.example.test/console/decide/token/\n"


class ProcessHeartbeatFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ProcessHeartbeat
        django_get_or_create = ("identity",)

    identity = factory.Sequence(lambda n: f"host:{1000 + n}:beat")
    role = ProcessRole.WORKER
    host = "host"
    pid = factory.Sequence(lambda n: 1000 + n)
    cluster = "host:1"
    started_at = factory.LazyFunction(timezone.now)
    beat_at = factory.LazyFunction(timezone.now)


class OpenStreamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = OpenStream

    id = factory.LazyFunction(uuid.uuid4)
    user_id = factory.LazyFunction(lambda: UserFactory().pk)
    kind = "sse"
    opened_at = factory.LazyFunction(timezone.now)
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=5))


class RateCounterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = RateCounter

    key = factory.Sequence(lambda n: f"throttle:user:{n}:3600")
    start = 1_700_000_000
    expires = 1_700_007_260
    count = 1


class SimOrderFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SimOrder
        django_get_or_create = ("order_id",)

    order_id = factory.Sequence(lambda n: str(5000 + n))
    user_id = "u1"
    amount = Decimal("25.00")
    currency = "USD"
    refund_eligible = True


class SimUserLevelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SimUserLevel
        django_get_or_create = ("user_id",)

    user_id = factory.Sequence(lambda n: f"user{n}")
    level = "gold"


class SimRefundFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SimRefund

    refund_id = factory.Sequence(lambda n: f"rf_factory{n}")
    order = factory.SubFactory(SimOrderFactory)
    amount = factory.LazyAttribute(lambda r: r.order.amount)
    currency = factory.LazyAttribute(lambda r: r.order.currency)
    reason = "customer request"
    idempotency_key = factory.Sequence(lambda n: f"key-{n}")


class SimFaultFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SimFault
        django_get_or_create = ("target",)

    target = SimFaultTarget.REFUND
    mode = SimFaultMode.ERROR_BEFORE_BOOKING
    delay_seconds = 1.0
    remaining = 1


class SimWebhookReceiptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SimWebhookReceipt

    webhook_id = factory.Sequence(lambda n: f"msg_{n}")
    webhook_timestamp = "1767225600"
    kind = "approval.requested"
    body = '{"type": "approval.requested"}'
    signature_valid = True


class SavedViewFactory(factory.django.DjangoModelFactory):
    """One operator's saved view of a desk list (engine.actions.desk_lists.saved_view_save saves real ones)."""

    class Meta:
        model = "approvals_app.SavedView"

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"view {n}")
    url = "/admin/approvals_app/approval/?assigned=mine"


class McpServerFactory(factory.django.DjangoModelFactory):
    """An MCP server's row (engine.actions.mcp_servers.mcp_server_save saves real ones, credential sealed)."""

    class Meta:
        model = "tools_app.McpServer"

    name = factory.Sequence(lambda n: f"mcp-{n}")
    url = factory.Sequence(lambda n: f"http://127.0.0.1:9/mcp/{n}")
