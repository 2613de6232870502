"""The demo's webhook receiver page (/sim/webhooks/, demo mode only): `demo_setup` wires the
"Demo receiver" endpoint to it; real deliveries arrive signed, are listed for staff, and a
forged one is shown as such."""

import pytest
from django.core.management import call_command
from django.db import transaction

from engine.actions.runs import run_end
from engine.webhooks import webhooks_deliver_due
from runs_app.models import DeliveryStatus, NotificationKind, RunErrorCode, RunStatus, WebhookDelivery, WebhookEndpoint
from runs_app.notifications import webhook_body_bytes
from tests.factories import RunFactory, UserFactory
from tools_app.demo.models import SimWebhookReceipt
from runs_app.notifications import DEMO_WEBHOOK_ENDPOINT

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_setup_wires_the_receiver_and_deliveries_arrive_signed(live_server, settings, client):
    settings.WARDEN_DEMO = True
    settings.WARDEN_PUBLIC_URL = live_server.url
    call_command("demo_setup", verbosity=0)
    endpoint = WebhookEndpoint.objects.get(name=DEMO_WEBHOOK_ENDPOINT)
    assert endpoint.url == f"{live_server.url}/sim/webhooks/" and set(endpoint.kinds) == set(NotificationKind.values)

    with transaction.atomic():
        run_end(run=RunFactory(), to=RunStatus.FAILED, lease_token=None, error_code=RunErrorCode.INTERNAL, error_detail="demo")
    assert webhooks_deliver_due() == 1
    (delivery,) = WebhookDelivery.objects.all()
    assert delivery.status == DeliveryStatus.DELIVERED
    (receipt,) = SimWebhookReceipt.objects.all()
    assert receipt.signature_valid and receipt.webhook_id == str(delivery.id) and receipt.kind == "run.failed"
    assert receipt.body.encode() == webhook_body_bytes(delivery.body)

    forged = client.post("/sim/webhooks/", data=b'{"type": "run.failed"}', content_type="application/json",
                         HTTP_WEBHOOK_ID="msg_x", HTTP_WEBHOOK_TIMESTAMP="1", HTTP_WEBHOOK_SIGNATURE="v1,AAAA")
    assert forged.status_code == 400 and forged.json()["signature_valid"] is False

    assert client.get("/sim/webhooks/").status_code == 302  # staff only
    client.force_login(UserFactory(is_staff=True))
    page = client.get("/sim/webhooks/").content.decode()
    assert str(delivery.id) in page and "INVALID" in page and "valid" in page


def test_the_receiver_does_not_exist_outside_demo_mode(client, settings):
    settings.WARDEN_DEMO = False
    assert client.get("/sim/webhooks/").status_code == 404
    assert client.post("/sim/webhooks/", data=b"{}", content_type="application/json").status_code == 404
