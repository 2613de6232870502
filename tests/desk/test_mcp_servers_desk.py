"""The desk's MCP servers: the credential is write-only — typed into a password field that never shows
it back, stored sealed, said to be "set" or "not set" and nothing more, on the change page, the list,
the history and the audit trail alike. "Check tools now" keeps what the server lists; when it lists
otherwise than an agent's current version snapshotted, the list names the agent and the tools. Only
holders of tools_app.change_mcpserver see the servers at all."""

import json

import pytest
from django.test import Client

from agents.models import Agent
from approvals_app.models import AuditEntry
from config.secrets import secret_open
from engine.actions.agents import agent_save
from tests.support.api import grant
from tests.support.factories import UserFactory
from tests.support.mcp_server import McpPaymentsServer
from tools_app.models import McpServer

pytestmark = pytest.mark.django_db

TOKEN = "mcp-token-0123456789abcdef"
OTHER_TOKEN = "mcp-token-fedcba9876543210"
ADD = "/admin/tools_app/mcpserver/add/"
LIST = "/admin/tools_app/mcpserver/"


@pytest.fixture(scope="module")
def payments():
    with McpPaymentsServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def server_admin(db, payments):
    payments.reset()
    user = grant(UserFactory(username="mcp-admin", is_staff=True), ("tools_app", "change_mcpserver"),
                 ("agents", "change_agent"))
    client = Client()
    client.force_login(user)
    client.user = user
    return client


def _form(url: str, **changes) -> dict:
    return {"name": "payments", "transport": "http", "url": url, "command": "", "timeout_seconds": "10",
            "new_credential": ""} | changes


def _stored() -> str:
    return McpServer.objects.values_list("credential", flat=True).get(name="payments")


def _pages(client, server) -> str:
    return "".join(client.get(path).content.decode() for path in (
        f"{LIST}{server.pk}/change/", LIST, f"{LIST}{server.pk}/history/"))


def _check(client, server):
    return client.post(LIST, {"action": "check_tools_now", "_selected_action": [server.pk]}, follow=True)


def test_the_credential_is_write_only_on_every_page_and_audited_without_its_value(server_admin, payments):
    added = server_admin.post(ADD, _form(payments.url, new_credential=f"Authorization: Bearer {TOKEN}"), follow=True)
    assert added.status_code == 200 and TOKEN not in added.content.decode()
    server = McpServer.objects.get(name="payments")
    assert TOKEN not in _stored() and json.loads(secret_open(_stored())) == {"Authorization": f"Bearer {TOKEN}"}
    pages = _pages(server_admin, server)
    assert TOKEN not in pages and _stored() not in pages
    page = server_admin.get(f"{LIST}{server.pk}/change/").content.decode()
    assert 'type="password"' in page and "not set" not in page

    # A blank field keeps the credential; a new one replaces it; removing it leaves none.
    change = f"{LIST}{server.pk}/change/"
    assert server_admin.post(change, _form(payments.url, timeout_seconds="20", name="renamed")).status_code == 302
    assert McpServer.objects.get(pk=server.pk).name == "payments"  # agent versions name it: read-only once it exists
    assert json.loads(secret_open(_stored()))["Authorization"] == f"Bearer {TOKEN}"
    rotated = server_admin.post(change, _form(payments.url, new_credential=json.dumps({"Authorization": f"Bearer {OTHER_TOKEN}"})))
    assert rotated.status_code == 302
    after = server_admin.get(rotated["Location"]).content.decode()
    assert "Credential rotated" in after and OTHER_TOKEN not in after
    assert server_admin.post(change, _form(payments.url, credential_clear="on")).status_code == 302
    assert _stored() == ""
    assert "not set" in server_admin.get(change).content.decode()
    assert not any(token in _pages(server_admin, server) for token in (TOKEN, OTHER_TOKEN))

    audit = list(AuditEntry.objects.filter(action="define_mcp_server").order_by("id").values_list("after", flat=True))
    assert [a.get("credential") for a in audit] == ["set", None, "rotated", "removed"]
    assert not any(token in str(audit) for token in (TOKEN, OTHER_TOKEN))


def test_a_refused_credential_is_named_and_not_shown_back(server_admin, payments):
    response = server_admin.post(ADD, _form(payments.url, new_credential="Authorization: Bearer sp ace\tsecret-part"))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "printable ASCII" in " ".join(errors["new_credential"]) and "secret-part" not in response.content.decode()
    assert not McpServer.objects.exists()


@pytest.mark.parametrize("url", ["ftp://mcp.example.com/mcp", "https://user:hunter2hunter2@mcp.example.com/mcp"])
def test_a_bad_url_is_refused_on_its_field_and_nothing_is_saved(server_admin, url):
    response = server_admin.post(ADD, _form(url))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "http(s) URL" in " ".join(errors["url"]), errors
    assert "hunter2" not in str(errors)
    assert not McpServer.objects.exists() and not AuditEntry.objects.filter(action="define_mcp_server").exists()


def test_checking_tools_keeps_them_and_the_list_names_agents_whose_tools_changed(server_admin, payments):
    server_admin.post(ADD, _form(payments.url, new_credential=f"Authorization: Bearer {TOKEN}"))
    server = McpServer.objects.get(name="payments")
    checked = _check(server_admin, server)
    assert "Payments: 5 tools listed." in checked.content.decode()  # the admin capitalises messages
    server.refresh_from_db()
    assert [tool["name"] for tool in server.tools_seen] == ["close_account", "find_refund", "lookup_order", "refund",
                                                            "send_newsletter"]
    assert server.tools_checked_at is not None and server.check_error == ""
    page = server_admin.get(f"{LIST}{server.pk}/change/").content.decode()
    assert "Look up an order" in page or "lookup_order" in page
    assert 'id="check-tools"' in page

    agent_save(definition={"name": "Refund agent", "slug": "refund-agent", "instructions": "Refund eligible orders.",
                           "provider": "scripted", "tools": [], "mcp_servers": {"payments": {"tools": ["lookup_order", "refund"]}}},
               acting_user=server_admin.user)
    agent = Agent.objects.get(slug="refund-agent")
    assert "save a new version" not in server_admin.get(LIST).content.decode()  # nothing changed yet

    payments.set_variant("v2")
    listing = _check(server_admin, server).content.decode()
    assert "Payments: 4 tools listed; tools changed for refund-agent." in listing
    assert "refund-agent v1</a>: lookup_order removed, refund changed — save a new version to pick it up" in listing
    assert f'href="/admin/agents/agent/{agent.pk}/change/"' in listing

    # The change page's button checks too (the server unreachable now: its error is said, and kept).
    payments.stop()
    try:
        response = server_admin.post(f"{LIST}{server.pk}/check/", follow=True)
        assert response.redirect_chain[-1][0] == f"{LIST}{server.pk}/change/"
        server.refresh_from_db()
        assert server.check_error and server.check_error in response.content.decode()
        assert [tool["name"] for tool in server.tools_seen][:1] == ["close_account"]  # the last listing is kept
    finally:
        payments.start()


def test_without_the_permission_the_servers_are_not_there(server_admin, payments):
    server_admin.post(ADD, _form(payments.url, new_credential=f"Authorization: Bearer {TOKEN}"))
    server = McpServer.objects.get(name="payments")
    stranger = Client()
    stranger.force_login(grant(UserFactory(username="definer", is_staff=True), ("agents", "change_agent"),
                               ("tools_app", "view_mcpserver")))
    for path in (LIST, ADD, f"{LIST}{server.pk}/change/", f"{LIST}{server.pk}/history/"):
        assert stranger.get(path).status_code == 403, path
    assert stranger.post(f"{LIST}{server.pk}/check/").status_code == 403
    assert stranger.post(f"{LIST}{server.pk}/change/", _form(payments.url, credential_clear="on")).status_code == 403
    assert _stored() != ""
    assert "MCP servers" not in stranger.get("/admin/").content.decode()


def _agent_form(**changes) -> dict:
    form = {"name": "Refund agent", "slug": "", "instructions": "Refund eligible orders.", "endpoint": "",
            "provider": "scripted", "model": "", "tools": "", "interjection_classifier": "model", "approval_rules": "",
            "budgets": "", "budget_limits": "", "provider_options": "", "write_caps": "", "limits": "",
            "approval_service_levels": "", "mcp_servers": "", "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    return form | changes


def test_an_agent_chooses_mcp_tools_in_the_desk_and_its_versions_show_them(server_admin, payments):
    server_admin.post(ADD, _form(payments.url, new_credential=f"Authorization: Bearer {TOKEN}"))
    refused = server_admin.post("/admin/agents/agent/add/", _agent_form(
        mcp_servers=json.dumps({"payments": {"tools": ["refund", "transfer_all_funds"]}})))
    assert refused.status_code == 200
    errors = " ".join(refused.context["adminform"].form.errors["mcp_servers"])
    assert "mcp_servers.payments.tools: payments offers no tool 'transfer_all_funds'" in errors
    assert not Agent.objects.exists()

    saved = server_admin.post("/admin/agents/agent/add/", _agent_form(
        mcp_servers=json.dumps({"payments": {"tools": ["lookup_order", "refund"]}})))
    assert saved.status_code == 302, saved.context["adminform"].form.errors if saved.context else saved
    agent = Agent.objects.get(slug="refund-agent")
    assert sorted(agent.current_version.mcp_tools) == ["lookup_order", "refund"]
    page = server_admin.get(f"/admin/agents/agent/{agent.pk}/change/").content.decode()
    assert "payments: lookup_order, refund" in page and "&quot;lookup_order&quot;" in page  # the inline, the field
    assert TOKEN not in page
