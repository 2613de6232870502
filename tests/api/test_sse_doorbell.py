"""Issue 16, "idle is free": the live event stream served by a real daphne sleeps on its session's
doorbell — the channel layer runs_app.live rings after every commit of events — instead of
polling the database. Over each layer: events another process appends reach an SSE client gap-free
and in order, an idle stream reads the database only for its idle reads, a client that goes
away leaves the session's group; and without a working layer the stream polls.

The daphne here is the product's, started through a few lines (COUNTING_DAPHNE) that count every
SQL statement its Django connections send, by thread, and set the stream's timings for the test."""

import asyncio
import json
import sys
import threading
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from django.test import override_settings

from api import streams
from runs_app.live import session_group
from runs_app.models import Run, RunStatus, WaitReason
from tests.support.console import (
    REDIS_TEST_URL, postgres_layer_for_test_db, postgres_layer_pool_drop, redis_layer, require_redis,
)
from tests.support.factories import ApiKeyFactory, RunEventFactory, RunFactory, SessionFactory, UserFactory
from tests.support.processes import ProcessGroup, wait_for
from tests.support.sse import SseClient, notes_append, run_end

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

COUNTING_DAPHNE = r"""
import json, os, threading
from django.db.backends.signals import connection_created

log = open(os.environ["SSE_TEST_QUERY_LOG"], "a", buffering=1)
lock = threading.Lock()

def count(execute, sql, params, many, context):
    with lock:
        log.write(threading.current_thread().name + "\t" + " ".join(sql.split())[:160] + "\n")
    return execute(sql, params, many, context)

def install(sender, connection, **kwargs):
    if count not in connection.execute_wrappers:
        connection.execute_wrappers.append(count)

connection_created.connect(install)
import server.asgi  # Django set up as daphne does it; then the stream's timings for this test
from api import streams as api
for name, value in json.loads(os.environ["SSE_TEST_TIMINGS"]).items():
    setattr(api, name, value)
from daphne.cli import CommandLineInterface
CommandLineInterface.entrypoint()
"""

# The web process's own heartbeat thread writes its row now and then; everything else is requests.
HEARTBEAT_THREAD = "web-heartbeat"


class CountingDaphne:
    def __init__(self, procs: ProcessGroup, log: Path):
        self.procs, self.log = procs, log

    def start(self, **timings) -> None:
        self.log.write_text("")
        self.procs.start("web", [sys.executable, "-c", COUNTING_DAPHNE, "-b", "127.0.0.1", "-p", str(self.procs.port),
                                 "server.asgi:application"],
                         env={"SSE_TEST_QUERY_LOG": str(self.log), "SSE_TEST_TIMINGS": json.dumps(timings)})
        wait_for(lambda: self.procs._listening(self.procs.port), message="daphne to accept connections")

    def statements(self) -> list[str]:
        """What the requests and streams sent so far (not the heartbeat)."""
        lines = self.log.read_text().splitlines()
        return [line.split("\t", 1)[1] for line in lines if not line.startswith(HEARTBEAT_THREAD + "\t")]


@pytest.fixture(params=["postgres", pytest.param("redis", marks=pytest.mark.redis)])
def layer(request, transactional_db):
    """The layer daphne and this process (which appends the events, and so rings the doorbells)
    share: the test database's PostgreSQL layer by default, or Redis."""
    if request.param == "redis":
        require_redis()
        settings_layer = redis_layer()
    else:
        settings_layer = postgres_layer_for_test_db()
    postgres_layer_pool_drop()
    with override_settings(CHANNEL_LAYERS=settings_layer):
        yield request.param
    postgres_layer_pool_drop()


@pytest.fixture
def daphne(layer, tmp_path, request):
    procs = ProcessGroup(name=f"sse-{request.node.name[:60]}")
    if layer == "redis":
        procs.base_env["REDIS_URL"] = REDIS_TEST_URL
    else:
        procs.base_env.pop("REDIS_URL", None)
    yield CountingDaphne(procs, tmp_path / "statements.log")
    procs.stop_all()


@pytest.fixture
def waiting_run():
    """A run waiting for an approval, events 1..2, and a key of its owner."""
    owner = UserFactory()
    run = RunFactory(session=SessionFactory(owner=owner), status=RunStatus.WAITING, phase="", wait_reason=WaitReason.APPROVAL)
    for seq, kind in ((1, "run_status"), (2, "approval_requested")):
        RunEventFactory(run=run, seq=seq, type=kind, payload={"status": f"s{seq}"})
    Run.objects.filter(pk=run.pk).update(event_seq=2)
    return run, ApiKeyFactory(owner=owner).secret


def stream_path(run: Run) -> str:
    return f"/api/v1/runs/{run.pk}/events/stream"




def group_members(layer: str, group: str) -> int:
    """How many channels the layer holds in the group: rows for PostgreSQL; for Redis, whether
    daphne is subscribed to the group's channel (its members are local to the process)."""
    if layer == "postgres":
        from channels_postgres.models import GroupChannel

        return GroupChannel.objects.filter(group_key=f"asgi:group:{group}").count()
    import redis

    client = redis.Redis.from_url(REDIS_TEST_URL, socket_connect_timeout=2)
    try:
        return dict(client.pubsub_numsub(f"asgi__group__{group}")).get(f"asgi__group__{group}".encode(), 0)
    finally:
        client.close()


def test_events_appended_by_another_process_reach_the_client_in_order_by_doorbell(daphne, waiting_run):
    # Without a doorbell nothing would arrive: no polling, no idle reads for the life of the test.
    daphne.start(SSE_POLL_WITHOUT_LAYER_SECONDS=3600, SSE_IDLE_READ_KEEPALIVES=1000)
    run, key = waiting_run
    client = SseClient(daphne.procs.base_url, stream_path(run), key, max_seconds=300)
    try:
        assert client.frame() == {"retry": "2000"}
        assert [client.event_frame()["id"] for _ in range(2)] == ["1", "2"]

        def writer():
            try:
                for n in range(10):  # as soon as the stream is open: some land while it joins the group
                    notes_append(run, f"note {n}")
                notes_append(run, "batch a", "batch b", "batch c")  # one commit, one doorbell
                run_end(run)
            finally:
                connection.close()

        writing = threading.Thread(target=writer)
        writing.start()
        received = []
        while (frame := client.event_frame()).get("event") != "end":
            received.append(frame)
        writing.join()
    finally:
        client.close()

    assert [int(frame["id"]) for frame in received] == list(range(3, 17))
    assert [json.loads(frame["data"])["seq"] for frame in received] == list(range(3, 17))
    notes = [json.loads(frame["data"])["payload"].get("content") for frame in received[:-1]]
    assert notes == [f"note {n}" for n in range(10)] + ["batch a", "batch b", "batch c"]
    assert received[-1]["event"] == "run_status"
    assert frame == {"event": "end", "data": '{"status": "cancelled"}'}


def test_an_idle_stream_reads_the_database_only_for_its_idle_reads(daphne, waiting_run):
    """Keepalives every 0.5 s and an idle read (the access re-check) on every second one. Counted
    in keepalives, not seconds: over K keepalives the stream may make K/2 + 1 idle reads of two
    statements each (the key, the run), plus the key's last-used stamp; a stream polling every
    SSE_POLL_SECONDS would have made 2 × K × 0.5 / 0.25 = 4K — as would a stream here whose
    doorbell does not work (it polls every 0.25 s). The bound allows one more read per stream: the
    streams finish their K at slightly different moments."""
    keepalive, keepalives, streams = 0.5, 12, 3
    daphne.start(SSE_KEEPALIVE_SECONDS=keepalive, SSE_RECHECK_SECONDS=2 * keepalive, SSE_IDLE_READ_KEEPALIVES=2,
                 SSE_POLL_WITHOUT_LAYER_SECONDS=0.25)
    run, key = waiting_run
    clients = [SseClient(daphne.procs.base_url, stream_path(run), key, max_seconds=300) for _ in range(streams)]
    try:
        for client in clients:  # caught up, then quiet (and joined its group long since)
            assert [client.event_frame().get("id") for _ in range(3)] == [None, "1", "2"]  # retry, 1, 2
            assert [client.frame() for _ in range(2)] == [{"comment": "keepalive"}] * 2
        before = len(daphne.statements())
        counted = [0] * streams

        def listen(index: int) -> None:
            while counted[index] < keepalives:
                assert clients[index].frame() == {"comment": "keepalive"}  # nothing else happens to the run
                counted[index] += 1

        listeners = [threading.Thread(target=listen, args=(index,)) for index in range(streams)]
        for listener in listeners:
            listener.start()
        for listener in listeners:
            listener.join(timeout=120)
        assert counted == [keepalives] * streams
        during = daphne.statements()[before:]
    finally:
        for client in clients:
            client.close()

    allowed = streams * 2 * (keepalives // 2 + 2)
    polling = streams * 4 * keepalives
    assert len(during) <= allowed, (f"{len(during)} statements over {keepalives} keepalives of {streams} idle streams "
                                    f"(idle reads allow {allowed}; polling makes {polling}):\n" + "\n".join(during))
    assert not any("runs_app_runevent" in sql for sql in during)  # nothing new: the events were never read again


def test_a_client_that_goes_away_leaves_the_sessions_group(daphne, waiting_run, layer):
    daphne.start()
    run, key = waiting_run
    group = session_group(run.session_id)
    first = SseClient(daphne.procs.base_url, stream_path(run), key)
    second = SseClient(daphne.procs.base_url, stream_path(run), key)
    try:
        for client in (first, second):
            assert [client.event_frame().get("id") for _ in range(3)] == [None, "1", "2"]
        expected = 2 if layer == "postgres" else 1  # Redis: one subscription per daphne, however many streams
        wait_for(lambda: group_members(layer, group) == expected, message="both streams to join the session's group")
        first.close()
        if layer == "postgres":
            wait_for(lambda: group_members(layer, group) == 1, message="the first stream to leave the group")
    finally:
        first.close()
        second.close()
    wait_for(lambda: group_members(layer, group) == 0, message="the streams to leave the session's group")


def test_the_wire_format_is_unchanged_by_the_doorbell(daphne, waiting_run):
    """The same frames as the test client's (polling) stream: retry, events, end."""
    daphne.start()
    run, key = waiting_run
    client = SseClient(daphne.procs.base_url, stream_path(run), key)
    try:
        run_end(run)
        raw = []
        while True:
            frame = client.frame()
            raw.append(frame)
            if frame.get("event") == "end":
                break
    finally:
        client.close()
    frames = [frame for frame in raw if "comment" not in frame]
    assert frames[0] == {"retry": "2000"}
    assert [(frame["id"], frame["event"]) for frame in frames[1:-1]] == [
        ("1", "run_status"), ("2", "approval_requested"), ("3", "run_status")]
    data = json.loads(frames[3]["data"])
    assert set(data) == {"seq", "type", "payload", "created_at"} and data["seq"] == 3 and data["type"] == "run_status"
    assert frames[-1] == {"event": "end", "data": '{"status": "cancelled"}'}


# A Redis nobody listens on: the layer is configured, but joining a group fails.
LAYER_DOWN = {"default": {"BACKEND": "config.channel_layers.RedisPubSubChannelLayer", "CONFIG": {"hosts": ["redis://127.0.0.1:9/0"]}}}


@pytest.mark.parametrize("layers", [{}, LAYER_DOWN], ids=["no-layer", "layer-down"])
def test_without_a_working_layer_the_stream_polls_and_a_disconnect_ends_it(waiting_run, monkeypatch, layers):
    """In this process, through the ASGI application: events appended with no doorbell still
    arrive, and the client going away (http.disconnect) ends the stream's task."""
    from server.asgi import application

    monkeypatch.setattr(streams, "SSE_POLL_WITHOUT_LAYER_SECONDS", 0.05)
    run, key = waiting_run

    def append_without_doorbell():
        RunEventFactory(run=run, seq=3, type="input_queued", payload={"pending_input": 1, "mode": "queue", "content": "hi"})
        Run.objects.filter(pk=run.pk).update(event_seq=3)

    async def scenario():
        sent: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        request_read = False

        async def receive():
            nonlocal request_read
            if not request_read:
                request_read = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": f"/api/v1/runs/{run.pk}/events/stream", "raw_path": b"", "query_string": b"max_seconds=60",
            "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {key}".encode())],
            "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
        }
        app = asyncio.ensure_future(application(scope, receive, sent.put))
        assert (await asyncio.wait_for(sent.get(), 30))["status"] == 200

        async def next_frame() -> str:
            while True:
                body = (await asyncio.wait_for(sent.get(), 30)).get("body", b"").decode()
                if body and not body.startswith(":"):
                    return body

        assert await next_frame() == "retry: 2000\n\n"
        assert (await next_frame()).startswith("id: 1\n")
        assert (await next_frame()).startswith("id: 2\n")
        await sync_to_async(append_without_doorbell)()
        assert (await next_frame()).startswith("id: 3\nevent: input_queued\n")
        gone.set()
        await asyncio.wait_for(app, 30)

    with override_settings(CHANNEL_LAYERS=layers):
        async_to_sync(scenario)()
