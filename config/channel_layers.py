"""The channel layers: PostgreSQL by default, Redis when REDIS_URL is set.

PostgreSQL: channels_postgres 1.1 with two of its races closed and a lock leak stopped (3.).

1. Every `receive()` that runs before the process's LISTEN connection is ready starts one
   more listener, so a web process whose first consoles connect together (a restart, a
   reconnect storm) runs several listeners for good, and every message reaches its
   consumer once per listener.
2. A message too big for NOTIFY's 8000 bytes is fetched by `DELETE … RETURNING`; the second
   copy of such a message finds nothing and fails an `assert`, which kills the consumer and
   closes the browser's socket (1011).

Here one listener is started per event loop, and a big message somebody else already
fetched is skipped. Duplicates would be harmless to the console anyway (events are
de-duplicated by seq, text by offset), but one listener does a third of the work.

And `group_send` — every doorbell a worker rings — is one statement instead of three (the
library looks the group's channels up twice, then inserts): about a third of a worker's CPU
per text delta.

3. Every channel received on takes a session-level `pg_try_advisory_lock` on whichever pool
   connection is free, and nothing releases it (nor could: which connection holds it is not
   kept). Every console and SSE stream receives on a channel of its own, so each one that ever
   connected left a lock behind until its pool connection was recycled (~1 h), and reconnect
   storms fill PostgreSQL's shared lock table ("out of shared memory" for every query). The
   lock elects which process's listener queues a channel's messages — every listener sees every
   NOTIFY — which matters for a channel several processes receive on. A `new_channel()` name
   carries this layer's client prefix and only this layer may receive on it (`receive` asserts
   that), so for those the lock is skipped; other names still take it. Such a channel's local
   state (its queue, its "lock") is dropped once its last receive is cancelled — how the console
   and the SSE stream end, and the end of such a channel on the Redis pub/sub layer too — or
   the process would keep one queue per client that ever connected, and go on filling it.
4. The library's listener ends for good when its LISTEN connection is lost (a PostgreSQL
   restart, a terminated backend) — while `receive()` goes on believing it runs — and when
   anyone on the database NOTIFYs its shutdown message, which every listener on the database
   hears: one process stopping its own listener silenced every web process's live delivery.
   Here the listener outlives its connection (it connects again and first reads what was
   queued meanwhile, as at its start), ignores the broadcast, and ends only by
   `listener_stop()`, in its own process.
"""

import asyncio
import base64
import collections
import logging
import time
from datetime import timedelta

import psycopg
from channels_postgres.core import ASYNCIO_EVENT_CHANNEL_MAPPING
from channels_postgres.core import PostgresChannelLayer as _PostgresChannelLayer
from channels_postgres.db import GROUP_CHANNEL_TABLE, MESSAGE_TABLE, utc_now
from channels_redis.pubsub import RedisPubSubChannelLayer as _RedisPubSubChannelLayer
from channels_redis.pubsub import RedisPubSubLoopLayer, RedisSingleShardConnection
from channels_redis.utils import _wrap_close
from psycopg import sql

logger = logging.getLogger("warden.live")

# How long a listener whose LISTEN connection was lost waits before it connects again (4.).
LISTENER_RECONNECT_SECONDS = 1.0

# One row per member channel; the table's trigger NOTIFYs each (messages over 8000 bytes by id).
_GROUP_SEND_SQL = sql.SQL(
    "INSERT INTO {messages} (channel, message, expire) "
    "SELECT DISTINCT channel, %s, %s FROM {members} WHERE group_key = %s"
).format(messages=sql.Identifier(MESSAGE_TABLE), members=sql.Identifier(GROUP_CHANNEL_TABLE))


class PostgresChannelLayer(_PostgresChannelLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._receives = collections.Counter()  # channel -> receive() calls under way

    def _is_own_channel(self, channel: str) -> bool:
        """A new_channel() name of this layer: nobody else receives on it (3. above)."""
        return "!" in channel and self.non_local_name(channel).endswith(self.client_prefix + "!")

    async def _get_or_create_channel_advisory_lock(self, channel):
        if self._is_own_channel(channel):
            self._channel_advisory_locks[channel] = True  # the listener queues its messages
            return True
        return await super()._get_or_create_channel_advisory_lock(channel)

    async def receive(self, channel):
        self._receives[channel] += 1
        try:
            return await super().receive(channel)
        except asyncio.CancelledError:
            if self._receives[channel] == 1 and self._is_own_channel(channel):
                self._channel_advisory_locks.pop(channel, None)  # the listener drops what comes next
                ASYNCIO_EVENT_CHANNEL_MAPPING.pop(channel, None)
            raise
        finally:
            self._receives[channel] -= 1
            if not self._receives[channel]:
                del self._receives[channel]

    async def listen_to_all_channels(self) -> None:
        """This process's listener (4. above): started by the first receive(), it runs until
        listener_stop()."""
        self._listener = asyncio.current_task()
        while True:
            try:
                await self._listen()
            except (psycopg.OperationalError, OSError):
                logger.warning("the channel layer's LISTEN connection was lost; connecting again", exc_info=True)
            await asyncio.sleep(LISTENER_RECONNECT_SECONDS)

    async def _listen(self) -> None:
        """One LISTEN connection's life: what was queued for this process's channels before it
        listened, then every NOTIFY for a channel whose messages it queues."""
        queued = sorted(await self.django_db.retrieve_non_expired_queued_messages(), key=lambda row: int(row[0]))
        for message_id, channel, message, expires in queued:
            if self._channel_advisory_locks.get(channel, False):
                self._get_or_create_queue(channel).put_nowait(
                    f"{message_id}:{channel}:{base64.b64encode(message).decode()}:{expires}")
        conninfo = psycopg.conninfo.make_conninfo(conninfo="", **self.db_params)
        async with await psycopg.AsyncConnection.connect(conninfo=conninfo, autocommit=True) as connection:
            await connection.execute("LISTEN channels_postgres_messages")
            self.listener_task_is_running.set()
            async for event in connection.notifies():
                channel = event.payload.split(":")[1]
                # Every listener sees every NOTIFY; another process's channels (and the
                # library's shutdown broadcast, channel "shutdown") are not ours to queue.
                if self._channel_advisory_locks.get(channel, False):
                    self._get_or_create_queue(channel).put_nowait(event.payload)

    async def listener_stop(self) -> None:
        """End this process's listener, on the loop it runs on (the suite does before it drops
        its database); the next receive() starts a new one."""
        listener = getattr(self, "_listener", None)
        if listener is not None and not listener.done():
            listener.cancel()
            await asyncio.wait({listener})
        self._listener = None
        self._listener_loop = None
        if self.listener_task_is_running is not None:
            self.listener_task_is_running.clear()

    def _get_or_create_listener_task(self):
        running, start = super()._get_or_create_listener_task()
        loop = asyncio.get_running_loop()
        if start and getattr(self, "_listener_loop", None) is loop:
            return running, False  # already starting on this loop: wait for it
        if start:
            self._listener_loop = loop
        return running, start

    async def _get_message_from_channel(self, channel, queue):
        while True:
            fields = (await queue.get()).split(":")
            if len(fields) == 4:  # small: the message travelled inside the NOTIFY
                _, _, encoded, expires = fields
                if float(expires) < time.time():
                    continue
                return self.deserialize(base64.b64decode(encoded))
            row = await self.django_db.delete_message_returning_message(int(fields[0]))
            if row is not None:
                return self.deserialize(row[0])

    async def group_send(self, group, message):
        self.require_valid_group_name(group)
        pool = await self.django_db.get_db_pool(db_params=self.db_params)
        async with pool.connection() as conn:
            await conn.execute(
                _GROUP_SEND_SQL,
                (self.serialize(message), utc_now() + timedelta(seconds=self.expiry), self._group_key(group)),
            )


# --- Redis (REDIS_URL set): channels_redis's pub/sub layer, subscriptions confirmed -------------------

# How long group_add waits for Redis to confirm a SUBSCRIBE before going on regardless.
SUBSCRIBE_CONFIRM_SECONDS = 5.0


class _ConfirmingShard(RedisSingleShardConnection):
    """One Redis connection's subscriptions, where `subscribe` returns once Redis has confirmed
    it rather than once the command is written. The console joins a session's group and then
    reads the event log; a doorbell rung between the two must reach it, which holds only if
    the subscription is live when the read starts."""

    def __init__(self, host, channel_layer):
        super().__init__(host, channel_layer)
        self._confirming: dict[str, collections.deque] = {}  # channel -> futures, one per SUBSCRIBE sent

    async def subscribe(self, channel):
        async with self._lock:
            pending = self._confirming.get(channel)
            if channel in self._subscribed_to:
                confirmed = pending[-1] if pending else None  # somebody else's SUBSCRIBE: wait for it too
            else:
                self._ensure_redis()
                self._ensure_receiver()
                confirmed = asyncio.get_running_loop().create_future()
                self._confirming.setdefault(channel, collections.deque()).append(confirmed)
                await self._pubsub.subscribe(channel)
                self._subscribed_to.add(channel)
        if confirmed is not None:
            try:
                await asyncio.wait_for(asyncio.shield(confirmed), SUBSCRIBE_CONFIRM_SECONDS)
            except TimeoutError:
                logger.warning("Redis did not confirm the subscription to %s in time", channel)

    def _subscription_confirmed(self, channel) -> None:
        name = channel.decode() if isinstance(channel, bytes) else channel
        pending = self._confirming.get(name)
        if not pending:
            return  # a re-subscription after a reconnect: nobody waits for it
        confirmed = pending.popleft()
        if not pending:
            del self._confirming[name]
        if not confirmed.done():
            confirmed.set_result(None)

    async def _do_receiving(self):
        while True:
            try:
                if self._pubsub and self._pubsub.subscribed:
                    message = await self._pubsub.get_message(ignore_subscribe_messages=False, timeout=0.1)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        self._subscription_confirmed(message["channel"])
                    elif message["type"] == "message":
                        self._receive_message(message)
                else:
                    await asyncio.sleep(0.1)
            except (asyncio.CancelledError, asyncio.TimeoutError, GeneratorExit):
                raise
            except BaseException:  # noqa: BLE001 - as the library does: log, pause, go on receiving
                logger.exception("Redis pub/sub receive failed")
                await asyncio.sleep(1)


class _ConfirmingLoopLayer(RedisPubSubLoopLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._shards = [_ConfirmingShard(shard.host, self) for shard in self._shards]


class RedisPubSubChannelLayer(_RedisPubSubChannelLayer):
    """channels_redis's pub/sub layer: a doorbell is one PUBLISH, and a web process holds one
    subscriber connection that Redis pushes messages down. The list-based core layer polls
    every channel in turn (four round trips per message) and could not keep one web process
    up with 50 streaming runs. Messages are not kept for absent listeners — which a doorbell
    need not be: the console catches up from RunEvent. Subscriptions are confirmed (above)."""

    def _get_layer(self):
        loop = asyncio.get_running_loop()
        try:
            return self._layers[loop]
        except KeyError:
            layer = _ConfirmingLoopLayer(*self._args, **self._kwargs, channel_layer=self)
            self._layers[loop] = layer
            _wrap_close(self, loop)
            return layer
