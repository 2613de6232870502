"""A run's event stream read through the client survives its web server being killed and started
again on the same port: the client reconnects with Last-Event-ID and delivers exactly the run's
events — none twice, none skipped — and stops at the server's `end` when the run is over."""

import threading

import httpx
import pytest
from django.db import connection

from runs_app.models import RunEvent, RunStatus, WaitReason
from tests.support.factories import RunFactory, SessionFactory
from tests.support.processes import ProcessGroup, wait_for
from tests.support.sse import notes_append, run_end
from warden_client import ReconnectPolicy, Warden

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# Reconnection attempts for the seconds a fresh daphne takes to boot; a bound on a hung test only.
PATIENT = ReconnectPolicy(max_attempts=200, backoff=0.05, max_backoff=0.5)


@pytest.fixture
def own_server(layer_for_this_process):
    """A web server of this test's own on a port that stays the same when it is started again
    (not the session's shared one: this test kills it)."""
    group = ProcessGroup(name="client-stream-restart")
    group.base_env.pop("REDIS_URL", None)
    yield group
    group.stop_all()



def test_a_run_stream_resumes_across_a_server_restart_with_no_gap_and_no_duplicate(own_server, customer, customer_key):
    run = RunFactory(session=SessionFactory(owner=customer), status=RunStatus.WAITING, phase="",
                     wait_reason=WaitReason.APPROVAL)
    notes_append(run, "one", "two")
    own_server.start_web()

    sent_last_event_ids: list[str | None] = []
    http = httpx.Client(base_url=own_server.base_url, trust_env=False, event_hooks={
        "request": [lambda request: sent_last_event_ids.append(request.headers.get("Last-Event-ID"))]})
    client = Warden(own_server.base_url, customer_key, reconnect=PATIENT, http_client=http)
    received = []
    failure: list[BaseException] = []

    def read() -> None:
        try:
            received.extend(client.runs.stream(str(run.pk)))  # returns at `end`
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failure.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        notes_append(run, "three", "four")
        wait_for(lambda: len(received) == 4 or failure, message="the first four events")

        own_server.stop("web")  # SIGKILL: the stream breaks mid-way
        notes_append(run, "five, while the server is down")
        notes_append(run, "six, while the server is down")
        own_server.start_web()  # the same port
        wait_for(lambda: len(received) == 6 or failure, message="the events written while the server was down")

        notes_append(run, "seven", "eight")
        run_end(run)
        connection.close()
        reader.join(timeout=120)
    finally:
        client.close()
    assert not failure, failure
    assert not reader.is_alive(), "the stream did not stop at the run's end"

    stored = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type", "payload"))
    assert [(event.seq, event.type, event.payload) for event in received] == stored
    assert [event.seq for event in received] == list(range(1, 10))
    assert [event.id for event in received] == [str(seq) for seq in range(1, 10)]
    # It resumed (not started over): every reconnection asked for what followed the fourth event.
    assert sent_last_event_ids[0] is None and len(sent_last_event_ids) > 1
    assert set(sent_last_event_ids[1:]) == {"4"}
