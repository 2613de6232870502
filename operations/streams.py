"""How many live connections each user holds (issue 27, finding 10): one user held 447 websockets
and 300 SSE streams. Opening one takes a slot — under the user's advisory lock, so two opens at
once cannot both take the last — and ending it gives the slot back; a slot of a process that died
expires unless renewed. The cap is per user, over every web process: WARDEN_STREAMS_PER_USER."""

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from operations.models import OpenStream

# The first half of the advisory lock on a user's slots (engine.state's business keys use 26, freezes 27).
STREAM_LOCK_SPACE = 28


def stream_slot_take(*, user_id: int, kind: str, seconds: float) -> str | None:
    """A slot for a connection of `user_id` held at most `seconds` unless renewed; None when the
    user holds WARDEN_STREAMS_PER_USER already."""
    now = timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [STREAM_LOCK_SPACE, user_id])
        OpenStream.objects.filter(user_id=user_id, expires_at__lt=now).delete()
        if OpenStream.objects.filter(user_id=user_id).count() >= settings.WARDEN_STREAMS_PER_USER:
            return None
        slot = OpenStream.objects.create(id=uuid.uuid4(), user_id=user_id, kind=kind, opened_at=now,
                                         expires_at=now + timedelta(seconds=seconds))
    return str(slot.pk)


def stream_slot_renew(slot: str, *, seconds: float) -> None:
    OpenStream.objects.filter(pk=slot).update(expires_at=timezone.now() + timedelta(seconds=seconds))


def stream_slot_give_back(slot: str) -> None:
    OpenStream.objects.filter(pk=slot).delete()


def streams_refusal(user_id: int) -> str:
    return (f"You have {settings.WARDEN_STREAMS_PER_USER} live streams and sockets open, the most one user may; "
            "close one (or wait for one to end) and try again.")
