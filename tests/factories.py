import functools
from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.utils import timezone

from approvals_app.models import Approval, ApprovalPolicy, AuditEntry
from runs_app.models import Run, RunEvent, Step, StepKind
from sessions_app.models import Message, MessageRole, PendingInput, Session
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
