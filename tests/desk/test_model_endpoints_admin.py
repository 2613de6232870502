"""The desk's Model endpoints: the credential is write-only — typed into a password field that
never shows it back, stored sealed, said to be "set" or "not set" and nothing more, on the change
page, the list, the audit trail and the messages alike. A new one replaces it; a blank field keeps
it. Defining endpoints needs runs_app.change_modelendpoint; others see no field to type one into."""

import pytest
from django.test import Client

from agents.models import Agent
from approvals_app.models import AuditEntry
from config.secrets import secret_open
from runs_app.models import EndpointModel, ModelEndpoint
from tests.support.api import grant
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db

FIRST_KEY = "sk-first-key-abcdefghijklmnop0123"
SECOND_KEY = "sk-second-key-qrstuvwxyz456789"


@pytest.fixture
def endpoint_admin(db):
    user = grant(UserFactory(username="endpoint-admin", is_staff=True),
                 ("runs_app", "change_modelendpoint"), ("runs_app", "view_modelendpoint"), ("runs_app", "add_modelendpoint"))
    client = Client()
    client.force_login(user)
    return client


def _form(**changes) -> dict:
    form = {"name": "team-a", "kind": "chat_completions", "base_url": "https://models.example.com/v1",
            "new_credential": "", "max_concurrency": "", "timeout_seconds": "60", "connect_timeout_seconds": "10",
            "offered_models-TOTAL_FORMS": "1", "offered_models-INITIAL_FORMS": "0",
            "offered_models-0-name": "small-model", "offered_models-0-input_price_per_million": "0.15",
            "offered_models-0-output_price_per_million": "0.60", "offered_models-0-context_window": "128000"}
    return form | changes


def _stored() -> str:
    return ModelEndpoint.objects.values_list("credential", flat=True).get(name="team-a")


def _change(client, endpoint, **changes):
    data = _form(**changes) | {"offered_models-TOTAL_FORMS": "0", "offered_models-INITIAL_FORMS": "0"}
    data = {k: v for k, v in data.items() if not k.startswith("offered_models-0-")}
    return client.post(f"/admin/runs_app/modelendpoint/{endpoint.pk}/change/", data)


def test_the_credential_is_write_only_on_every_page(endpoint_admin):
    added = endpoint_admin.post("/admin/runs_app/modelendpoint/add/", _form(new_credential=FIRST_KEY), follow=True)
    assert added.status_code == 200 and FIRST_KEY not in added.content.decode()
    endpoint = ModelEndpoint.objects.get(name="team-a")
    assert FIRST_KEY not in _stored() and secret_open(_stored()) == FIRST_KEY  # sealed at rest
    assert list(EndpointModel.objects.filter(endpoint=endpoint).values_list("name", flat=True)) == ["small-model"]

    page = endpoint_admin.get(f"/admin/runs_app/modelendpoint/{endpoint.pk}/change/").content.decode()
    assert FIRST_KEY not in page and _stored() not in page
    assert 'type="password"' in page and "set" in page and "not set" not in page
    listing = endpoint_admin.get("/admin/runs_app/modelendpoint/").content.decode()
    assert FIRST_KEY not in listing and _stored() not in listing and "small-model" in listing

    # A blank field keeps the credential; a new one replaces it; removing it leaves none.
    assert _change(endpoint_admin, endpoint, timeout_seconds="30").status_code == 302
    assert secret_open(_stored()) == FIRST_KEY
    rotated = _change(endpoint_admin, endpoint, new_credential=SECOND_KEY)
    assert rotated.status_code == 302 and secret_open(_stored()) == SECOND_KEY
    after = endpoint_admin.get(rotated["Location"]).content.decode()
    assert "Credential rotated" in after and SECOND_KEY not in after
    assert _change(endpoint_admin, endpoint, credential_clear="on").status_code == 302
    assert _stored() == ""
    assert "not set" in endpoint_admin.get(f"/admin/runs_app/modelendpoint/{endpoint.pk}/change/").content.decode()

    audit = list(AuditEntry.objects.filter(action="define_model_endpoint").order_by("id").values_list("after", flat=True))
    assert [a.get("credential") for a in audit] == ["set", None, "rotated", "removed"]
    assert not any(key in str(audit) for key in (FIRST_KEY, SECOND_KEY))
    # The inline's rows are saved and audited with their endpoint: the other saves left the model be.
    assert audit[0]["models"] == {"added": ["small-model"]}
    assert list(EndpointModel.objects.filter(endpoint=endpoint).values_list("name", flat=True)) == ["small-model"]


def test_a_repriced_model_is_audited_with_its_endpoint(endpoint_admin):
    endpoint_admin.post("/admin/runs_app/modelendpoint/add/", _form())
    endpoint = ModelEndpoint.objects.get(name="team-a")
    offered = EndpointModel.objects.get(endpoint=endpoint)
    repriced = _form(**{"offered_models-0-output_price_per_million": "0.90"}) | {
        "offered_models-INITIAL_FORMS": "1", "offered_models-0-id": str(offered.pk), "offered_models-0-endpoint": str(endpoint.pk)}
    assert endpoint_admin.post(f"/admin/runs_app/modelendpoint/{endpoint.pk}/change/", repriced).status_code == 302
    assert str(EndpointModel.objects.get(pk=offered.pk).output_price_per_million) == "0.9000"
    last = AuditEntry.objects.filter(action="define_model_endpoint").latest("id")
    assert last.after["models"]["changed"] == ["small-model"] and "models" in last.after["changed"]


def test_a_refused_credential_is_not_shown_back(endpoint_admin):
    response = endpoint_admin.post("/admin/runs_app/modelendpoint/add/", _form(new_credential="sk-with a-space-secret"))
    assert response.status_code == 200
    assert "printable ASCII" in response.content.decode() and "a-space-secret" not in response.content.decode()
    assert not ModelEndpoint.objects.exists()


def test_a_base_url_with_a_password_is_refused(endpoint_admin):
    response = endpoint_admin.post("/admin/runs_app/modelendpoint/add/",
                                   _form(base_url="https://user:hunter2hunter2@models.example.com/v1"))
    assert response.status_code == 200 and "no user or password" in response.content.decode()
    assert not ModelEndpoint.objects.exists()


def test_without_the_permission_there_is_nothing_to_type_a_credential_into(endpoint_admin):
    endpoint_admin.post("/admin/runs_app/modelendpoint/add/", _form(new_credential=FIRST_KEY))
    endpoint = ModelEndpoint.objects.get(name="team-a")
    viewer = Client()
    viewer.force_login(grant(UserFactory(username="definer", is_staff=True), ("agents", "change_agent")))
    page = viewer.get(f"/admin/runs_app/modelendpoint/{endpoint.pk}/change/")
    assert page.status_code == 200
    assert 'type="password"' not in page.content.decode() and FIRST_KEY not in page.content.decode()
    assert _change(viewer, endpoint, new_credential=SECOND_KEY).status_code == 403
    assert secret_open(_stored()) == FIRST_KEY
    stranger = Client()
    stranger.force_login(UserFactory(username="stranger", is_staff=True))
    assert stranger.get(f"/admin/runs_app/modelendpoint/{endpoint.pk}/change/").status_code == 403


def _agent_form(**changes) -> dict:
    form = {"name": "Refunds", "slug": "", "instructions": "Refund eligible orders.", "endpoint": "team-a", "provider": "",
            "model": "small-model", "tools": "query_order", "interjection_classifier": "model", "approval_rules": "",
            "budgets": "", "budget_limits": "", "provider_options": "", "write_caps": "", "limits": "",
            "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    return form | changes


def test_an_agent_names_an_endpoint_and_one_of_its_models_in_the_desk(endpoint_admin):
    endpoint_admin.post("/admin/runs_app/modelendpoint/add/", _form(new_credential=FIRST_KEY))
    definer = Client()
    definer.force_login(grant(UserFactory(username="definer", is_staff=True), ("agents", "change_agent")))
    refused = definer.post("/admin/agents/agent/add/", _agent_form(model="huge-model"))
    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert "'huge-model' is not a model endpoint 'team-a' offers; it offers: small-model" in " ".join(errors["model"]), errors
    assert not Agent.objects.exists()
    saved = definer.post("/admin/agents/agent/add/", _agent_form())
    assert saved.status_code == 302, saved.context["adminform"].form.errors if saved.context else saved
    version = Agent.objects.get(slug="refunds").current_version
    assert (version.endpoint.name, version.model, version.provider) == ("team-a", "small-model", "openai")
    page = definer.get(f"/admin/agents/agent/{version.agent_id}/change/").content.decode()
    assert '<option value="team-a" selected>' in page and FIRST_KEY not in page


def test_a_model_an_agent_uses_stays_offered(endpoint_admin):
    endpoint_admin.post("/admin/runs_app/modelendpoint/add/", _form(new_credential=FIRST_KEY))
    endpoint = ModelEndpoint.objects.get(name="team-a")
    offered = EndpointModel.objects.get(endpoint=endpoint)
    definer = Client()
    definer.force_login(grant(UserFactory(username="definer", is_staff=True), ("agents", "change_agent")))
    assert definer.post("/admin/agents/agent/add/", _agent_form()).status_code == 302
    remove = _form() | {"offered_models-INITIAL_FORMS": "1", "offered_models-0-id": str(offered.pk),
                        "offered_models-0-endpoint": str(endpoint.pk), "offered_models-0-DELETE": "on"}
    refused = endpoint_admin.post(f"/admin/runs_app/modelendpoint/{endpoint.pk}/change/", remove)
    assert refused.status_code == 200 and "small-model is the model of refunds" in refused.content.decode()
    assert EndpointModel.objects.filter(pk=offered.pk).exists()
    renamed = _form(**{"offered_models-0-name": "renamed-model"}) | {
        "offered_models-INITIAL_FORMS": "1", "offered_models-0-id": str(offered.pk), "offered_models-0-endpoint": str(endpoint.pk)}
    assert endpoint_admin.post(f"/admin/runs_app/modelendpoint/{endpoint.pk}/change/", renamed).status_code == 200
    assert EndpointModel.objects.get(pk=offered.pk).name == "small-model"
