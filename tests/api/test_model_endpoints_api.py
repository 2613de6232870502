"""Model endpoints over HTTP (docs/EXTENDING.md, "Model endpoints"): read with view_modelendpoint,
defined with change_modelendpoint, the credential write-only — accepted, sealed, never in an answer
(not a created one, a changed one, a list, a detail or a refusal) — a rotated key used by the next
call, a model an agent uses kept offered, every change audited like the desk's, and a refused body
leaving everything as it was."""

import pytest

from approvals_app.models import AuditEntry
from config.secrets import secret_open
from runs_app.endpoints import endpoint_read
from runs_app.models import EndpointModel, ModelEndpoint
from tests.support.api import Api, grant
from tests.support.factories import AgentFactory, ApiKeyFactory, EndpointModelFactory, ModelEndpointFactory, UserFactory

pytestmark = pytest.mark.django_db

FIRST_KEY = "sk-first-key-abcdefghijklmnop0123"
SECOND_KEY = "sk-second-key-qrstuvwxyz456789"


@pytest.fixture
def definer_api(db):
    user = grant(UserFactory(username="endpoint-definer", is_staff=True), ("runs_app", "change_modelendpoint"))
    return Api(ApiKeyFactory(owner=user).secret)


@pytest.fixture
def viewer_api(db):
    user = grant(UserFactory(username="endpoint-viewer", is_staff=True), ("runs_app", "view_modelendpoint"))
    return Api(ApiKeyFactory(owner=user).secret)


def _body(**changes) -> dict:
    body = {"name": "team-a", "kind": "chat_completions", "base_url": "https://models.example.com/v1",
            "credential": FIRST_KEY, "max_concurrency": 4, "timeout_seconds": 30, "connect_timeout_seconds": 5,
            "models": [{"name": "small-model", "input_price_per_million": "0.15", "output_price_per_million": "0.60",
                        "context_window": 128000}]}
    return body | changes


def _stored() -> str:
    return ModelEndpoint.objects.values_list("credential", flat=True).get(name="team-a")


def _no_secret_in(response, *secrets: str) -> None:
    text = response.content.decode()
    for secret in (*secrets, *ModelEndpoint.objects.values_list("credential", flat=True)):
        assert not secret or secret not in text, f"a credential in {response.status_code} {text[:200]}"


def _state() -> tuple:
    """Everything an endpoint change could touch."""
    endpoint = ModelEndpoint.objects.get(name="team-a")
    return (ModelEndpoint.objects.filter(pk=endpoint.pk).values().get(),
            list(EndpointModel.objects.filter(endpoint=endpoint).order_by("name").values()),
            AuditEntry.objects.filter(action="define_model_endpoint").count())


def test_an_endpoint_is_defined_read_and_listed_without_its_credential(definer_api, viewer_api):
    created = definer_api.post("/model-endpoints", _body())
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["name"] == "team-a" and body["kind"] == "chat_completions" and body["credential_set"] is True
    assert body["models"] == [{"name": "small-model", "input_price_per_million": "0.1500",
                               "output_price_per_million": "0.6000", "context_window": 128000}]
    assert (body["max_concurrency"], body["timeout_seconds"], body["connect_timeout_seconds"]) == (4, 30.0, 5.0)
    assert body["provider"] == "" and body["agents"] == [] and "credential" not in body
    _no_secret_in(created, FIRST_KEY)
    assert FIRST_KEY not in _stored() and secret_open(_stored()) == FIRST_KEY  # sealed at rest

    AgentFactory(slug="refunds", version__endpoint=ModelEndpoint.objects.get(name="team-a"), version__model="small-model",
                 version__provider="openai")
    for api in (definer_api, viewer_api):
        listed = api.get("/model-endpoints")
        assert listed.status_code == 200 and [e["name"] for e in listed.json()] == ["team-a"]
        assert listed.json()[0]["agents"] == ["refunds"] and listed.json()[0]["credential_set"] is True
        detail = api.get("/model-endpoints/team-a")
        assert detail.status_code == 200 and detail.json() == listed.json()[0]
        _no_secret_in(listed, FIRST_KEY)
        _no_secret_in(detail, FIRST_KEY)
    assert viewer_api.get("/model-endpoints/nobody").json()["code"] == "not_found"


def test_a_rotated_key_is_what_the_next_call_reads_and_clearing_removes_it(definer_api):
    definer_api.post("/model-endpoints", _body())
    endpoint = ModelEndpoint.objects.get(name="team-a")
    assert endpoint_read(endpoint.pk).credential == FIRST_KEY

    rotated = definer_api.patch("/model-endpoints/team-a", {"credential": SECOND_KEY})
    assert rotated.status_code == 200 and rotated.json()["credential_set"] is True
    _no_secret_in(rotated, FIRST_KEY, SECOND_KEY)
    assert endpoint_read(endpoint.pk).credential == SECOND_KEY and SECOND_KEY not in _stored()

    # Changing something else keeps the credential.
    kept = definer_api.patch("/model-endpoints/team-a", {"timeout_seconds": 90})
    assert kept.status_code == 200 and kept.json()["timeout_seconds"] == 90.0
    assert endpoint_read(endpoint.pk).credential == SECOND_KEY

    cleared = definer_api.patch("/model-endpoints/team-a", {"credential_clear": True})
    assert cleared.status_code == 200 and cleared.json()["credential_set"] is False
    assert _stored() == "" and endpoint_read(endpoint.pk).credential == ""

    # An empty change answers the endpoint as it stands and records nothing.
    unchanged = definer_api.patch("/model-endpoints/team-a", {})
    assert unchanged.status_code == 200 and unchanged.json()["credential_set"] is False

    audit = list(AuditEntry.objects.filter(action="define_model_endpoint").order_by("id"))
    assert [entry.after.get("credential") for entry in audit] == ["set", "rotated", None, "removed"]
    assert {entry.actor.username for entry in audit} == {"endpoint-definer"}
    assert audit[0].note == "created" and audit[0].after["models"] == {"added": ["small-model"]}
    assert audit[2].after["changed"] == ["timeout_seconds"]
    assert not any(key in str([(e.before, e.after, e.note) for e in audit]) for key in (FIRST_KEY, SECOND_KEY))


def test_the_models_list_replaces_the_offered_models(definer_api):
    definer_api.post("/model-endpoints", _body())
    changed = definer_api.patch("/model-endpoints/team-a", {"models": [
        {"name": "small-model", "input_price_per_million": "0.2", "output_price_per_million": "0.8", "context_window": 64000},
        {"name": "big-model", "input_price_per_million": "2.5", "output_price_per_million": "10", "context_window": 200000}]})
    assert changed.status_code == 200, changed.content
    assert [(m["name"], m["input_price_per_million"], m["context_window"]) for m in changed.json()["models"]] == [
        ("big-model", "2.5000", 200000), ("small-model", "0.2000", 64000)]
    dropped = definer_api.patch("/model-endpoints/team-a", {"models": [changed.json()["models"][0]]})
    assert [m["name"] for m in dropped.json()["models"]] == ["big-model"]
    audit = list(AuditEntry.objects.filter(action="define_model_endpoint").order_by("id").values_list("after", flat=True))
    assert audit[1]["models"] == {"added": ["big-model"], "changed": ["small-model"]}
    assert audit[2]["models"] == {"removed": ["small-model"]}


def test_a_model_an_agent_uses_stays_offered(definer_api):
    definer_api.post("/model-endpoints", _body())
    endpoint = ModelEndpoint.objects.get(name="team-a")
    AgentFactory(slug="refunds", version__endpoint=endpoint, version__model="small-model", version__provider="openai")
    before = _state()
    refused = definer_api.patch("/model-endpoints/team-a", {"base_url": "https://elsewhere.example.com/v1", "models": [
        {"name": "other-model", "context_window": 1000}]})
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "model_in_use" and "small-model is the model of refunds" in refused.json()["message"]
    assert _state() == before


def test_idempotent_create_replays_without_the_credential(definer_api):
    first = definer_api.post("/model-endpoints", _body(), HTTP_IDEMPOTENCY_KEY="create-team-a")
    again = definer_api.post("/model-endpoints", _body(), HTTP_IDEMPOTENCY_KEY="create-team-a")
    assert first.status_code == again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert ModelEndpoint.objects.filter(name="team-a").count() == 1
    _no_secret_in(again, FIRST_KEY)


def test_a_taken_name_is_a_conflict(definer_api):
    definer_api.post("/model-endpoints", _body())
    before = _state()
    taken = definer_api.post("/model-endpoints", _body(credential=SECOND_KEY))
    assert taken.status_code == 409 and taken.json()["code"] == "endpoint_name_taken"
    _no_secret_in(taken, FIRST_KEY, SECOND_KEY)
    assert _state() == before


# (a change, the field the refusal names, its status): each leaves the endpoint as it was.
BAD_CHANGES = [
    ({"base_url": "not a url"}, "body.base_url", 422),
    ({"base_url": "ftp://models.example.com"}, "body.base_url", 422),
    ({"base_url": "https://user:hunter2hunter2@models.example.com/v1"}, "body.base_url", 422),
    ({"kind": "telepathy"}, "body.kind", 422),
    ({"kind": "custom"}, "body.provider", 422),
    ({"kind": "custom", "provider": "nonesuch"}, "body.provider", 422),
    ({"provider": "openai"}, "body.provider", 422),
    ({"credential": "sk-with a-space-secret"}, "body.credential", 422),
    ({"credential": "sk-" + "x" * 5000}, "body.credential", 422),
    ({"credential": SECOND_KEY, "credential_clear": True}, "body.credential_clear", 422),
    ({"max_concurrency": 0}, "body.max_concurrency", 422),
    ({"timeout_seconds": -1}, "body.timeout_seconds", 422),
    ({"connect_timeout_seconds": 0}, "body.connect_timeout_seconds", 422),
    ({"name": "no spaces allowed"}, "body.name", 422),
    ({"models": [{"name": "m", "input_price_per_million": "-0.01", "context_window": 10}]},
     "body.models.0.input_price_per_million", 422),
    ({"models": [{"name": "m", "output_price_per_million": "0.00001", "context_window": 10}]},
     "body.models.0.output_price_per_million", 422),
    ({"models": [{"name": "m", "input_price_per_million": 0.15, "context_window": 10}]},
     "body.models.0.input_price_per_million", 422),
    ({"models": [{"name": "m", "context_window": 0}]}, "body.models.0.context_window", 422),
    ({"models": [{"name": "m", "context_window": 10}, {"name": "m", "context_window": 20}]}, "body.models.1.name", 422),
    ({"models": [{"name": "m"}]}, "body.models.0.context_window", 422),
    ({"models": [{"name": "m", "context_window": 10, "family": "gpt"}]}, "body.models.0.family", 422),
    ({"api_key": SECOND_KEY}, "body.api_key", 422),
]


@pytest.mark.parametrize("change, field, status", BAD_CHANGES, ids=[next(iter(c)) for c, _, _ in BAD_CHANGES])
def test_a_bad_change_names_its_field_and_saves_nothing(definer_api, change, field, status):
    definer_api.post("/model-endpoints", _body())
    before = _state()
    refused = definer_api.patch("/model-endpoints/team-a", {"timeout_seconds": 45, **change})
    assert refused.status_code == status, refused.content
    assert refused["Content-Type"].startswith("application/json")
    assert field in [f["field"] for f in refused.json()["fields"]], refused.json()
    _no_secret_in(refused, FIRST_KEY, SECOND_KEY, "a-space-secret")
    assert _state() == before


@pytest.mark.parametrize("change, field, status", BAD_CHANGES, ids=[next(iter(c)) for c, _, _ in BAD_CHANGES])
def test_a_bad_definition_creates_nothing(definer_api, change, field, status):
    refused = definer_api.post("/model-endpoints", _body(**{"name": "team-b", **change}))
    assert refused.status_code in (status, 422), refused.content
    _no_secret_in(refused, FIRST_KEY, SECOND_KEY, "a-space-secret")
    assert not ModelEndpoint.objects.exists() and not EndpointModel.objects.exists()
    assert not AuditEntry.objects.filter(action="define_model_endpoint").exists()


def test_without_the_permissions_every_operation_is_refused(definer_api, alice_api, operator_api, viewer_api):
    definer_api.post("/model-endpoints", _body())
    before = _state()
    for api in (alice_api, operator_api):
        for response in (api.get("/model-endpoints"), api.get("/model-endpoints/team-a"),
                         api.post("/model-endpoints", _body(name="team-b", credential=SECOND_KEY)),
                         api.patch("/model-endpoints/team-a", {"credential": SECOND_KEY})):
            assert response.status_code == 403 and response.json()["code"] == "not_permitted", response.content
            _no_secret_in(response, FIRST_KEY, SECOND_KEY)
    # Reading is not defining.
    for response in (viewer_api.post("/model-endpoints", _body(name="team-b")),
                     viewer_api.patch("/model-endpoints/team-a", {"credential": SECOND_KEY})):
        assert response.status_code == 403 and "change_modelendpoint" in response.json()["message"]
    assert Api().get("/model-endpoints").status_code == 401
    assert _state() == before and not ModelEndpoint.objects.filter(name="team-b").exists()


def test_endpoints_are_not_deleted_over_the_api(definer_api):
    definer_api.post("/model-endpoints", _body())
    response = definer_api.client.delete("/api/v1/model-endpoints/team-a", **definer_api.headers)
    assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"
    assert ModelEndpoint.objects.filter(name="team-a").exists()


def test_an_endpoint_defined_elsewhere_reads_the_same(viewer_api):
    endpoint = ModelEndpointFactory(name="seeded", credential=FIRST_KEY)
    EndpointModelFactory(endpoint=endpoint, name="m1")
    detail = viewer_api.get("/model-endpoints/seeded")
    assert detail.status_code == 200 and detail.json()["credential_set"] is True
    assert FIRST_KEY not in detail.content.decode() and endpoint.credential not in detail.content.decode()
    assert [m["name"] for m in detail.json()["models"]] == ["m1"]
