"""JSON depth and size (issue 27, finding 3): a document 300 levels deep was accepted in `POST /agents`
and `POST /tool-calls/{id}/resolve`, committed, and then every read of it was a 500 for good. Now
input deeper than 32 levels (or longer than the limit) is a 422 naming the field, nothing stored;
and a too-deep document already stored (written here through the ORM, as an older release or another
path might have) no longer breaks a read: the part beyond the limit is shown as a marker."""

import pytest

from agents.models import Agent
from config.storable import JSON_MAX_CHARS, TOO_DEEP
from runs_app.models import RunEvent
from tests.support.api import Api, grant
from tests.support.factories import AgentFactory, ApiKeyFactory, RunEventFactory, UserFactory
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db


def deep(levels: int) -> dict:
    document: dict = {"leaf": True}
    for _ in range(levels - 1):
        document = {"a": document}
    return document


def depth_of(value) -> int:
    return 1 + max(map(depth_of, value.values()), default=0) if isinstance(value, dict) else 0


@pytest.fixture
def definer_api(db):
    return Api(ApiKeyFactory(owner=grant(UserFactory(username="definer", is_staff=True), ("agents", "change_agent"))).secret)


def test_an_agent_definition_too_deep_or_too_long_is_refused_naming_the_field(definer_api):
    body = {"name": "Deep", "instructions": "x", "provider": "scripted", "tools": ["query_order"]}
    response = definer_api.post("/agents", {**body, "provider_options": deep(300)})
    assert response.status_code == 422, response.content
    (field,) = response.json()["fields"]
    assert field["field"] == "body.provider_options" and "deeper than 32 levels" in field["message"]
    response = definer_api.post("/agents", {**body, "approval_rules": {"query_order": ["x" * JSON_MAX_CHARS]}})
    assert response.status_code == 422 and response.json()["fields"][0]["field"] == "body.approval_rules"
    assert not Agent.objects.filter(name="Deep").exists()
    assert definer_api.post("/agents", {**body, "provider_options": deep(32)}).status_code == 201  # at the limit: fine


def test_a_resolution_result_too_deep_is_refused_and_the_call_stays_unknown(world, operator_api):
    response = operator_api.post(f"/tool-calls/{world.unknown_call.pk}/resolve",
                                 {"applied": True, "evidence": "ledger L-1", "result": deep(300)})
    assert response.status_code == 422 and response.json()["fields"][0]["field"] == "body.result", response.content
    assert ToolCall.objects.get(pk=world.unknown_call.pk).status == ToolCallStatus.UNKNOWN


def test_reads_of_a_too_deep_document_already_stored_still_answer(world, alice_api, definer_api):
    """The documents are written through the ORM: the API never lets one in any more."""
    run = world.run
    call = ToolCall.objects.filter(run=run).first()
    ToolCall.objects.filter(pk=call.pk).update(result=deep(300), arguments=deep(300))
    RunEventFactory(run=run, seq=run.event_seq + 1, type="tool_call", payload={"tool_call": str(call.pk), "result": deep(300)})
    AgentFactory(slug="deep-agent", version__provider_options=deep(300))

    for path in (f"/runs/{run.pk}", f"/runs/{run.pk}/events", "/tool-calls", f"/tool-calls/{call.pk}"):
        response = alice_api.get(path)
        assert response.status_code == 200, (path, response.content[:300])
        assert TOO_DEEP in response.content.decode(), path
    shown = alice_api.get(f"/tool-calls/{call.pk}").json()["result"]
    assert depth_of(shown) == 32  # the first 32 levels as stored, then the marker
    agents = definer_api.get("/agents")
    assert agents.status_code == 200 and TOO_DEEP in agents.content.decode(), agents.content[:300]
    assert RunEvent.objects.filter(run=run, type="tool_call").exists()
