"""Live delivery: the database is the truth and the socket a doorbell.

Lifecycle events are committed to RunEvent first and announced here only after commit;
token deltas are announced directly and never stored one row per token. Delivery is
best-effort by design: a watcher that misses a doorbell catches up from RunEvent by seq.
"""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger("warden.live")


def session_group(session_id) -> str:
    return f"session.{session_id}"


def publish(*, session_id, message: dict) -> None:
    """Send one message to everyone watching the session. Never raises: losing a doorbell
    must not fail the run, since the event log already holds the truth."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(session_group(session_id), message)
    except Exception:  # noqa: BLE001 - see docstring
        logger.warning("live publish to session %s failed", session_id, exc_info=True)


def publish_events_on_commit(*, session_id, run_id, events: list[dict]) -> None:
    if not events:
        return
    message = {"type": "run.events", "run_id": str(run_id), "events": events}
    transaction.on_commit(lambda: publish(session_id=session_id, message=message))


def publish_delta(*, session_id, run_id, delta: dict) -> None:
    publish(session_id=session_id, message={"type": "run.delta", "run_id": str(run_id), "delta": delta})
