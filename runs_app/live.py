"""Live delivery: the database is the truth and the socket a doorbell.

Lifecycle events are committed to RunEvent first and announced here only after commit;
token deltas are announced directly and never stored one row per token. Delivery is
best-effort by design: a watcher that misses a doorbell catches up from RunEvent by seq.
"""

import asyncio
import logging
import os
import threading

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger("warden.live")

# A publish that takes longer than this is given up (and logged); the run goes on.
PUBLISH_TIMEOUT_SECONDS = 5.0

_publisher: tuple[int, asyncio.AbstractEventLoop] | None = None
_publisher_lock = threading.Lock()


def session_group(session_id) -> str:
    return f"session.{session_id}"


def _server_loop() -> asyncio.AbstractEventLoop | None:
    """The ASGI server's event loop, when we run in one of its sync threads (daphne)."""
    if getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) == os.getpid():
        return getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    return None


def _publisher_loop() -> asyncio.AbstractEventLoop:
    """One long-lived event loop per process for publishing from plain sync code (workers).
    async_to_sync would build a new loop per message there, and the layer a new connection
    pool with it: several milliseconds of CPU per delta. Re-made after a fork."""
    global _publisher
    with _publisher_lock:
        if _publisher is None or _publisher[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="live-publisher", daemon=True).start()
            _publisher = (os.getpid(), loop)
        return _publisher[1]


def publish(*, session_id, message: dict) -> None:
    """Send one message to everyone watching the session. Never raises: losing a doorbell
    must not fail the run, since the event log already holds the truth. Blocks until sent,
    so one process's messages stay in the order it published them."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if _server_loop() is not None:
            # Inside daphne: on the server's own loop, where its layer connections live.
            async_to_sync(layer.group_send)(session_group(session_id), message)
        else:
            sending = layer.group_send(session_group(session_id), message)
            asyncio.run_coroutine_threadsafe(sending, _publisher_loop()).result(timeout=PUBLISH_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - see docstring
        logger.warning("live publish to session %s failed", session_id, exc_info=True)


def publish_events_on_commit(*, session_id, run_id, events: list[dict]) -> None:
    if not events:
        return
    message = {"type": "run.events", "run_id": str(run_id), "events": events}
    transaction.on_commit(lambda: publish(session_id=session_id, message=message))


def publish_delta(*, session_id, run_id, delta: dict) -> None:
    publish(session_id=session_id, message={"type": "run.delta", "run_id": str(run_id), "delta": delta})
