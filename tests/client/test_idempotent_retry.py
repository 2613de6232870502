"""A message whose answer is lost on the way back is sent again by the client with the same
Idempotency-Key, and the server answers the retry with the first answer: one message stored,
one run started, and the client returns the replayed answer."""

import httpx
import pytest

from runs_app.models import Run
from sessions_app.models import Message, Session
from tests.support.dropping_proxy import DroppingProxy
from warden_client import RetryPolicy, Warden

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_a_message_whose_answer_was_dropped_is_stored_once_and_the_retry_gets_the_first_answer(
        procs, customer, customer_key):
    procs.start_web()
    with Warden(procs.base_url, customer_key, trust_env=False) as direct:
        session = direct.sessions.create(title="refunds")

    with DroppingProxy(upstream_port=procs.port) as proxy:
        http = httpx.Client(base_url=proxy.base_url, trust_env=False)
        with Warden(proxy.base_url, customer_key, http_client=http, retry=RetryPolicy(backoff=0.05)) as client:
            posted = client.sessions.say(session.id, "Refund order 9527, please")

    assert proxy.dropped.is_set()
    keys = [line.split(b":", 1)[1].strip() for head in proxy.requests for line in head.split(b"\r\n")
            if line.lower().startswith(b"idempotency-key:")]
    assert len(proxy.requests) == 2 and len(keys) == 2 and keys[0] == keys[1]

    stored = Session.objects.get(pk=session.id)
    assert Message.objects.filter(session=stored).count() == 1
    assert Run.objects.filter(session=stored).count() == 1
    message = Message.objects.get(session=stored)
    assert posted.replayed
    assert posted.disposition == "started_run"
    assert posted.message is not None and posted.message.id == message.pk and posted.message.content == message.content
    assert posted.run.id == str(Run.objects.get(session=stored).pk)
