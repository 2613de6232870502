"""MCP servers on the desk, in headless Chromium at 1280×800 and 390×844 against the real web server:
an operator with tools_app.change_mcpserver adds the reference payments server — typing its URL and
its credential, which no page shows back — and checks its tools; the server then changes its tools,
and after another check the list names the agent whose version snapshotted them and the tools that
changed. Neither the list nor the server's page scrolls sideways on a phone."""

import pytest

from tests.e2e.conftest import browser_page, login, screenshot, scrolls_sideways
from tests.support.api import HttpApi, grant
from tests.support.factories import UserFactory
from tests.support.mcp_server import McpPaymentsServer
from tools_app.models import McpServer

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

TOKEN = "mcp-browser-token-0123456789"
LIST = "/admin/tools_app/mcpserver/"


def test_an_operator_adds_an_mcp_server_checks_its_tools_and_sees_which_agent_they_changed_for(procs, chromium):
    procs.start_web(simulator=False)
    operator = grant(UserFactory(username="mcp-desk-operator", is_staff=True), ("tools_app", "change_mcpserver"),
                     ("agents", "change_agent"), ("agents", "view_agent"))
    with McpPaymentsServer(token=TOKEN) as payments:
        desk = browser_page(chromium, procs.base_url, "desktop")
        login(desk, f"/admin/login/?next={LIST}add/", operator.username)
        desk.fill("#id_name", "payments")
        desk.fill("#id_url", payments.url)
        desk.fill("#id_new_credential", f"Authorization: Bearer {TOKEN}")
        screenshot(desk, "mcp-server-add", "desktop")
        desk.click('input[name="_save"]')
        desk.wait_for_selector("ul.messagelist")
        assert "Credential set" in desk.inner_text("ul.messagelist")
        server = McpServer.objects.get(name="payments")

        desk.check(f'input.action-select[value="{server.pk}"]')
        desk.select_option('select[name="action"]', "check_tools_now")
        desk.click('button[name="index"]')
        desk.wait_for_selector("ul.messagelist li.success")
        assert "Payments: 5 tools listed." in desk.inner_text("ul.messagelist")
        assert "5 tools" in desk.inner_text("#result_list td.field-tools_checked")
        assert desk.inner_text("#result_list td.field-tools_changed").strip() == "—"

        desk.goto(f"{LIST}{server.pk}/change/")
        tools = desk.inner_text(".field-tools_last_seen")
        assert all(name in tools for name in ("lookup_order", "refund", "find_refund", "close_account", "send_newsletter"))
        assert "refund · write, destructive" in tools and "lookup_order · read" in tools
        assert "send_newsletter · write, not destructive" in tools
        assert TOKEN not in desk.content() and desk.locator("#id_new_credential").input_value() == ""
        screenshot(desk, "mcp-server-tools", "desktop")

        # Over the API, as a deployment would: the web server asks the MCP server (this thread runs Playwright's loop).
        defined = HttpApi(procs.base_url, operator).post("/agents", {
            "name": "Refund agent", "slug": "refund-agent", "instructions": "Refund eligible orders.", "provider": "scripted",
            "mcp_servers": {"payments": {"tools": ["lookup_order", "refund"]}}})
        assert defined.status_code == 201, defined.text
        payments.set_variant("v2")

        phone = browser_page(chromium, procs.base_url, "phone")
        login(phone, f"/admin/login/?next={LIST}{server.pk}/change/", operator.username)
        assert not scrolls_sideways(phone)
        phone.click("#check-tools")
        phone.wait_for_selector("ul.messagelist li.success")
        assert "Payments: 4 tools listed; tools changed for refund-agent." in phone.inner_text("ul.messagelist")
        screenshot(phone, "mcp-server-checked", "phone")
        assert not scrolls_sideways(phone)
        phone.goto(LIST)
        changed = phone.inner_text("#result_list td.field-tools_changed")
        assert "refund-agent v1: lookup_order removed, refund changed — save a new version to pick it up" in changed
        screenshot(phone, "mcp-servers-drift", "phone")
        assert not scrolls_sideways(phone)
        phone.click("#result_list td.field-tools_changed a")
        phone.wait_for_url("**/admin/agents/agent/*/change/")
        assert "payments: lookup_order, refund" in phone.inner_text("body")
        phone.context.close()

        desk.goto(LIST)
        assert "lookup_order removed, refund changed" in desk.inner_text("#result_list td.field-tools_changed")
        screenshot(desk, "mcp-servers-drift", "desktop")
        assert TOKEN not in desk.content()
        desk.context.close()
