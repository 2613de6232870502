"""Both clients' event streams against a scripted server (httpx.MockTransport): a connection that
breaks mid-frame, a server that sends an event again, a stream the server ends, a 503 while it
restarts — each reconnection sends the last delivered id as Last-Event-ID, and the events come out
once each, in order, up to `end`. Refusals that a reconnection cannot fix are raised at once."""

import asyncio
import json

import httpx
import pytest

from warden_client import APIConnectionError, AsyncWarden, NotFoundError, ReconnectPolicy, StreamError, Warden

IMMEDIATE = ReconnectPolicy(max_attempts=3, backoff=0.0, max_backoff=0.0)
RUN = "0b3c2a55-0d4e-4f5a-9d6b-2b1c0e9f8a77"


def frame(seq: int) -> bytes:
    data = {"seq": seq, "type": "input_queued", "payload": {"n": seq}, "created_at": "2026-01-01T00:00:00Z"}
    return f"id: {seq}\nevent: input_queued\ndata: {json.dumps(data)}\n\n".encode()


class Broken(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that sends `chunks` and then loses its connection (or ends cleanly)."""

    def __init__(self, *chunks: bytes, breaks: bool):
        self.chunks, self.breaks = chunks, breaks

    def __iter__(self):
        yield from self.chunks
        if self.breaks:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    async def __aiter__(self):
        for chunk in self.__iter__():
            yield chunk


SSE = {"content-type": "text/event-stream"}
SCRIPT = [
    # a connection that breaks in the middle of event 3
    lambda: httpx.Response(200, headers=SSE, stream=Broken(b"retry: 2000\n\n", frame(1), frame(2)[:20] + frame(2)[20:],
                                                           frame(3)[:25], breaks=True)),
    # the server sends 2 again (it should not), then 3, then ends the stream (its max_seconds)
    lambda: httpx.Response(200, headers=SSE, stream=Broken(frame(2), frame(3), b": keepalive\n\n", breaks=False)),
    # restarting
    lambda: httpx.Response(503, json={"code": "try_again", "message": "again"}, headers={"Retry-After": "0"}),
    lambda: httpx.Response(200, headers=SSE, stream=Broken(frame(4), b'event: end\ndata: {"status": "completed"}\n\n',
                                                           frame(5), breaks=False)),
]


def scripted_handler(script, seen):
    answers = list(script)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Last-Event-ID"))
        return answers.pop(0)()

    return handler


def test_the_sync_stream_resumes_from_the_last_delivered_event_and_stops_at_end():
    seen: list[str | None] = []
    http = httpx.Client(transport=httpx.MockTransport(scripted_handler(SCRIPT, seen)), base_url="http://warden.test")
    client = Warden("http://warden.test", "wdn_test", reconnect=IMMEDIATE, http_client=http)
    events = list(client.runs.stream(RUN))
    assert [(event.seq, event.id, event.run_id, event.payload) for event in events] == [
        (seq, str(seq), RUN, {"n": seq}) for seq in (1, 2, 3, 4)]
    assert seen == [None, "2", "3", "3"]


def test_the_async_stream_makes_the_same_decisions():
    seen: list[str | None] = []

    async def scenario():
        http = httpx.AsyncClient(transport=httpx.MockTransport(scripted_handler(SCRIPT, seen)), base_url="http://warden.test")
        async with AsyncWarden("http://warden.test", "wdn_test", reconnect=IMMEDIATE, http_client=http) as client:
            return [event async for event in client.runs.stream(RUN)]

    events = asyncio.run(scenario())
    assert [event.seq for event in events] == [1, 2, 3, 4]
    assert seen == [None, "2", "3", "3"]


def test_a_stream_gives_up_after_its_attempts_and_raises_what_no_reconnection_fixes():
    seen: list[str | None] = []
    broken = [lambda: httpx.Response(200, headers=SSE, stream=Broken(frame(1), breaks=True))] + [
        lambda: httpx.Response(200, headers=SSE, stream=Broken(breaks=True))] * 4
    http = httpx.Client(transport=httpx.MockTransport(scripted_handler(broken, seen)), base_url="http://warden.test")
    client = Warden("http://warden.test", "wdn_test", reconnect=IMMEDIATE, http_client=http)
    received = []
    with pytest.raises(APIConnectionError) as raised:
        for event in client.runs.stream(RUN):
            received.append(event.seq)
    assert raised.value.code == "connection_error" and received == [1]
    assert seen == [None, "1", "1", "1"]  # the first connection, then three attempts without an event

    for answer, kind in ((lambda: httpx.Response(404, json={"code": "not_found", "message": "No such run."}), NotFoundError),
                         (lambda: httpx.Response(200, headers=SSE, stream=Broken(
                             b'event: error\ndata: {"code": "access_revoked", "message": "gone"}\n\n', breaks=False)),
                          StreamError)):
        seen.clear()
        http = httpx.Client(transport=httpx.MockTransport(scripted_handler([answer], seen)), base_url="http://warden.test")
        with pytest.raises(kind):
            list(Warden("http://warden.test", "wdn_test", reconnect=IMMEDIATE, http_client=http).sessions.stream("s"))
        assert len(seen) == 1
