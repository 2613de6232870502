"""`client.sessions.stream()` follows a session across its runs: the server ends each connection
after its `max_seconds`, the client reopens it from the last event's cursor, and the events of
two consecutive runs arrive once each, in commit order; `sessions.events()` pages through the same.
`client.events` does it for every run a key may follow."""

import threading

import httpx
import pytest
from django.db import connection

from runs_app.models import Run, RunEvent, RunStatus, WaitReason
from tests.support.api import grant
from tests.support.factories import ApiKeyFactory, RunFactory, SessionFactory, UserFactory
from tests.support.processes import wait_for
from tests.support.sse import notes_append, run_end
from warden_client import PermissionDeniedError, ReconnectPolicy, Warden

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def waiting_run(session) -> Run:
    return RunFactory(session=session, status=RunStatus.WAITING, phase="", wait_reason=WaitReason.APPROVAL)




def test_a_session_stream_delivers_two_runs_once_each_across_the_servers_ends_of_stream(procs, customer, customer_key):
    session = SessionFactory(owner=customer)
    first = waiting_run(session)
    notes_append(first, "one", "two")
    procs.start_web()

    requests: list[httpx.Request] = []
    http = httpx.Client(base_url=procs.base_url, trust_env=False, event_hooks={"request": [requests.append]})
    # Each connection ends after a second: the stream is reopened many times while the runs go on.
    client = Warden(procs.base_url, customer_key, http_client=http,
                    reconnect=ReconnectPolicy(max_attempts=20, backoff=0.05, max_backoff=0.5, max_seconds=1))
    received = []
    failure: list[BaseException] = []
    second_id: list[str] = []

    def read() -> None:
        try:
            for event in client.sessions.stream(str(session.pk)):
                received.append(event)
                if second_id and event.run_id == second_id[0] and event.type == "run_status":
                    return
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failure.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(received) == 2 or failure, message="the first run's events")
        run_end(first)
        second = waiting_run(session)
        second_id.append(str(second.pk))
        notes_append(second, "three")
        connections_so_far = len(requests)
        wait_for(lambda: len(requests) >= connections_so_far + 2 or failure, message="the stream to be reopened")
        notes_append(second, "four", "five")
        run_end(second)
        connection.close()
        reader.join(timeout=120)
    finally:
        client.close()
    assert not failure, failure
    assert not reader.is_alive()

    stored = [(str(run_id), seq, kind, payload) for run_id, seq, kind, payload in RunEvent.objects.filter(
        run__session=session).order_by("run__created_at", "seq").values_list("run_id", "seq", "type", "payload")]
    assert [(event.run_id, event.seq, event.type, event.payload) for event in received] == stored
    assert [event.run_id for event in received] == [str(first.pk)] * 3 + [str(second.pk)] * 4
    # Every reopening resumed from the last event delivered before it.
    delivered_ids = {event.id for event in received}
    resumed_from = [request.headers.get("Last-Event-ID") for request in requests[1:]]
    resumed_from = [cursor for cursor in resumed_from if cursor is not None]  # none before a first delivery
    assert len(resumed_from) >= 2 and set(resumed_from) <= delivered_ids

    with Warden(procs.base_url, customer_key, trust_env=False) as paging:
        paged = list(paging.sessions.events(str(session.pk), page_size=3))
        assert [(event.run_id, event.seq, event.id) for event in paged] == [
            (event.run_id, event.seq, event.id) for event in received]
        assert list(paging.sessions.events(str(session.pk), after=received[2].id)) == paged[3:]


def test_every_runs_events_are_for_keys_that_may_follow_them(procs, customer, customer_key):
    runs = [waiting_run(SessionFactory(owner=customer)) for _ in range(2)]
    for run in runs:
        notes_append(run, f"note of {run.pk}")
    integrator = grant(UserFactory(username="integrator"), ("runs_app", "view_run"), ("runs_app", "follow_all_events"))
    procs.start_web()

    with Warden(procs.base_url, ApiKeyFactory(owner=integrator).secret, trust_env=False) as client:
        def both_runs_events():
            events = list(client.events.iter(page_size=1))
            return events if len(events) == 2 else None

        # Committed events wait while an older transaction runs (runs_app.feeds): until both are out.
        paged = wait_for(both_runs_events, message="both runs' events in the feed")
        assert sorted((event.run_id, event.seq) for event in paged) == sorted((str(run.pk), 1) for run in runs)
        streamed = []
        for event in client.events.stream():
            streamed.append(event)
            if len(streamed) == 2:
                break
        assert [(event.run_id, event.id) for event in streamed] == [(event.run_id, event.id) for event in paged]
        assert list(client.events.iter(after=paged[0].id)) == paged[1:]
    with Warden(procs.base_url, customer_key, trust_env=False) as client, pytest.raises(PermissionDeniedError):
        list(client.events.iter())
