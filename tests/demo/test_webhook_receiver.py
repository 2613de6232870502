"""The demo's webhook receiver page (/sim/webhooks/, demo mode only): `demo_setup` wires the
"Demo receiver" endpoint to it; real deliveries arrive signed, are listed for staff, and a
forged one is shown as such."""

import httpx
import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import transaction

from engine.actions.runs import run_end
from engine.webhooks import webhooks_deliver_due
from demo.accounts import DEMO_WEBHOOK_ENDPOINT
from notifications.models import DeliveryStatus, NotificationKind, WebhookDelivery, WebhookEndpoint
from runs_app.models import RunErrorCode, RunStatus
from notifications.outbox import webhook_body_bytes
from tests.support.factories import RunFactory, UserFactory
from demo.models import SimWebhookReceipt

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_setup_wires_the_receiver_and_deliveries_arrive_signed(simulator, settings, client):
    """The receiver is a page of the simulated services' own server (never of Warden's)."""
    settings.WARDEN_DEMO = True
    call_command("demo_setup", verbosity=0)
    endpoint = WebhookEndpoint.objects.get(name=DEMO_WEBHOOK_ENDPOINT)
    assert endpoint.url == f"{simulator}/webhooks/" and set(endpoint.kinds) == set(NotificationKind.values)

    with transaction.atomic():
        run_end(run=RunFactory(), to=RunStatus.FAILED, lease_token=None, error_code=RunErrorCode.INTERNAL, error_detail="demo")
    assert webhooks_deliver_due() == 1
    (delivery,) = WebhookDelivery.objects.all()
    assert delivery.status == DeliveryStatus.DELIVERED
    (receipt,) = SimWebhookReceipt.objects.all()
    assert receipt.signature_valid and receipt.webhook_id == str(delivery.id) and receipt.kind == "run.failed"
    assert receipt.body.encode() == webhook_body_bytes(delivery.body)

    forged = httpx.post(endpoint.url, content=b'{"type": "run.failed"}', headers={
        "Content-Type": "application/json", "Webhook-Id": "msg_x", "Webhook-Timestamp": "1", "Webhook-Signature": "v1,AAAA"})
    assert forged.status_code == 400 and forged.json()["signature_valid"] is False

    refused = httpx.get(endpoint.url)  # staff only: signing in is Warden's, and comes back here
    assert refused.status_code == 302
    assert refused.headers["location"].startswith(f"{settings.WARDEN_PUBLIC_URL}/admin/login/?next=")
    viewer = UserFactory(is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_simwebhookreceipt"))
    client.force_login(viewer)  # a session the simulator's server shares (same database)
    page = httpx.get(endpoint.url, cookies={settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value})
    assert page.status_code == 200
    assert str(delivery.id) in page.text and "INVALID" in page.text and "valid" in page.text


def test_the_receiver_is_no_route_of_warden_and_refuses_outside_demo_mode(simulator, settings, client):
    assert client.post("/sim/webhooks/", data=b"{}", content_type="application/json").status_code == 404
    settings.WARDEN_DEMO = False
    assert httpx.post(f"{simulator}/webhooks/", content=b"{}", headers={"Content-Type": "application/json"}).status_code == 404
