"""Context windows come from the model (issue 32, point 4; engine/model_route.py): a run whose model
has a context window builds its prompt for that window less the answer's token limit (never less
than half the window), the smaller of its model's and its fallback model's; without one,
WARDEN_CONTEXT_TOKENS. So two agents on models of different windows compact at different history
lengths — driven in the test's own process against local model servers."""

from decimal import Decimal

import pytest
from django.db import transaction

from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from engine.model_route import Route
from runs_app.endpoints import ModelTerms
from runs_app.models import ContextSummary, RunStatus, Step, StepKind
from sessions_app.models import Message, MessageRole
from sessions_app.services import messages_append
from tests.support.agents import define
from tests.support.drive import drive_to_end
from tests.support.factories import EndpointModelFactory, ModelEndpointFactory, UserFactory
from tests.support.fake_openai_server import FakeOpenAIServer

pytestmark = pytest.mark.django_db(transaction=True)

OUTPUT_LIMIT = 500
# About 17 estimated tokens a message (engine.context.estimate_tokens: four characters a token).
LINE = "the customer and the agent talk about an order at some length here."


def _terms(window: int) -> ModelTerms:
    return ModelTerms(Decimal(0), Decimal(0), window)


@pytest.mark.django_db(transaction=False)
def test_the_prompt_window_is_the_smaller_models_window_less_the_answers_limit():
    class _Endpoint:
        name, model = "e", "m"

    alone = Route(provider=object(), endpoint=_Endpoint(), terms={"primary": _terms(8000)})
    assert alone.window_tokens(output_limit=1000) == 7000
    assert alone.window_tokens(output_limit=6000) == 4000  # never less than half the window
    # The fallback's smaller window bounds the prompt too: whichever answers can take it.
    both = Route(provider=object(), endpoint=_Endpoint(), fallback=_Endpoint(),
                 terms={"primary": _terms(8000), "fallback": _terms(3000)})
    assert both.window_tokens(output_limit=1000) == 2000
    assert Route(provider=object()).window_tokens(output_limit=1000) is None  # WARDEN_CONTEXT_TOKENS


@pytest.fixture
def agents(settings):
    definer = UserFactory(username="agent-admin", is_staff=True, is_superuser=True)
    settings.WARDEN_MODEL_MAX_OUTPUT_TOKENS = OUTPUT_LIMIT
    settings.WARDEN_CONTEXT_TOKENS = 1_000_000  # not what either run uses
    with FakeOpenAIServer(fallback="scripted") as narrow_server, FakeOpenAIServer(fallback="scripted") as wide_server:
        made = {}
        for name, server, window in (("narrow", narrow_server, 2_000), ("wide", wide_server, 20_000)):
            endpoint = ModelEndpointFactory(name=name, base_url=server.base_url)
            EndpointModelFactory(endpoint=endpoint, name=f"{name}-model", context_window=window)
            version = define({"name": name, "instructions": "Help.", "tools": ["noop"], "endpoint": name,
                              "model": f"{name}-model"}, by=definer)
            made[name] = (version.agent, server)
        yield made


def _run_after(agent, server, *, history: int):
    """A run of `agent` in a session holding `history` messages; the server's summary is queued first
    (a summary is the first call a compacting run makes)."""
    customer = UserFactory()
    session = session_open(owner=customer, title="long", agent=agent)
    with transaction.atomic():
        messages_append(session_id=session.pk, messages=[
            Message(role=MessageRole.USER if i % 2 == 0 else MessageRole.ASSISTANT, content=f"{i}: {LINE}")
            for i in range(history)])
    server.enqueue(text=["The customer asked about an order."])
    run = message_post(session=session, content="run 1 no-op", acting_user=customer).run
    run = drive_to_end(run)
    assert run.status == RunStatus.COMPLETED, run.error_detail
    first = Step.objects.filter(run=run, kind=StepKind.MODEL).order_by("index").first()
    return session, first.context_manifest


def test_two_agents_on_models_of_different_windows_compact_at_different_history_lengths(agents):
    (narrow, narrow_server), (wide, wide_server) = agents["narrow"], agents["wide"]
    # 100 messages (about 1,700 tokens): more than the narrow model's prompt window, less than the wide one's.
    session, manifest = _run_after(narrow, narrow_server, history=100)
    assert manifest["window_tokens"] == 2_000 - OUTPUT_LIMIT
    assert manifest["summary_made_now"] and ContextSummary.objects.filter(session_id=session.pk).exists()
    assert manifest["estimated_tokens"] <= manifest["window_tokens"]
    session, manifest = _run_after(wide, wide_server, history=100)
    assert manifest["window_tokens"] == 20_000 - OUTPUT_LIMIT
    assert not manifest["summary_made_now"] and not ContextSummary.objects.filter(session_id=session.pk).exists()
    assert manifest["message_seq_ranges"][0][0] == 1  # the whole history shown
    # 1,500 messages (about 26,000 tokens) outgrow the wide window too.
    session, manifest = _run_after(wide, wide_server, history=1_500)
    assert manifest["summary_made_now"] and ContextSummary.objects.filter(session_id=session.pk).exists()
    assert manifest["estimated_tokens"] <= 20_000 - OUTPUT_LIMIT
