"""The admin shows every model, read-only, with list pages at a constant query count."""

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.support.factories import ApprovalFactory, MessageFactory, RunEventFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db

DOMAIN_APPS = ("runs_app", "tools_app", "agents", "sessions_app", "approvals_app", "notifications", "operations")
APP_MODELS = [m for m in admin.site._registry if m._meta.app_label in DOMAIN_APPS]


@pytest.fixture
def superuser_client(client):
    user = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def test_every_model_is_registered():
    from django.apps import apps

    for app in DOMAIN_APPS:
        for model in apps.get_app_config(app).get_models():
            assert model in admin.site._registry, model


@pytest.mark.parametrize("model", APP_MODELS, ids=lambda m: m._meta.label)
def test_list_pages_render_at_a_constant_query_count(superuser_client, model):
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    ApprovalFactory()
    with CaptureQueriesContext(connection) as few:
        assert superuser_client.get(url).status_code == 200
    for _ in range(5):
        ApprovalFactory()
        MessageFactory()
        RunEventFactory()
    with CaptureQueriesContext(connection) as many:
        assert superuser_client.get(url).status_code == 200
    assert len(many) == len(few)


def test_history_cannot_be_added_changed_or_deleted_through_the_admin(superuser_client):
    message = MessageFactory()
    add = reverse("admin:sessions_app_message_add")
    assert superuser_client.get(add).status_code == 403
    change = reverse("admin:sessions_app_message_change", args=[message.pk])
    response = superuser_client.post(change, {"content": "rewritten"})
    assert response.status_code == 403
    delete = reverse("admin:sessions_app_message_delete", args=[message.pk])
    assert superuser_client.post(delete, {"post": "yes"}).status_code == 403
    message.refresh_from_db()
    assert message.content != "rewritten"


def test_a_run_page_shows_steps_tool_calls_approvals_and_events(superuser_client):
    approval = ApprovalFactory()
    RunEventFactory(run=approval.run, type="approval_requested")
    url = reverse("admin:runs_app_run_change", args=[approval.run.pk])
    body = superuser_client.get(url).content.decode()
    assert "execute_refund" in body and "approval_requested" in body and "Approvals" in body


def test_session_page_shows_history(superuser_client):
    session = SessionFactory()
    MessageFactory(session=session, content="check order 9527")
    body = superuser_client.get(reverse("admin:sessions_app_session_change", args=[session.pk])).content.decode()
    assert "check order 9527" in body
