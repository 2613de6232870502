"""The openai provider against model endpoints read from the database (runs_app.endpoints): each
endpoint its own URL, key, model and call slots; summaries and classifications go where the run's
stream goes; a key a server echoes back is redacted from the error; a credential sealed under a
SECRET_KEY no longer configured cannot be opened."""

import threading

import pytest
from django.test import override_settings

from config.secrets import SecretUnreadable, secret_open, secret_seal
from runs_app.endpoints import endpoint_read
from runs_app.providers import get_provider
from runs_app.providers.base import ModelRequest, PermanentModelError, TextDelta, TransientModelError
from tests.support.factories import ModelEndpointFactory
from tests.support.fake_openai_server import FakeOpenAIServer
from tests.support.processes import wait_for

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": "the weather in Lisbon?"}]


@pytest.fixture
def two_servers():
    with FakeOpenAIServer() as a, FakeOpenAIServer() as b:
        yield a, b
        a.release_held()
        b.release_held()


def _call(endpoint, timeout: float = 5) -> list:
    return list(get_provider("openai", endpoint=endpoint).stream(ModelRequest(messages=MESSAGES, options={"timeout": timeout})))


def test_each_endpoint_has_its_own_url_key_model_and_call_slots(two_servers):
    server_a, server_b = two_servers
    a = endpoint_read(ModelEndpointFactory(base_url=server_a.base_url, credential="sk-aaaa", max_concurrency=1).pk, model="model-a")
    b = endpoint_read(ModelEndpointFactory(base_url=server_b.base_url, credential="sk-bbbb", max_concurrency=1).pk, model="model-b")
    server_a.enqueue(text=["held"], finish="stop", chunk_delay=600)
    held = []
    holder = threading.Thread(target=lambda: held.extend(_call(a, 900)), daemon=True)
    holder.start()
    wait_for(lambda: server_a.in_flight() == 1, timeout=30, message="the first call to hold endpoint a's only slot")

    with pytest.raises(TransientModelError, match="1 concurrent calls were all busy"):
        _call(a, 0.5)
    server_b.enqueue(text=["sunny"], finish="stop")
    assert _call(b)[0] == TextDelta("sunny")  # another endpoint's slots are its own
    assert (server_b.requests[0]["model"], server_b.authorizations) == ("model-b", ["Bearer sk-bbbb"])
    assert (server_a.requests[0]["model"], server_a.authorizations) == ("model-a", ["Bearer sk-aaaa"])
    server_a.release_held()
    holder.join(timeout=30)
    assert held[0] == TextDelta("held")


def test_summaries_and_classifications_go_to_the_runs_endpoint(two_servers):
    server_a, _ = two_servers
    provider = get_provider("openai", endpoint=endpoint_read(
        ModelEndpointFactory(base_url=server_a.base_url, credential="sk-summaries").pk, model="model-a"))
    server_a.enqueue(text=["the customer asked about order 9527"], finish="stop")
    assert provider.summarize(previous="", messages=MESSAGES, max_tokens=100).text == "the customer asked about order 9527"
    server_a.enqueue(text=['{"mode": "supplement", "reason": "adds the order number"}'], finish="stop")
    assert provider.classify_input(history=MESSAGES, text="it is 9527").mode == "supplement"
    assert [r["model"] for r in server_a.requests] == ["model-a", "model-a"]
    assert server_a.authorizations == ["Bearer sk-summaries"] * 2


def test_a_key_the_server_echoes_is_redacted_from_the_error(two_servers):
    server_a, _ = two_servers
    endpoint = endpoint_read(ModelEndpointFactory(base_url=server_a.base_url, credential="sk-echoed-secret").pk, model="m")
    server_a.enqueue(status=401, error_message="Incorrect API key provided: sk-echoed-secret.")
    with pytest.raises(PermanentModelError) as refused:
        _call(endpoint)
    assert "sk-echoed-secret" not in str(refused.value) and "[credential]" in str(refused.value)


def test_a_credential_sealed_under_a_key_no_longer_configured_cannot_be_opened(settings):
    sealed = secret_seal("sk-sealed")
    assert secret_open(sealed) == "sk-sealed"
    with override_settings(SECRET_KEY="another-secret-key-" + "x" * 40, SECRET_KEY_FALLBACKS=[]):
        with pytest.raises(SecretUnreadable):
            secret_open(sealed)
    with override_settings(SECRET_KEY="another-secret-key-" + "x" * 40, SECRET_KEY_FALLBACKS=[settings.SECRET_KEY]):
        assert secret_open(sealed) == "sk-sealed"  # rotated the documented way: still readable
