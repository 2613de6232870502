"""An agent version may name a model endpoint and one of its models (docs/EXTENDING.md, "Model
endpoints"): an unknown endpoint, a model it does not offer, or a provider that does not speak it
is refused on its field, nothing saved; a saved version points at the endpoint, its runs carry it
(never a request's choice), and the API names it without ever showing its credential. Without an
endpoint nothing changes: the OPENAI_* settings are the default endpoint."""

import json

import pytest

from agents.definitions import AgentDefinitionInvalid, agent_definition_check
from agents.models import Agent, AgentVersion
from approvals_app.models import AuditEntry
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from runs_app.endpoints import ENDPOINT_OPTION, endpoint_default, run_endpoint
from runs_app.models import RunErrorCode, RunStatus
from tests.support.agents import define
from tests.support.drive import drive_until
from tests.support.factories import EndpointModelFactory, ModelEndpointFactory, UserFactory

pytestmark = pytest.mark.django_db

KEY = "sk-agent-endpoint-secret-0123456789"


@pytest.fixture
def endpoint(db):
    endpoint = ModelEndpointFactory(name="team-a", base_url="https://models.example.com/v1", credential=KEY)
    EndpointModelFactory(endpoint=endpoint, name="small-model")
    EndpointModelFactory(endpoint=endpoint, name="large-model", context_window=1_000_000)
    return endpoint


def agent(**changes) -> dict:
    return {"name": "Refunds", "instructions": "Refund eligible orders.", "tools": ["query_order"],
            "endpoint": "team-a", "model": "small-model", **changes}


def refused_fields(definition: dict) -> dict[str, str]:
    with pytest.raises(AgentDefinitionInvalid) as refused:
        agent_definition_check(definition)
    return refused.value.errors


def test_an_endpoint_and_one_of_its_models_make_a_valid_definition_whose_provider_follows(endpoint):
    clean = agent_definition_check(agent())
    assert (clean["endpoint"], clean["model"], clean["provider"]) == ("team-a", "small-model", "openai")


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"endpoint": "team-z"}, "endpoint", "unknown model endpoint 'team-z'; defined (the desk's Model endpoints): team-a"),
    ({"model": "huge-model"}, "model", "'huge-model' is not a model endpoint 'team-a' offers; it offers: large-model, small-model"),
    ({"model": ""}, "model", "endpoint 'team-a' needs one of its models; it offers: large-model, small-model"),
    ({"provider": "scripted"}, "provider", "its provider is 'openai'"),
    ({"provider_options": {"endpoint": 7}}, "provider_options", "'endpoint' is the agent's own field"),
])
def test_a_definition_naming_what_the_endpoint_does_not_offer_is_refused_on_its_field(endpoint, changes, field, words):
    errors = refused_fields(agent(**changes))
    assert words in errors[field], errors


def test_a_saved_version_names_its_endpoint_and_its_runs_call_it(endpoint, agent_admin):
    version = define(agent(), by=agent_admin)
    assert (version.endpoint, version.model, version.provider) == (endpoint, "small-model", "openai")
    entry = AuditEntry.objects.get(action="define_agent")
    assert entry.after["endpoint"] == "team-a"

    customer = UserFactory(username="erin")
    session = session_open(owner=customer, title="refund", agent=version.agent)
    # A request's own provider options cannot route the run to another endpoint.
    run = message_post(session=session, content="refund 9527", acting_user=customer,
                       provider_options={ENDPOINT_OPTION: 999}).run
    assert run.provider == "openai" and run.provider_options[ENDPOINT_OPTION] == endpoint.pk
    called = run_endpoint(run)
    assert (called.base_url, called.model, called.credential, called.slots) == (
        "https://models.example.com/v1", "small-model", KEY, f"endpoint:{endpoint.pk}")
    assert KEY not in repr(called)


def test_without_an_endpoint_the_settings_are_the_default_endpoint(settings):
    settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.OPENAI_MODEL = "http://127.0.0.1:9/v1", "env-key", "env-model"
    customer = UserFactory(username="frank")
    run = message_post(session=session_open(owner=customer, title="x"), content="hello", acting_user=customer,
                       provider_options={ENDPOINT_OPTION: 5}).run
    assert ENDPOINT_OPTION not in run.provider_options and run_endpoint(run) is None
    default = endpoint_default()
    assert (default.base_url, default.credential, default.model) == ("http://127.0.0.1:9/v1", "env-key", "env-model")


def test_the_api_defines_an_agent_on_an_endpoint_and_never_shows_its_credential(endpoint, agent_admin_api):
    api = agent_admin_api
    refused = api.post("/agents", agent(model="huge-model"))
    assert refused.status_code == 422 and "body.model" in [f["field"] for f in refused.json()["fields"]]
    assert not Agent.objects.exists()
    created = api.post("/agents", agent())
    assert created.status_code == 201, created.content
    assert created.json()["version"]["endpoint"] == "team-a" and created.json()["version"]["model"] == "small-model"
    listed = api.get("/agents")
    assert listed.json()[0]["version"]["endpoint"] == "team-a"
    for body in (created.content, listed.content, api.get("/agents/refunds").content):
        assert KEY.encode() not in body and endpoint.credential.encode() not in body
    assert AgentVersion.objects.get().endpoint_id == endpoint.pk


def test_the_credential_is_stored_sealed(endpoint):
    stored = type(endpoint).objects.values_list("credential", flat=True).get(pk=endpoint.pk)
    assert stored and KEY not in stored and KEY not in json.dumps(list(type(endpoint).objects.values()), default=str)



@pytest.mark.django_db(transaction=True)
def test_a_credential_that_cannot_be_opened_fails_the_run_saying_so(endpoint, agent_admin, settings):
    version = define(agent(), by=agent_admin)
    customer = UserFactory(username="gina")
    run = message_post(session=session_open(owner=customer, title="x", agent=version.agent), content="hello",
                       acting_user=customer).run
    # SECRET_KEY changed without keeping the old one in SECRET_KEY_FALLBACKS.
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "another-secret-key-" + "y" * 40, []
    failed = drive_until(run, RunStatus.FAILED)
    assert failed.error_code == RunErrorCode.MODEL_ERROR
    assert "credential of model endpoint" in failed.error_detail and "enter it again" in failed.error_detail
