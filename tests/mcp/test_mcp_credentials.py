"""An MCP server's credential goes to the server and nowhere else (docs/EXTENDING.md, "MCP servers"):
a run that reads and writes through it leaves the credential in no API response, admin page, log
line or span — each searched for it here — and the database holds it sealed."""

import logging
import uuid

import pytest
from django.db import connection
from django.test import Client
from django.urls import NoReverseMatch, reverse
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from config.tracing import tracing_reset, tracing_setup
from engine.actions.mcp_servers import mcp_server_save
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from engine.loop import run_drive
from runs_app.models import Run, RunStatus
from tests.support.agents import define
from tests.support.api import Api
from tests.support.factories import ApiKeyFactory, UserFactory
from tests.support.mcp_server import McpPaymentsServer
from tools_app.models import McpServer, ToolCall

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "tok-" + uuid.uuid4().hex


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing_setup(exporter=exporter, sql=True)
    connection.close()  # the next connection is opened through the psycopg instrumentation
    yield exporter
    tracing_reset()
    connection.close()


def _admin_pages(run, server, version) -> list[str]:
    pages = [reverse("admin:runs_app_run_change", args=[run.pk]), reverse("admin:runs_app_run_changelist"),
             reverse("admin:agents_agent_change", args=[version.agent_id]),
             reverse("admin:approvals_app_auditentry_changelist")]
    try:
        pages += [reverse("admin:tools_app_mcpserver_change", args=[server.pk]),
                  reverse("admin:tools_app_mcpserver_changelist"),
                  reverse("admin:tools_app_mcpserver_history", args=[server.pk])]
    except NoReverseMatch:
        pytest.fail("the desk has no MCP servers pages")
    return pages


def test_an_mcp_servers_credential_appears_in_no_api_response_admin_page_log_line_or_span(spans, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, the SDK's and its HTTP client's included
    admin = UserFactory(username="mcp-cred-admin", is_staff=True, is_superuser=True)
    with McpPaymentsServer(token=SECRET) as payments:
        server = mcp_server_save(acting_user=admin, fields={"name": "payments", "url": payments.url},
                                 credential={"Authorization": f"Bearer {SECRET}"})
        version = define({
            "name": "Refunds over MCP", "slug": "mcp-cred", "instructions": "Refund.", "provider": "scripted",
            "tools": [], "mcp_servers": {"payments": {"tools": ["lookup_order", "refund"],
                                                      "options": {"refund": {"reconciler": "find_refund"}}}},
            "approval_rules": {"refund": [{"when": "amount <= 20", "approval": "none"}]},
            "provider_options": {"delay": 0, "turns": [
                {"calls": [{"name": "lookup_order", "arguments": {"order_id": "9527"}}]},
                {"calls": [{"name": "refund", "arguments": {"order_id": "9527", "amount": 9.0, "currency": "EUR"}}]},
                {"text": "Refunded."}]},
        }, by=admin)
        customer = UserFactory()
        session = session_open(owner=customer, title="creds", agent=version.agent)
        run = message_post(session=session, content="Refund 9527 please", acting_user=customer).run
        assert run_drive(run_id=str(run.id)) == "completed"
        sent = payments.calls()
    assert [c["tool"] for c in sent] == ["lookup_order", "refund"] and all(c["authorized"] for c in sent)
    assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED

    # Spans: every name, attribute and event of every span of the run.
    finished = spans.get_finished_spans()
    assert any(s.name == "tool.call" for s in finished)
    for item in finished:
        text = repr((item.name, dict(item.attributes or {}), [(e.name, dict(e.attributes or {})) for e in item.events]))
        assert SECRET not in text, item.name
    # Log lines, as formatted and with their arguments.
    assert caplog.records
    for record in caplog.records:
        assert SECRET not in record.getMessage() and SECRET not in repr(record.__dict__), record.name
    # The API, as the customer and as a superuser.
    calls = [str(c.pk) for c in ToolCall.objects.filter(run=run)]
    for owner in (customer, admin):
        api = Api(ApiKeyFactory(owner=owner).secret)
        for path in (f"/runs/{run.id}", f"/runs/{run.id}/events", "/tool-calls", *(f"/tool-calls/{c}" for c in calls),
                     "/agents", "/agents/mcp-cred", f"/sessions/{session.id}"):
            response = api.get(path)
            assert response.status_code in (200, 403, 404), (path, response.status_code)
            assert SECRET not in response.content.decode(), path
    # The desk's pages, as a superuser.
    desk = Client()
    desk.force_login(admin)
    for page in _admin_pages(run, server, version):
        response = desk.get(page)
        assert response.status_code == 200, page
        assert SECRET not in response.content.decode(), page
    # And the row holds it sealed.
    assert SECRET not in McpServer.objects.get(pk=server.pk).credential
