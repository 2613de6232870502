"""The kinds of model endpoint (docs/EXTENDING.md, "Model endpoints"): each kind's provider follows
from it — Responses' `openai-responses`, Anthropic's `anthropic` — and kind `custom` names its own, a
configured one; the desk refuses a custom endpoint without a provider, another kind with one, or an
unconfigured one, on the provider field, and agent definitions refuse an endpoint whose provider is
not configured and the endpoint-only providers without an endpoint."""

import pytest
from django.test import Client

from agents.definitions import AgentDefinitionInvalid, agent_definition_check
from runs_app.endpoints import endpoint_read
from runs_app.models import EndpointKind, ModelEndpoint
from tests.support.factories import EndpointModelFactory, ModelEndpointFactory, UserFactory

pytestmark = pytest.mark.django_db


def _endpoint(name: str, kind: str, provider: str = "") -> ModelEndpoint:
    endpoint = ModelEndpointFactory(name=name, kind=kind, provider=provider)
    EndpointModelFactory(endpoint=endpoint, name="the-model")
    return endpoint


def _agent(**changes) -> dict:
    return {"name": "Refunds", "instructions": "Refund eligible orders.", "tools": ["query_order"], "model": "the-model",
            **changes}


@pytest.mark.parametrize("kind, provider", [(EndpointKind.RESPONSES, "openai-responses"),
                                            (EndpointKind.ANTHROPIC_MESSAGES, "anthropic")])
def test_each_kinds_provider_follows_from_the_endpoint(kind, provider):
    endpoint = _endpoint("native", kind)
    assert agent_definition_check(_agent(endpoint="native"))["provider"] == provider
    assert endpoint_read(endpoint.pk, model="the-model").provider == provider
    with pytest.raises(AgentDefinitionInvalid) as refused:
        agent_definition_check(_agent(endpoint="native", provider="openai"))
    assert provider in refused.value.errors["provider"]


def test_a_custom_endpoint_is_called_by_the_provider_it_names(settings):
    settings.WARDEN_PROVIDERS = {**settings.WARDEN_PROVIDERS, "in-house": "runs_app.providers.openai.OpenAIProvider"}
    endpoint = _endpoint("own", EndpointKind.CUSTOM, provider="in-house")

    assert agent_definition_check(_agent(endpoint="own"))["provider"] == "in-house"
    assert endpoint_read(endpoint.pk).provider == "in-house"


def test_a_custom_endpoint_naming_an_unconfigured_provider_is_refused_on_the_endpoint():
    _endpoint("gone", EndpointKind.CUSTOM, provider="removed-since")
    with pytest.raises(AgentDefinitionInvalid) as refused:
        agent_definition_check(_agent(endpoint="gone"))
    assert "'removed-since', which is not configured" in refused.value.errors["endpoint"]


@pytest.mark.parametrize("provider", ["openai-responses", "anthropic"])
def test_an_endpoint_only_provider_without_an_endpoint_is_refused(provider):
    with pytest.raises(AgentDefinitionInvalid) as refused:
        agent_definition_check(_agent(provider=provider, model=""))
    assert "name one (`endpoint`)" in refused.value.errors["provider"]


@pytest.mark.parametrize("kind, provider, problem", [
    ("custom", "", "needs the name of that provider"),
    ("anthropic_messages", "anthropic", "names its provider: leave it blank"),
    ("custom", "nobody-configured-this", "No provider 'nobody-configured-this' is configured"),
])
def test_the_desk_refuses_a_provider_that_does_not_fit_the_kind(kind, provider, problem):
    desk = Client()
    desk.force_login(UserFactory(username="endpoint-kinds-admin", is_staff=True, is_superuser=True))
    page = desk.post("/admin/runs_app/modelendpoint/add/", {
        "name": "team-k", "kind": kind, "provider": provider, "base_url": "https://api.anthropic.com",
        "max_concurrency": "", "timeout_seconds": "60", "connect_timeout_seconds": "10",
        "offered_models-TOTAL_FORMS": "0", "offered_models-INITIAL_FORMS": "0"})

    assert page.status_code == 200 and problem in page.content.decode().replace("&#x27;", "'")
    assert not ModelEndpoint.objects.exists()


def test_the_desk_saves_a_custom_endpoint_with_its_provider():
    desk = Client()
    desk.force_login(UserFactory(username="endpoint-kinds-admin", is_staff=True, is_superuser=True))
    saved = desk.post("/admin/runs_app/modelendpoint/add/", {
        "name": "team-k", "kind": "custom", "provider": "openai", "base_url": "https://models.example.com/v1",
        "max_concurrency": "", "timeout_seconds": "60", "connect_timeout_seconds": "10",
        "offered_models-TOTAL_FORMS": "0", "offered_models-INITIAL_FORMS": "0"})

    assert saved.status_code == 302
    assert ModelEndpoint.objects.values_list("kind", "provider").get(name="team-k") == ("custom", "openai")
