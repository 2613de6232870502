"""Webhooks from the transactional outbox (docs/OPERATIONS.md, "Notifications"): written with the
event or not at all, signed per Standard Webhooks, retried with backoff, and — with a receiver
that fails the first two attempts and a deliverer killed with SIGKILL in the middle of one —
received once per delivery id for every event, each event under exactly one id."""

import base64
import hashlib
import hmac
import json
import signal
import sys
import threading
from collections import defaultdict
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import transaction
from django.utils import timezone

from engine.actions.reconciliation import RECONCILE_MAX_AUTO_ATTEMPTS, tool_call_reconcile_auto
from engine.actions.runs import run_end
from engine.sweeper import sweep_once
from notifications.models import DeliveryStatus, NotificationKind, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from runs_app.models import Run, RunErrorCode, RunEvent, RunStatus
from notifications.outbox import webhook_signature
from tests.support.factories import ApprovalFactory, RunFactory, ToolCallFactory
from tests.support.processes import free_port, wait_for
from tools_app.models import ToolCallStatus, ToolEffect

pytestmark = pytest.mark.django_db(transaction=True)


def _fail(run) -> None:
    with transaction.atomic():
        run_end(run=run, to=RunStatus.FAILED, lease_token=None, error_code=RunErrorCode.INTERNAL, error_detail="webhook test")


def _expected_signature(secret: str, webhook_id: str, timestamp: str, body: bytes) -> str:
    """The Standard Webhooks scheme, computed here independently of the code under test."""
    key = base64.b64decode(secret.split("_", 1)[1])
    digest = hmac.new(key, webhook_id.encode() + b"." + timestamp.encode() + b"." + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class Receiver:
    """A real HTTP server in the test process. Every delivery's first two attempts get a 500; the
    first third attempt is held open until the test has killed the deliverer that sent it."""

    def __init__(self, secret: str):
        self.secret = secret
        self.port = free_port()
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.attempts: dict[str, int] = defaultdict(int)
        self.held = threading.Event()
        self.release = threading.Event()
        self.held_id = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                webhook_id = self.headers["webhook-id"]
                timestamp = self.headers["webhook-timestamp"]
                signature_ok = self.headers["webhook-signature"] == _expected_signature(receiver.secret, webhook_id, timestamp, body)
                with receiver.lock:
                    receiver.attempts[webhook_id] += 1
                    attempt = receiver.attempts[webhook_id]
                    hold = attempt == 3 and receiver.held_id is None
                    if hold:
                        receiver.held_id = webhook_id
                    receiver.requests.append({"id": webhook_id, "attempt": attempt, "body": body, "signature_ok": signature_ok})
                if hold:
                    receiver.held.set()
                    receiver.release.wait(120)
                status = 500 if attempt <= 2 else 200
                try:
                    self.send_response(status)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the deliverer is dead; nobody reads this answer

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/warden"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.processes
def test_each_event_arrives_once_per_delivery_id_through_failures_and_a_killed_deliverer(procs):
    endpoint = WebhookEndpoint.objects.create(name="on-call", url="http://127.0.0.1:1/placeholder",
                                              kinds=[NotificationKind.RUN_FAILED, NotificationKind.APPROVAL_REQUESTED])
    with Receiver(endpoint.secret) as receiver:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url)
        runs = [RunFactory(), RunFactory()]
        for run in runs:
            _fail(run)
        rolled_back = RunFactory()
        with pytest.raises(RuntimeError), transaction.atomic():
            _fail(rolled_back)
            raise RuntimeError("the transaction that caused the event rolls back")
        deliveries = {str(d.id): d for d in WebhookDelivery.objects.all()}
        assert sorted(str(d.run_id) for d in deliveries.values()) == sorted(str(r.id) for r in runs)

        env = {"WARDEN_WEBHOOK_RETRY_BASE_SECONDS": "0.2", "WARDEN_WEBHOOK_TIMEOUT_SECONDS": "2"}
        sweep = [sys.executable, "manage.py", "sweep", "--loop", "--interval", "0.3"]
        deliverer = procs.start("deliverer", sweep, env=env)
        wait_for(receiver.held.is_set, timeout=90, message="a third attempt to reach the receiver")
        procs.signal("deliverer", signal.SIGKILL)  # mid-delivery: the request is out, no answer yet
        deliverer.wait(timeout=30)
        receiver.release.set()
        procs.start("deliverer-2", sweep, env=env)
        wait_for(lambda: WebhookDelivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 2, timeout=120,
                 message="both deliveries to be delivered")

    # Every request was signed with the endpoint's secret, and each id always carried the same bytes.
    assert receiver.requests and all(r["signature_ok"] for r in receiver.requests)
    by_id = defaultdict(list)
    for request in receiver.requests:
        by_id[request["id"]].append(request)
    assert set(by_id) == set(deliveries)
    events_by_id = {}
    for webhook_id, requests in by_id.items():
        assert len({r["body"] for r in requests}) == 1
        body = json.loads(requests[0]["body"])
        assert body["type"] == "run.failed" and body["data"]["status"] == "failed"
        events_by_id[webhook_id] = (body["data"]["run"], body["data"]["event_seq"])
        assert [r["attempt"] for r in requests] == list(range(1, len(requests) + 1))
    # De-duplicated by id, each committed event arrived exactly once; none twice under two ids;
    # nothing for the rolled-back one.
    assert sorted(run_id for run_id, _ in events_by_id.values()) == sorted(str(r.id) for r in runs)
    assert len(set(events_by_id.values())) == len(events_by_id)
    assert str(rolled_back.id) not in {run_id for run_id, _ in events_by_id.values()}

    # The held delivery: two refused attempts, one cut short by the kill (unfinished in the
    # admin's attempt log), then delivered by the next deliverer under the same id.
    held = WebhookDelivery.objects.get(pk=receiver.held_id)
    attempts = list(WebhookAttempt.objects.filter(delivery=held).order_by("number"))
    assert [a.status_code for a in attempts] == [500, 500, None, 200]
    assert attempts[2].finished_at is None and attempts[3].deliverer != attempts[2].deliverer
    assert held.attempts == 4 and held.delivered_at is not None
    other = next(d for d in WebhookDelivery.objects.exclude(pk=held.pk))
    assert list(other.attempt_log.order_by("number").values_list("status_code", flat=True)) == [500, 500, 200]


def test_a_rolled_back_transaction_leaves_no_delivery():
    WebhookEndpoint.objects.create(name="on-call", url="https://example.invalid/hook", kinds=[NotificationKind.RUN_FAILED])
    run = RunFactory()
    with pytest.raises(RuntimeError), transaction.atomic():
        _fail(run)
        assert WebhookDelivery.objects.filter(run=run).count() == 1  # written with the event…
        raise RuntimeError("roll back")
    assert not WebhookDelivery.objects.filter(run=run).exists()  # …and gone with it
    assert not RunEvent.objects.filter(run=run, type="run_status", payload__status="failed").exists()
    _fail(Run.objects.get(pk=run.pk))
    assert WebhookDelivery.objects.filter(run=run, kind=NotificationKind.RUN_FAILED).count() == 1


def test_only_subscribed_active_endpoints_get_deliveries():
    WebhookEndpoint.objects.create(name="approvals", url="https://a.invalid/", kinds=[NotificationKind.APPROVAL_REQUESTED])
    WebhookEndpoint.objects.create(name="off", url="https://b.invalid/", kinds=[NotificationKind.RUN_FAILED], active=False)
    wanted = WebhookEndpoint.objects.create(name="failures", url="https://c.invalid/", kinds=[NotificationKind.RUN_FAILED])
    run = RunFactory()
    _fail(run)
    assert list(WebhookDelivery.objects.values_list("endpoint", flat=True)) == [wanted.pk]


def test_the_signature_is_the_standard_webhooks_one():
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    signature = webhook_signature(secret=secret, webhook_id="msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp=1614265330, body=body)
    # The test vector of the Standard Webhooks reference libraries.
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert signature == _expected_signature(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", body)


def test_an_approval_about_to_expire_is_announced_once(settings):
    settings.WARDEN_APPROVAL_WARNING_SECONDS = 600
    WebhookEndpoint.objects.create(name="desk", url="https://desk.invalid/", kinds=[NotificationKind.APPROVAL_EXPIRING])
    soon = ApprovalFactory(expires_at=timezone.now() + timedelta(minutes=5))
    ApprovalFactory(expires_at=timezone.now() + timedelta(hours=5))  # not yet
    assert sweep_once()["approvals_warned"] == 1
    assert sweep_once()["approvals_warned"] == 0
    (event,) = RunEvent.objects.filter(type="approval_expiring")
    assert event.run_id == soon.run_id and event.payload["approval"] == str(soon.id)
    (delivery,) = WebhookDelivery.objects.all()
    assert delivery.kind == NotificationKind.APPROVAL_EXPIRING and delivery.body["data"]["approval"] == str(soon.id)
    assert delivery.body["data"]["links"]["approval"].endswith(f"/admin/approvals_app/approval/{soon.id}/change/")


def test_a_write_automation_gave_up_on_is_announced_once(settings):
    settings.WARDEN_SIM_BASE_URL = f"http://127.0.0.1:{free_port()}/sim"  # nobody answers: lookups are inconclusive
    WebhookEndpoint.objects.create(name="desk", url="https://desk.invalid/", kinds=[NotificationKind.RECONCILIATION_NEEDED])
    call = ToolCallFactory(tool_name="execute_refund", effect=ToolEffect.WRITE, status=ToolCallStatus.UNKNOWN,
                           arguments={"order_id": "9527", "amount": "10.00"}, idempotency_key="refund-key-1",
                           reconcile_attempts=RECONCILE_MAX_AUTO_ATTEMPTS - 1, next_attempt_at=timezone.now(),
                           started_at=timezone.now() - timedelta(hours=1), finished_at=timezone.now() - timedelta(hours=1))
    assert tool_call_reconcile_auto(tool_call=call) == "manual"
    call.refresh_from_db()
    assert call.next_attempt_at is None and call.status == ToolCallStatus.UNKNOWN
    assert tool_call_reconcile_auto(tool_call=call) == "manual"  # an operator's "query downstream now"
    (event,) = RunEvent.objects.filter(type="reconciliation_escalated")
    assert event.payload["tool_call"] == str(call.id) and event.payload["idempotency_key"] == "refund-key-1"
    (delivery,) = WebhookDelivery.objects.all()
    assert delivery.kind == NotificationKind.RECONCILIATION_NEEDED
    assert delivery.body["data"]["links"]["tool_call"].endswith(f"/admin/tools_app/unknowntoolcall/{call.id}/change/")


def test_a_receivers_password_and_token_stay_out_of_the_log_and_the_endpoint_list(caplog, client):
    """Issue 27, finding 9: a receiver's URL carries a user, a password and a query token; a delivery
    attempt logs the URL without them, and the desk's endpoint list shows it without them too."""
    from django.contrib.auth.models import Permission

    from engine.webhooks import webhooks_deliver_due
    from tests.support.factories import UserFactory

    port = free_port()  # nothing listens there: the attempt fails, and is logged as a warning
    WebhookEndpoint.objects.create(name="on-call", url=f"http://hookuser:hookpass@127.0.0.1:{port}/in?token=s3cret",
                                   kinds=[NotificationKind.RUN_FAILED])
    _fail(RunFactory())
    with caplog.at_level("INFO", logger="warden.webhooks"):
        assert webhooks_deliver_due() == 1
    (line,) = [r.getMessage() for r in caplog.records if r.name == "warden.webhooks"]
    assert f"http://***@127.0.0.1:{port}/in?…" in line
    assert "s3cret" not in line and "hookpass" not in line and "hookuser" not in line

    staff = UserFactory(username="hooks-admin", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_webhookendpoint", "change_webhookendpoint"]))
    client.force_login(staff)
    page = client.get("/admin/notifications/webhookendpoint/").content.decode()
    assert f"http://***@127.0.0.1:{port}/in?…" in page and "s3cret" not in page and "hookpass" not in page
