"""Webhook targets (issue 27, finding 2): a user allowed to add webhook endpoints registered
`http://127.0.0.1:5432/`, `http://localhost:8800/metrics`, `http://[::1]:8811/` and
`http://169.254.169.254/latest/meta-data/`; each was accepted and contacted, and the first 500
characters of each answer were stored and shown. Now the desk refuses them naming why; a target
stored anyway (through the ORM, or whose name resolves elsewhere later) is refused again at delivery
with nothing sent; and what a receiver answers is kept as its status and size only."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import Permission

from engine.actions.runs import run_end
from engine.webhooks import webhooks_deliver_due
from notifications.models import NotificationKind, WebhookAttempt, WebhookEndpoint
from runs_app.models import RunErrorCode, RunStatus
from tests.support.desk import csrf_client, csrf_token_of
from tests.support.factories import RunFactory, UserFactory
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db(transaction=True)

FOUND = ["http://127.0.0.1:5432/", "http://localhost:8800/metrics", "http://[::1]:8811/",
         "http://169.254.169.254/latest/meta-data/", "http://10.0.0.7/hook", "http://224.0.0.1/"]


@pytest.fixture
def no_allowed_hosts(settings):
    settings.WARDEN_WEBHOOK_ALLOWED_HOSTS = []
    return settings


class Receiver:
    """A real HTTP receiver on this machine that answers with a secret-looking body."""

    def __init__(self):
        self.port, self.hits = free_port(), []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["content-length"]))
                receiver.hits.append(self.headers["host"])
                body = b"internal-metrics: secret=42"
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def _fail_a_run():
    from django.db import transaction

    with transaction.atomic():
        run_end(run=RunFactory(), to=RunStatus.FAILED, lease_token=None, error_code=RunErrorCode.INTERNAL,
                error_detail="webhook target test")


@pytest.mark.parametrize("url", FOUND)
def test_the_desk_refuses_a_receiver_on_this_machine_or_its_network(no_allowed_hosts, url):
    staff = UserFactory(username="hooks-admin", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["add_webhookendpoint", "view_webhookendpoint"]))
    client = csrf_client(staff)
    page = client.get("/admin/notifications/webhookendpoint/add/")
    response = client.post("/admin/notifications/webhookendpoint/add/", {
        "csrfmiddlewaretoken": csrf_token_of(page), "name": "probe", "url": url, "kinds": [NotificationKind.RUN_FAILED],
        "active": "on", "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    })
    assert response.status_code == 200, response.status_code  # the form again, with the error
    assert "Not a receiver Warden sends to" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_a_stored_loopback_target_is_refused_at_delivery_and_nothing_is_sent(no_allowed_hosts, receiver):
    WebhookEndpoint.objects.create(name="rebound", url=f"http://localhost:{receiver.port}/in", kinds=[NotificationKind.RUN_FAILED])
    _fail_a_run()
    assert webhooks_deliver_due() == 1
    (attempt,) = WebhookAttempt.objects.all()
    assert attempt.error.startswith("refused: localhost is a loopback address") and attempt.status_code is None
    assert receiver.hits == []


def test_an_allowed_receiver_gets_the_delivery_and_only_its_status_and_size_are_kept(no_allowed_hosts, receiver):
    no_allowed_hosts.WARDEN_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.0/8"]
    WebhookEndpoint.objects.create(name="ok", url=f"http://localhost:{receiver.port}/in?token=t", kinds=[NotificationKind.RUN_FAILED])
    _fail_a_run()
    assert webhooks_deliver_due() == 1
    (attempt,) = WebhookAttempt.objects.all()
    assert attempt.status_code == 200 and attempt.error == ""
    assert attempt.response_excerpt == "27 bytes"  # not the body
    assert receiver.hits == [f"localhost:{receiver.port}"]  # connected to the checked address, Host as written
