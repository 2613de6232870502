"""Reads about sessions, their history and pending input; of the sessions a caller may see (the
access policy's queryset, given by the caller)."""

import functools
import uuid
from dataclasses import dataclass

from django.db.models import OuterRef, QuerySet, Subquery

from config.pagination import keyset_page
from runs_app.models import ACTIVE_STATUSES, Run
from sessions_app.models import InputDisposition, InputMode, Message, PendingInput, Session


def _with_active_run(queryset: QuerySet[Session]) -> QuerySet[Session]:
    # One subquery per row, answered by the partial unique index on active runs.
    active = Run.objects.filter(session=OuterRef("pk"), status__in=ACTIVE_STATUSES).values("id")[:1]
    return queryset.select_related("owner", "agent").annotate(active_run_id=Subquery(active))


def session_list(*, sessions: QuerySet[Session], cursor: str | None, limit: int) -> tuple[list[Session], str | None]:
    """Newest first, one query whatever the page size; of `sessions` (access.visible_sessions)."""
    return keyset_page(_with_active_run(sessions), cursor=cursor, limit=limit, position_field="created_at")


def session_get(*, sessions: QuerySet[Session], session_id) -> Session | None:
    return _with_active_run(sessions).filter(pk=session_id).first()


def message_list(*, session: Session, after_seq: int = 0, limit: int) -> list[Message]:
    """History in order, from after `after_seq`."""
    return list(Message.objects.filter(session_id=session.pk, seq__gt=after_seq).order_by("seq")[:limit])


def message_list_latest(*, session: Session, limit: int) -> list[Message]:
    """The latest `limit` messages, oldest first."""
    latest = Message.objects.filter(session_id=session.pk).order_by("-seq")[:limit]
    return list(reversed(latest))


def pending_input_list(*, session: Session) -> list[PendingInput]:
    """Input waiting for a run to read it (unconsumed), in arrival order."""
    return list(PendingInput.objects.filter(session_id=session.pk, consumed_at__isnull=True).order_by("id"))


def held_input_list(*, session: Session) -> list[PendingInput]:
    """Input held when the run it was meant for was cancelled, waiting for the session's user to
    send it as a new request or drop it, in arrival order."""
    return list(PendingInput.objects.filter(session_id=session.pk, disposition=InputDisposition.HELD).order_by("id"))


def pending_input_get(*, session: Session, input_id: int) -> PendingInput | None:
    """One input of the session (any disposition); None when it is not the session's."""
    return PendingInput.objects.filter(session_id=session.pk, pk=input_id).first()


def pending_inputs_meant_for_the_active_run(*, session_id) -> list[PendingInput]:
    """The unconsumed input that was meant for the session's active run: supplements, and `auto`
    input nobody classified yet (the run never read it) — up to the first intent switch, after
    which input goes with the new request. A queued new request is nobody's supplement. Read
    under the session's lock (run_end), so nothing is posted meanwhile."""
    meant = []
    for item in PendingInput.objects.filter(session_id=session_id, consumed_at__isnull=True).order_by("id"):
        mode = item.resolved_mode or item.mode
        if mode == InputMode.NEW_INTENT:
            break
        if mode in (InputMode.SUPPLEMENT, InputMode.AUTO):
            meant.append(item)
    return meant


@dataclass(frozen=True)
class Customer:
    """Whom a session serves: its owner, as Warden verified them (never what a model says)."""

    id: int
    username: str


@functools.lru_cache(maxsize=4096)
def session_customer(session_id: str) -> Customer | None:
    """The session's owner, kept per process (a session never changes owner); None for no such
    session."""
    try:
        uuid.UUID(str(session_id))
    except ValueError:
        return None
    row = Session.objects.filter(pk=session_id).values_list("owner_id", "owner__username").first()
    return Customer(id=row[0], username=row[1]) if row else None
