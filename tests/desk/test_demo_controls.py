"""The desk's demo buttons exist in demo mode only, for those the access policy lets arm faults."""

import pytest
from django.contrib.auth.models import Permission
from django.test import override_settings
from django.urls import reverse

from approvals_app.models import AuditEntry
from tests.support.desk import csrf_client, csrf_token_of, staff_user

pytestmark = pytest.mark.django_db

FAULTS = reverse("admin:demo_simfault_arm")


def test_without_demo_mode_there_are_no_demo_buttons_and_the_view_is_gone(operator):
    operator.user_permissions.add(Permission.objects.get(codename="change_simfault"))
    client = csrf_client(operator)
    with override_settings(WARDEN_DEMO=False):
        page = client.get(reverse("admin:index"))
        assert 'id="desk-demo"' not in page.content.decode()
        assert client.post(FAULTS, {"preset": "lookups_unavailable", "csrfmiddlewaretoken": csrf_token_of(page)}).status_code == 404


def test_in_demo_mode_only_staff_who_may_arm_faults_see_or_use_the_buttons(viewer):
    client = csrf_client(viewer)
    with override_settings(WARDEN_DEMO=True):
        page = client.get(reverse("admin:index"))
        assert 'id="desk-demo"' not in page.content.decode()
        assert client.post(FAULTS, {"preset": "lookups_unavailable", "csrfmiddlewaretoken": csrf_token_of(page)}).status_code == 403
        assert not AuditEntry.objects.exists()
        armer = staff_user("armer", "change_simfault")
        page = csrf_client(armer).get(reverse("admin:index")).content.decode()
        assert 'id="desk-demo"' in page and 'id="demo-timeout_after_booking"' in page


def test_the_gateway_unreachable_is_said_and_nothing_is_audited(db, settings):
    armer = staff_user("armer", "change_simfault")
    settings.WARDEN_DEMO = True
    settings.WARDEN_SIM_BASE_URL = "http://127.0.0.1:9/sim"  # nothing listens there
    client = csrf_client(armer)
    token = csrf_token_of(client.get(reverse("admin:index")))
    response = client.post(FAULTS, {"preset": "timeout_after_booking", "csrfmiddlewaretoken": token}, follow=True)
    messages = [str(m) for m in response.context["messages"]]
    assert any(m.startswith("Nothing armed: the simulated payment service") for m in messages), messages
    assert not AuditEntry.objects.exists()
