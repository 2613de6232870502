"""The PostgreSQL channel layer (channels_postgres 1.1) with two of its races closed.

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
"""

import asyncio
import base64
import time
from datetime import timedelta

from channels_postgres.core import PostgresChannelLayer as _PostgresChannelLayer
from channels_postgres.db import GROUP_CHANNEL_TABLE, MESSAGE_TABLE, utc_now
from psycopg import sql

# One row per member channel; the table's trigger NOTIFYs each (messages over 8000 bytes by id).
_GROUP_SEND_SQL = sql.SQL(
    "INSERT INTO {messages} (channel, message, expire) "
    "SELECT DISTINCT channel, %s, %s FROM {members} WHERE group_key = %s"
).format(messages=sql.Identifier(MESSAGE_TABLE), members=sql.Identifier(GROUP_CHANNEL_TABLE))


class PostgresChannelLayer(_PostgresChannelLayer):
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
