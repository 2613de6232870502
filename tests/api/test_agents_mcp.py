"""An agent definition over the API names MCP servers and the tools chosen from each: saving it asks
the servers, and the version lists the tools it keeps — name, server, read or write, description —
never the server's credential. A server that is not defined, a tool it does not offer or a server
that cannot be reached refuses the save (422 `invalid_agent`, the field named) and nothing is saved."""

import pytest

from agents.models import Agent, AgentVersion
from engine.actions.mcp_servers import mcp_server_save
from tests.support.api import Api, grant
from tests.support.factories import ApiKeyFactory, UserFactory
from tests.support.mcp_server import McpPaymentsServer
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db

TOKEN = "mcp-api-token-0123456789"


@pytest.fixture(scope="module")
def payments():
    with McpPaymentsServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def definer(db):
    return grant(UserFactory(username="mcp-definer", is_staff=True), ("agents", "change_agent"), ("agents", "view_agent"),
                 ("tools_app", "change_mcpserver"))


@pytest.fixture
def definer_api(definer):
    return Api(ApiKeyFactory(owner=definer).secret)


@pytest.fixture
def payments_server(definer, payments):
    payments.reset()
    return mcp_server_save(acting_user=definer, fields={"name": "payments", "transport": "http", "url": payments.url},
                           credential={"Authorization": f"Bearer {TOKEN}"})


def refund_agent(mcp_servers: dict) -> dict:
    return {"name": "Refunds", "slug": "refunds", "instructions": "Refund eligible orders.", "provider": "scripted",
            "mcp_servers": mcp_servers}


CHOSEN = {"payments": {"tools": ["lookup_order", "refund"], "options": {"refund": {"reconciler": "find_refund"}}}}


def test_a_definition_with_mcp_servers_lists_the_tools_its_version_keeps(definer_api, payments_server):
    created = definer_api.post("/agents", refund_agent(CHOSEN))
    assert created.status_code == 201, created.content
    version = created.json()["version"]
    assert version["mcp_servers"] == CHOSEN
    assert [(t["name"], t["server"], t["effect"]) for t in version["mcp_tools"]] == [
        ("lookup_order", "payments", "read"), ("refund", "payments", "write")]
    assert all(t["description"] for t in version["mcp_tools"])
    assert TOKEN not in created.content.decode()
    assert definer_api.get("/agents/refunds").json()["version"]["mcp_tools"] == version["mcp_tools"]

    changed = definer_api.client.put("/api/v1/agents/refunds", refund_agent({"payments": {"tools": ["lookup_order"]}}),
                                     content_type="application/json", **definer_api.headers)
    assert changed.status_code == 200, changed.content
    assert changed.json()["versions"] == [2, 1]
    assert [t["name"] for t in changed.json()["version"]["mcp_tools"]] == ["lookup_order"]


def _unreachable(definer) -> None:
    mcp_server_save(acting_user=definer, fields={"name": "gone", "transport": "http",
                                                 "url": f"http://127.0.0.1:{free_port()}/mcp", "timeout_seconds": 5})


@pytest.mark.parametrize(("mcp_servers", "field", "words"), [
    ({"nowhere": {"tools": ["refund"]}}, "body.mcp_servers.nowhere", "no MCP server 'nowhere' is defined"),
    ({"payments": {"tools": ["refund", "transfer_all_funds"]}}, "body.mcp_servers.payments.tools",
     "payments offers no tool 'transfer_all_funds'"),
    ({"payments": {"tools": ["refund"], "options": {"refund": {"reconciler": "ask_nobody"}}}},
     "body.mcp_servers.payments.options.refund", "the reconciler 'ask_nobody' is not one of payments's tools"),
    ({"payments": {"tools": "refund"}}, "body.mcp_servers.payments.tools", "a list of the server's tool names"),
    ({"gone": {"tools": ["refund"]}}, "body.mcp_servers.gone", "could not list the tools of MCP server gone"),
])
def test_a_definition_the_servers_refuse_is_422_naming_the_field_and_nothing_is_saved(
        definer, definer_api, payments_server, mcp_servers, field, words):
    _unreachable(definer)
    refused = definer_api.post("/agents", refund_agent(mcp_servers))
    assert refused.status_code == 422, refused.content
    body = refused.json()
    assert body["code"] == "invalid_agent", body
    messages = {f["field"]: f["message"] for f in body["fields"]}
    assert field in messages and words in messages[field], body
    assert TOKEN not in refused.content.decode()
    assert not Agent.objects.exists() and not AgentVersion.objects.exists()
