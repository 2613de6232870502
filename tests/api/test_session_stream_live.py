"""Issue 28's acceptance: a session's event stream, served by the real web server while real workers
drive the runs, delivers the events of two consecutive runs on one connection — it does not end
with the first run — and, after the connection is dropped in the middle of the second run,
resumes from Last-Event-ID with no gap and no duplicate. Checked against the log itself: what the
client received is every event of the session's runs, once each, in order; the paged endpoint and
the account stream (runs_app.follow_all_events) hand out the same events with the same cursors."""

import json

import pytest

from runs_app.models import Run, RunEvent
from sessions_app.models import Session
from tests.support.api import HttpApi, grant
from tests.support.factories import ApiKeyFactory, UserFactory
from tests.support.processes import wait_for
from tests.support.sse import SseClient

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

QUESTION = "What's the weather in Paris?"


def received(frame: dict) -> dict:
    data = json.loads(frame["data"])
    return {"id": frame["id"], "event": frame["event"], "run_id": data["run_id"], "seq": data["seq"],
            "type": data["type"], "status": data["payload"].get("status")}


def read_until(client: SseClient, into: list[dict], done) -> None:
    """Event frames into `into` until `done(event)` is true of the last one."""
    while True:
        frame = client.event_frame()
        assert "id" in frame, frame  # an event, never `end` or `error`: the session's stream goes on
        into.append(received(frame))
        if done(into[-1]):
            return


def ended(run_id: str):
    return lambda event: event["run_id"] == run_id and event["type"] == "run_status" and event["status"] == "completed"


def test_a_session_stream_follows_two_runs_and_resumes_after_a_dropped_connection(procs, demo_world):
    procs.start_web(simulator=True)
    # Slow enough model steps that the second run goes on after the connection is dropped.
    procs.start_workers(workers=1, env={"WARDEN_SCRIPTED_DELAY_SECONDS": "0.3"})
    customer = grant(UserFactory(), ("runs_app", "follow_all_events"))
    api, key = HttpApi(procs.base_url, customer), ApiKeyFactory(owner=customer).secret
    session = api.post("/sessions", {"title": "weather"}).json()["id"]
    path = f"/api/v1/sessions/{session}/events/stream"

    events: list[dict] = []
    first_connection = SseClient(procs.base_url, path, key, max_seconds=300)
    try:
        assert first_connection.frame() == {"retry": "2000"}
        first = api.post(f"/sessions/{session}/messages", {"content": QUESTION}).json()["run"]["id"]
        read_until(first_connection, events, ended(first))
        # The same connection goes on to the next run of the session.
        posted = api.post(f"/sessions/{session}/messages", {"content": QUESTION})
        assert posted.json()["disposition"] == "started_run", posted.json()
        second = posted.json()["run"]["id"]
        read_until(first_connection, events, lambda event: event["run_id"] == second and event["seq"] == 2)
    finally:
        first_connection.close()  # dropped in the middle of the second run
    dropped_at = len(events)
    wait_for(lambda: Run.objects.get(pk=second).is_terminal, message="the second run to end")

    second_connection = SseClient(procs.base_url, path, key, headers={"Last-Event-ID": events[-1]["id"]}, max_seconds=300)
    try:
        assert second_connection.frame() == {"retry": "2000"}
        read_until(second_connection, events, ended(second))
    finally:
        second_connection.close()

    stored = list(RunEvent.objects.filter(run__session_id=session).order_by("run__created_at", "seq")
                  .values_list("run_id", "seq", "type"))
    assert [(event["run_id"], event["seq"], event["type"]) for event in events] == [
        (str(run_id), seq, kind) for run_id, seq, kind in stored]
    assert len({event["id"] for event in events}) == len(events)
    assert {event["run_id"] for event in events[dropped_at:]} == {second}  # what the drop left for the reconnection
    assert Session.objects.get(pk=session).runs.count() == 2

    # The page and the account stream: the same events, the same cursors.
    paged, after = [], None
    while page := api.get(f"/sessions/{session}/events?limit=7" + (f"&after={after}" if after else "")).json()["items"]:
        paged += page
        after = paged[-1]["cursor"]
    assert [item["cursor"] for item in paged] == [event["id"] for event in events]
    account = SseClient(procs.base_url, "/api/v1/events/stream", key, max_seconds=300)
    try:
        assert account.frame() == {"retry": "2000"}
        everything = [received(account.event_frame()) for _ in events]
    finally:
        account.close()
    assert everything == events
