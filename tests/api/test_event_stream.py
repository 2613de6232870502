"""The live event stream (Server-Sent Events): catches up from the log, resumes from
Last-Event-ID, delivers new events as they are committed, keeps quiet connections alive, and
ends when the run is terminal and everything was sent — under the test client (WSGI-style)
and under ASGI, where it must really stream rather than buffer."""

import asyncio

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core import signals
from django.db import close_old_connections
from django.utils import timezone

from api import streams
from runs_app.models import Run, RunStatus
from tests.support.factories import RunEventFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def fast_stream(monkeypatch):
    monkeypatch.setattr(streams, "SSE_POLL_SECONDS", 0.01)
    monkeypatch.setattr(streams, "SSE_KEEPALIVE_SECONDS", 0.05)


def frames(response) -> list[str]:
    assert response["Content-Type"] == "text/event-stream"
    return [chunk.decode() for chunk in response.streaming_content]


def event_ids(chunks: list[str]) -> list[int]:
    return [int(chunk.split("\n")[0].removeprefix("id: ")) for chunk in chunks if chunk.startswith("id: ")]


def finish(run: Run, *, extra_events: int = 1) -> None:
    for seq in range(run.event_seq + 1, run.event_seq + 1 + extra_events):
        RunEventFactory(run=run, seq=seq, type="run_status", payload={"status": "completed"})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED, phase="", wait_reason="", finished_at=timezone.now(),
                                         event_seq=run.event_seq + extra_events)


def test_stream_of_a_finished_run_replays_every_event_then_ends(world, alice_api):
    chunks = frames(alice_api.get(f"/runs/{world.run.pk}/events/stream"))
    assert chunks[0] == "retry: 2000\n\n"
    assert event_ids(chunks) == [1, 2, 3, 4]
    assert chunks[1].startswith("id: 1\nevent: run_status\ndata: {")
    assert '"payload":{"status":"s1"}' in chunks[1]
    assert chunks[-1] == 'event: end\ndata: {"status": "completed"}\n\n'


def test_last_event_id_resumes_after_it_and_wins_over_after(world, alice_api):
    resumed = frames(alice_api.get(f"/runs/{world.run.pk}/events/stream", {"after": 1}, HTTP_LAST_EVENT_ID="3"))
    assert event_ids(resumed) == [4]
    assert event_ids(frames(alice_api.get(f"/runs/{world.run.pk}/events/stream", {"after": 2}))) == [3, 4]
    everything_sent = frames(alice_api.get(f"/runs/{world.run.pk}/events/stream", HTTP_LAST_EVENT_ID="4"))
    assert everything_sent == ["retry: 2000\n\n", 'event: end\ndata: {"status": "completed"}\n\n']


def test_a_live_run_streams_new_events_with_keepalives_until_it_ends(world, alice_api, fast_stream):
    run = world.approval_run  # waiting, events 1..2
    stream = iter(alice_api.get(f"/runs/{run.pk}/events/stream", {"max_seconds": 30}).streaming_content)
    first = [next(stream).decode() for _ in range(3)]
    assert event_ids(first) == [1, 2]
    assert next(stream).decode() == ": keepalive\n\n"  # nothing new: the connection is kept alive

    RunEventFactory(run=run, seq=3, type="approval_decided", payload={"status": "approved"})
    Run.objects.filter(pk=run.pk).update(event_seq=3)
    chunk = next(stream).decode()
    while chunk.startswith(":"):
        chunk = next(stream).decode()
    assert chunk.startswith("id: 3\nevent: approval_decided\n")

    run.refresh_from_db()
    finish(run)
    rest = [c.decode() for c in stream if not c.startswith(b":")]
    assert event_ids(rest) == [4]
    assert rest[-1] == 'event: end\ndata: {"status": "completed"}\n\n'


def test_the_stream_of_a_live_run_ends_after_max_seconds(world, alice_api, fast_stream):
    chunks = frames(alice_api.get(f"/runs/{world.approval_run.pk}/events/stream", {"max_seconds": 1}))
    assert event_ids(chunks) == [1, 2]
    assert ": keepalive\n\n" in chunks
    assert not any(chunk.startswith("event: end") for chunk in chunks)  # the client reconnects


def test_stream_of_an_invisible_run_is_a_json_404(world, bob_api):
    response = bob_api.get(f"/runs/{world.run.pk}/events/stream")
    assert response.status_code == 404
    assert not response.streaming
    assert response.json()["code"] == "not_found"


@pytest.mark.parametrize("header", ["abc", "-1", str(2**63)])
def test_bad_last_event_id_is_422(world, alice_api, header):
    response = alice_api.get(f"/runs/{world.run.pk}/events/stream", HTTP_LAST_EVENT_ID=header)
    assert response.status_code == 422
    assert response.json()["fields"][0]["field"] == "header.Last-Event-ID"


def test_under_asgi_events_are_sent_while_the_run_is_still_live(world, alice, fast_stream):
    """Daphne serves the app through ASGI: a buffered stream would send nothing until the end."""
    from server.asgi import application
    from tests.support.factories import ApiKeyFactory

    run = world.approval_run
    secret = ApiKeyFactory(owner=alice).secret

    async def scenario():
        sent: asyncio.Queue = asyncio.Queue()
        request_read = False

        async def receive():
            nonlocal request_read
            if not request_read:
                request_read = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # the client stays connected

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": f"/api/v1/runs/{run.pk}/events/stream", "raw_path": b"", "query_string": b"max_seconds=30",
            "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {secret}".encode())],
            "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
        }
        app = asyncio.ensure_future(application(scope, receive, sent.put))
        start = await asyncio.wait_for(sent.get(), 10)
        assert start["status"] == 200
        assert (b"Content-Type", b"text/event-stream") in start["headers"]

        async def next_frame() -> str:
            while True:
                message = await asyncio.wait_for(sent.get(), 10)
                body = message.get("body", b"").decode()
                if body and not body.startswith(":"):
                    return body

        assert await next_frame() == "retry: 2000\n\n"
        assert (await next_frame()).startswith("id: 1\n")
        assert (await next_frame()).startswith("id: 2\n")
        # The run is still waiting and the response still open: now the run finishes.
        await sync_to_async(finish)(run)
        assert (await next_frame()).startswith("id: 3\n")
        assert (await next_frame()).startswith("event: end")
        await asyncio.wait_for(app, 10)

    # As Django's own test clients do: the request must not close the test's connection (its
    # transaction holds the data), so the per-request connection cleanup is off meanwhile.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        async_to_sync(scenario)()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def test_an_open_stream_ends_when_its_key_is_revoked(world, alice_api, fast_stream, monkeypatch):
    """Access is checked when the stream opens and again while it is open."""
    from sessions_app.api_keys import api_key_revoke
    from sessions_app.models import ApiKey

    monkeypatch.setattr(streams, "SSE_RECHECK_SECONDS", 0.02)
    stream = iter(alice_api.get(f"/runs/{world.approval_run.pk}/events/stream", {"max_seconds": 60}).streaming_content)
    assert event_ids([next(stream).decode() for _ in range(3)]) == [1, 2]
    api_key_revoke(api_key=ApiKey.objects.get(owner=world.approval_run.session.owner))
    rest = [chunk.decode() for chunk in stream if not chunk.startswith(b":")]
    assert rest == [streams.SSE_ACCESS_REVOKED]


def test_an_open_stream_ends_when_the_browser_logs_out(world, alice, fast_stream, monkeypatch):
    from django.test import Client

    monkeypatch.setattr(streams, "SSE_RECHECK_SECONDS", 0.02)
    browser = Client()
    browser.force_login(alice)
    stream = iter(browser.get(f"/api/v1/runs/{world.approval_run.pk}/events/stream", {"max_seconds": 60}).streaming_content)
    assert event_ids([next(stream).decode() for _ in range(3)]) == [1, 2]
    browser.logout()
    rest = [chunk.decode() for chunk in stream if not chunk.startswith(b":")]
    assert rest == [streams.SSE_ACCESS_REVOKED]


def test_a_user_may_hold_only_so_many_streams_open(world, alice_api, settings):
    """Issue 27, finding 10: one user held 300 SSE streams (and 447 sockets). With a cap of 2, a third
    stream is 429 with Retry-After and says why; closing one frees its slot."""
    settings.WARDEN_STREAMS_PER_USER = 2
    path = f"/runs/{world.approval_run.pk}/events/stream"
    first, second = alice_api.get(path), alice_api.get(path)
    assert first.status_code == second.status_code == 200
    third = alice_api.get(path)
    assert third.status_code == 429 and third.json()["code"] == "throttled" and int(third["Retry-After"]) >= 1
    assert "live streams and sockets open" in third.json()["message"]
    # The client goes away: Django closes the response and the slot is given back. (Outside the test
    # client's request, its request_finished would close this test's connection: kept out of it.)
    signals.request_finished.disconnect(close_old_connections)
    try:
        first.close()
    finally:
        signals.request_finished.connect(close_old_connections)
    again = alice_api.get(path)
    assert again.status_code == 200
    signals.request_finished.disconnect(close_old_connections)
    try:
        for response in (second, again):
            response.close()
    finally:
        signals.request_finished.connect(close_old_connections)
