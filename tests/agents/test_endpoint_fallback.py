"""An agent may name a fallback endpoint and model (issue 32, point 3; docs/EXTENDING.md, "Model
endpoints"): validated like its own endpoint and model, carried by its runs from the version (never a
request's choice), shown by the API; and the rule that sends a call there, in the test's own process
against local model servers — a refused connection or a 500 goes to the fallback at once, the step
recording it and its cost from the fallback model's prices; a 429 with Retry-After is honoured on the
agent's own endpoint first; a permanent error of its own endpoint is not retried elsewhere."""

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import transaction

from agents.definitions import AgentDefinitionInvalid, agent_definition_check
from agents.models import AgentVersion
from agents.selectors import endpoint_models_in_use
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from engine.actions.endpoints import endpoint_save
from engine.model_route import Route, route_read
from engine.state import run_create
from runs_app.endpoints import ENDPOINT_OPTION, FALLBACK_ENDPOINT_OPTION, FALLBACK_MODEL_OPTION
from runs_app.models import EndpointKind, ModelEndpoint, RunErrorCode, RunStatus, Step, StepKind, StepStatus, WaitReason
from runs_app.providers.base import PermanentModelError, TransientModelError
from tests.support.agents import define
from tests.support.api import grant
from tests.support.drive import drive_to_end, drive_until
from tests.support.factories import EndpointModelFactory, ModelEndpointFactory, UserFactory
from tests.support.fake_openai_server import FakeOpenAIServer
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def endpoints(db):
    main = ModelEndpointFactory(name="main", base_url="https://main.example.com/v1")
    spare = ModelEndpointFactory(name="spare", base_url="https://spare.example.com/v1")
    EndpointModelFactory(endpoint=main, name="big")
    EndpointModelFactory(endpoint=main, name="small")
    EndpointModelFactory(endpoint=spare, name="spare-model")
    return main, spare


def agent(**changes) -> dict:
    return {"name": "Refunds", "instructions": "Refund eligible orders.", "tools": ["noop"],
            "endpoint": "main", "model": "big", "fallback_endpoint": "spare", "fallback_model": "spare-model", **changes}


def refused_fields(definition: dict) -> dict[str, str]:
    with pytest.raises(AgentDefinitionInvalid) as refused:
        agent_definition_check(definition)
    return refused.value.errors


def test_a_fallback_endpoint_and_one_of_its_models_make_a_valid_definition(endpoints):
    clean = agent_definition_check(agent())
    assert (clean["fallback_endpoint"], clean["fallback_model"]) == ("spare", "spare-model")
    # Another model of the agent's own endpoint is a fallback too.
    clean = agent_definition_check(agent(fallback_endpoint="main", fallback_model="small"))
    assert (clean["fallback_endpoint"], clean["fallback_model"]) == ("main", "small")
    assert agent_definition_check(agent(fallback_endpoint="", fallback_model=""))["fallback_endpoint"] == ""


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"fallback_endpoint": "nowhere"}, "fallback_endpoint",
     "unknown model endpoint 'nowhere'; defined (the desk's Model endpoints): main, spare"),
    ({"fallback_model": "big"}, "fallback_model", "'big' is not a model endpoint 'spare' offers; it offers: spare-model"),
    ({"fallback_model": ""}, "fallback_model", "fallback endpoint 'spare' needs one of its models; it offers: spare-model"),
    ({"fallback_endpoint": ""}, "fallback_model", "a fallback model needs the fallback_endpoint that offers it"),
    ({"endpoint": "", "model": "gpt-x"}, "fallback_endpoint", "a fallback backs up the agent's own endpoint"),
    ({"fallback_endpoint": "main", "fallback_model": "big"}, "fallback_model", "the fallback is the agent's own endpoint and model"),
])
def test_a_fallback_the_endpoints_do_not_offer_is_refused_on_its_field(endpoints, changes, field, words):
    errors = refused_fields(agent(**changes))
    assert words in errors[field], errors


def test_the_version_keeps_the_fallback_and_its_runs_carry_it_whatever_the_request_says(endpoints, agent_admin):
    main, spare = endpoints
    version = define(agent(), by=agent_admin)
    assert (version.fallback_endpoint_id, version.fallback_model) == (spare.pk, "spare-model")
    customer = UserFactory()
    session = session_open(owner=customer, title="x", agent=version.agent)
    with transaction.atomic():  # a request's own options cannot steer the run elsewhere
        run = run_create(session=session, agent_version=version,
                         provider_options={FALLBACK_ENDPOINT_OPTION: 999, FALLBACK_MODEL_OPTION: "x"})
    assert run.provider_options[ENDPOINT_OPTION] == main.pk
    assert (run.provider_options[FALLBACK_ENDPOINT_OPTION], run.provider_options[FALLBACK_MODEL_OPTION]) == (spare.pk, "spare-model")
    # What the endpoint must keep offering counts the fallback's model too.
    assert endpoint_models_in_use(endpoint_id=spare.pk) == {"spare-model": ["refunds"]}


def test_the_api_defines_and_shows_the_fallback(endpoints, agent_admin_api):
    created = agent_admin_api.post("/agents", agent())
    assert created.status_code == 201, created.content
    shown = created.json()["version"]
    assert (shown["fallback_endpoint"], shown["fallback_model"]) == ("spare", "spare-model")
    refused = agent_admin_api.client.put("/api/v1/agents/refunds", json.dumps(agent(fallback_model="nope")),
                                         content_type="application/json", **agent_admin_api.headers)
    assert refused.status_code == 422 and "fallback_model" in refused.content.decode()
    assert AgentVersion.objects.count() == 1


# --- the rule, as data -------------------------------------------------------------------------------

class _Endpoint:
    name, model = "main", "big"


def _route(fallback=True) -> Route:
    return Route(provider=object(), endpoint=_Endpoint(), fallback=_Endpoint() if fallback else None)


@pytest.mark.parametrize(("error", "delivered", "retrying", "goes"), [
    (TransientModelError("model server unreachable"), False, False, True),
    (TransientModelError("Error code: 500", status=500), False, False, True),
    (TransientModelError("Error code: 429", status=429), False, False, True),  # no Retry-After: at once
    (TransientModelError("Error code: 429", status=429, retry_after=3), False, False, False),  # honoured first
    (TransientModelError("Error code: 429", status=429, retry_after=3), False, True, True),  # the retry goes on
    (TransientModelError("model stream broken"), True, False, False),  # a stream already shown
    (PermanentModelError("Error code: 400", status=400), False, False, False),
])
def test_which_failures_of_the_agents_endpoint_go_on_to_the_fallback(error, delivered, retrying, goes):
    assert _route().falls_back(error, delivered=delivered, retrying=retrying) is goes
    assert _route(fallback=False).falls_back(error, delivered=delivered, retrying=retrying) is False


def test_when_both_fail_the_error_names_both_and_waits_the_longer_retry_after():
    error = _route().both_failed(TransientModelError("Error code: 500", status=500, retry_after=2),
                                 TransientModelError("Error code: 429", status=429, retry_after=7))
    assert str(error) == "endpoint main: Error code: 500; fallback main failed: Error code: 429"
    assert (error.status, error.retry_after) == (500, 7)
    refused = _route().both_failed(TransientModelError("unreachable"), PermanentModelError("Error code: 401", status=401))
    assert isinstance(refused, TransientModelError) and "fallback main refused: Error code: 401" in str(refused)


# --- against local model servers, in the test's own process -------------------------------------------

@pytest.fixture
def spare_server():
    with FakeOpenAIServer(fallback="scripted") as server:
        yield server


def _agent_on(main_url: str, spare_url: str, *, by):
    ModelEndpointFactory(name="main", base_url=main_url, credential="sk-main-key-1234")
    spare = ModelEndpointFactory(name="spare", base_url=spare_url, credential="sk-spare-key-1234")
    EndpointModelFactory(endpoint=spare, name="spare-model", input_price_per_million=Decimal("2"),
                         output_price_per_million=Decimal("10"))
    EndpointModelFactory(endpoint=ModelEndpoint.objects.get(name="main"), name="big")
    return define(agent(), by=by).agent


def _ask(agent, text="run 1 no-op"):
    customer = UserFactory()
    return message_post(session=session_open(owner=customer, title=text, agent=agent), content=text,
                        acting_user=customer).run


@pytest.mark.django_db(transaction=True)
def test_a_refused_connection_goes_to_the_fallback_and_every_step_records_it_with_its_cost(spare_server, agent_admin):
    unreachable = f"http://127.0.0.1:{free_port()}/v1"
    run = drive_to_end(_ask(_agent_on(unreachable, spare_server.base_url, by=agent_admin)))
    assert run.status == RunStatus.COMPLETED and run.model_retries == 0
    steps = list(Step.objects.filter(run=run, kind=StepKind.MODEL).order_by("index"))
    assert len(steps) == len(spare_server.requests) == 2
    assert {r["model"] for r in spare_server.requests} == {"spare-model"}
    assert set(spare_server.authorizations) == {"Bearer sk-spare-key-1234"}
    for step in steps:
        assert (step.status, step.endpoint, step.model) == (StepStatus.COMPLETED, "spare", "spare-model")
        expected = (Decimal(step.input_tokens) * 2 + Decimal(step.output_tokens) * 10) / Decimal(1_000_000)
        assert step.input_tokens and step.cost == expected.quantize(Decimal("0.000001"))


@pytest.mark.django_db(transaction=True)
def test_a_429_with_retry_after_waits_for_the_agents_endpoint_and_its_retry_goes_on(spare_server, agent_admin, settings):
    settings.WARDEN_RETRY_BASE_SECONDS = 0.05
    with FakeOpenAIServer(fallback="scripted") as main:
        main.enqueue(status=429, headers={"Retry-After": "0.2"}, error_message="slow down")
        main.enqueue(status=503, error_message="overloaded")
        run = _ask(_agent_on(main.base_url, spare_server.base_url, by=agent_admin))
        waiting = drive_until(run, RunStatus.WAITING, WaitReason.RETRY_BACKOFF)
        assert waiting.expires_at - waiting.wait_started_at > timedelta(seconds=0.15)  # Retry-After, not the 0.05 s base
        assert len(main.requests) == 1 and not spare_server.requests  # honoured on its own endpoint first
        run = drive_to_end(run)
    assert run.status == RunStatus.COMPLETED and run.model_retries == 1
    failed, answered, *rest = Step.objects.filter(run=run, kind=StepKind.MODEL).order_by("index")
    assert (failed.status, failed.endpoint, failed.cost) == (StepStatus.FAILED, "main", None)
    assert "slow down" in failed.discard_reason
    assert (answered.status, answered.endpoint) == (StepStatus.COMPLETED, "spare")  # main failed again: 503
    assert len(main.requests) == 2 + len(rest)  # later calls ask the agent's own endpoint first again


@pytest.mark.django_db(transaction=True)
def test_a_permanent_error_of_the_agents_endpoint_fails_the_run_without_the_fallback(spare_server, agent_admin):
    with FakeOpenAIServer(fallback="scripted") as main:
        main.enqueue(status=400, error_message="bad request")
        run = drive_to_end(_ask(_agent_on(main.base_url, spare_server.base_url, by=agent_admin)))
    assert (run.status, run.error_code) == (RunStatus.FAILED, RunErrorCode.MODEL_ERROR)
    assert not spare_server.requests
    assert Step.objects.get(run=run, kind=StepKind.MODEL).endpoint == "main"


def test_an_endpoint_moved_to_another_kind_is_spoken_to_in_its_new_protocol(endpoints, agent_admin):
    """The provider follows the endpoint as it stands at the call, not the run's, fixed when its agent
    was saved: an operator who switches an endpoint to Anthropic's Messages has its runs speak it."""
    main, _ = endpoints
    version = define(agent(), by=agent_admin)
    session = session_open(owner=UserFactory(), title="x", agent=version.agent)
    with transaction.atomic():
        run = run_create(session=session, agent_version=version, provider_options={})
    assert type(route_read(run).provider).__name__ == "OpenAIProvider"

    main.kind, main.base_url = EndpointKind.ANTHROPIC_MESSAGES, "https://models.example.com"
    operator = grant(UserFactory(is_staff=True), ("runs_app", "change_modelendpoint"))
    endpoint_save(endpoint=main, acting_user=operator, changed=["kind", "base_url"])
    route = route_read(run)
    assert type(route.provider).__name__ == "AnthropicProvider"
    assert route.endpoint.provider == "anthropic"
