"""Erasure takes everything Warden holds about a session (SPEC §16): the webhook deliveries that
announced its runs — which a PROTECT foreign key kept, so with any endpoint subscribed the erasure
crashed after its archive line was written — and the API responses stored under Idempotency-Keys,
whose bodies hold its messages."""

import json

import pytest
from django.db import transaction
from django.utils import timezone

from engine.actions.retention import sessions_erase
from engine.actions.runs import run_end
from notifications.models import NotificationKind, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from runs_app.models import Run, RunErrorCode, RunStatus
from sessions_app.models import IdempotencyRecord, Session
from tests.support.factories import RunFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _record(owner, path, body: bytes) -> IdempotencyRecord:
    return IdempotencyRecord.objects.create(owner=owner, key=f"k-{path}-{len(body)}", request_hash="0" * 64,
                                            method="POST", path=path, status_code=201, response_body=body,
                                            response_content_type="application/json")


def test_erasure_takes_the_runs_webhook_deliveries_and_stored_responses_and_nothing_else(tmp_path):
    WebhookEndpoint.objects.create(name="on-call", url="https://example.invalid/hook", kinds=[NotificationKind.RUN_FAILED])
    customer = UserFactory(username="forgettable")
    session = SessionFactory(owner=customer)
    kept_session = SessionFactory(owner=customer)
    run, kept_run = RunFactory(session=session), RunFactory(session=kept_session)
    for each in (run, kept_run):
        with transaction.atomic():
            run_end(run=Run.objects.get(pk=each.pk), to=RunStatus.FAILED, lease_token=None,
                    error_code=RunErrorCode.INTERNAL, error_detail="erasure test")
    delivery = WebhookDelivery.objects.get(run=run)
    WebhookAttempt.objects.create(delivery=delivery, number=1, deliverer="test", started_at=timezone.now(),
                                  finished_at=timezone.now(), status_code=500)
    created = _record(customer, "/api/v1/sessions", json.dumps({"id": str(session.pk)}).encode())
    posted = _record(customer, f"/api/v1/sessions/{session.pk}/messages", b'{"disposition": "started_run"}')
    other = _record(customer, f"/api/v1/sessions/{kept_session.pk}/messages", b"{}")

    with open(tmp_path / "erased.jsonl", "w") as archive:
        report = sessions_erase(sessions=Session.objects.filter(pk=session.pk), archive=archive, reason="request #7")

    assert report.erased == [str(session.pk)]
    assert not Session.objects.filter(pk=session.pk).exists()
    assert not WebhookDelivery.objects.filter(pk=delivery.pk).exists()
    assert not WebhookAttempt.objects.filter(delivery_id=delivery.pk).exists()
    assert not IdempotencyRecord.objects.filter(pk__in=[created.pk, posted.pk]).exists()
    # The other session keeps everything of its own.
    assert WebhookDelivery.objects.filter(run=kept_run).count() == 1
    assert IdempotencyRecord.objects.filter(pk=other.pk).exists()
    (line,) = (tmp_path / "erased.jsonl").read_text().splitlines()
    assert [d["id"] for d in json.loads(line)["webhook_deliveries"]] == [str(delivery.pk)]
