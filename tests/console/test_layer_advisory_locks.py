"""The PostgreSQL channel layer keeps nothing for clients that left (config/channel_layers.py, 3.):
channels_postgres took a session-level advisory lock for every channel received on and never
released it, so each console or SSE stream that ever connected held a slot of PostgreSQL's
shared lock table until its pool connection was recycled.

A client is played here as the console consumer and the SSE stream use the layer: a channel of
its own (new_channel), joined to its session's group, a receive() always waiting on it (the
SSE stream's probe comes back through it); on disconnect the waiting receive is cancelled
(channels' await_many_dispatch, _Doorbell.close) and the channel leaves the group."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels_postgres.core import ASYNCIO_EVENT_CHANNEL_MAPPING
from django.db import connection, connections

from config.channel_layers import PostgresChannelLayer
from runs_app.live import _publisher_loop

# group_discard goes through the ORM on the layer's alias (a mirror of the test database).
pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "channels_postgres"]),
              pytest.mark.usefixtures("layer_for_this_process")]

CLIENTS = 40
GROUP = "session.advisory-locks"
# A bound on a hung test, never an assertion about speed.
TIMEOUT_SECONDS = 30


def on_layer_loop(coroutine):
    """Run on the loop this process's layer pool lives on (tests/console/helpers.py closes it there)."""
    return asyncio.run_coroutine_threadsafe(coroutine, _publisher_loop()).result(timeout=TIMEOUT_SECONDS * 2)


def advisory_locks_held() -> int:
    """Advisory locks held in the test database: only the layer's connections take any here."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return cursor.fetchone()[0]


async def client_visit(layer) -> str:
    channel = await layer.new_channel()
    await layer.group_add(GROUP, channel)
    receiving = asyncio.ensure_future(layer.receive(channel))
    async with asyncio.timeout(TIMEOUT_SECONDS):
        # Probed again and again, as the SSE stream does: what reaches a channel before its first
        # receive() is under way, or before the listener LISTENs, is dropped.
        while not receiving.done():
            await layer.send(channel, {"type": "sse.probe"})
            await asyncio.wait({receiving}, timeout=0.2)
    assert receiving.result()["type"] == "sse.probe"
    while True:  # the client goes away while its next receive() waits (a spare probe may come first)
        receiving = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(0.01)
        receiving.cancel()
        await asyncio.wait({receiving})
        if receiving.cancelled():
            break
    await layer.group_discard(GROUP, channel)
    return channel


async def clients_come_and_go(layer) -> list[str]:
    try:
        return await asyncio.gather(*(client_visit(layer) for _ in range(CLIENTS)))
    finally:
        for task in asyncio.all_tasks():
            if task.get_coro().__name__ == "delete_expired_messages":
                task.cancel()  # group_discard's sweep, due in 10-20 min: the test database is gone by then
        await sync_to_async(connections.close_all)()  # group_discard's ORM thread, which would keep the database open


@pytest.fixture
def layer():
    layer = get_channel_layer()
    assert isinstance(layer, PostgresChannelLayer)
    yield layer
    on_layer_loop(layer.listener_stop())  # so the test database can be dropped


def test_clients_that_left_hold_no_advisory_locks(layer):
    before = advisory_locks_held()
    on_layer_loop(clients_come_and_go(layer))
    assert advisory_locks_held() == before


def test_the_layer_forgets_the_channels_of_clients_that_left(layer):
    left = set(on_layer_loop(clients_come_and_go(layer)))
    assert not left & ASYNCIO_EVENT_CHANNEL_MAPPING.keys()
    assert not left & layer._channel_advisory_locks.keys()

    async def a_doorbell_for_a_client_that_left_is_dropped():
        # A seat whose probe never came back (the SSE stream then polls): receive cancelled, still
        # in the group until the stream ends. A live client's fence, sent after the doorbell,
        # comes back once the listener has handled the doorbell for both.
        gone, live = await layer.new_channel(), await layer.new_channel()
        for channel in (gone, live):
            await layer.group_add(GROUP, channel)
        receiving = asyncio.ensure_future(layer.receive(gone))
        await asyncio.sleep(0.01)
        receiving.cancel()
        await asyncio.wait({receiving})
        live_receiving = asyncio.ensure_future(layer.receive(live))
        await layer.group_send(GROUP, {"type": "run.events"})
        assert (await asyncio.wait_for(live_receiving, TIMEOUT_SECONDS))["type"] == "run.events"
        await layer.send(live, {"type": "fence"})
        assert (await asyncio.wait_for(layer.receive(live), TIMEOUT_SECONDS))["type"] == "fence"
        return gone in ASYNCIO_EVENT_CHANNEL_MAPPING

    assert not on_layer_loop(a_doorbell_for_a_client_that_left_is_dropped())
