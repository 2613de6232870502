"""The events of many runs in one order — the order their transactions committed in — for the
session and account streams (docs/EVENTS.md, "Streams of many runs").

A run's own seq orders its events, but a session's runs and an account's write concurrently (a
retried run's `run_retried` lands on the old run while the new one runs), and neither the events'
ids nor their timestamps are commit order: a transaction that took id 100 can commit after the one
that took 101, and a reader already past 101 would never see 100. So every event carries the id of
the transaction that wrote it (RunEvent.xact_id, set by the database), and a read hands out only the
events of transactions older than every transaction still running — the barrier. Each of those has
committed or rolled back, so no event can appear below the barrier later; and a transaction that
writes later has, or will be given, an id at or above it. The cursor is the last event's
(xact_id, id): whatever commits after a read lies above it."""

import re
from dataclasses import dataclass

from django.db.models import BigIntegerField, F, Q, QuerySet
from django.db.models.expressions import RawSQL

from config.pagination import InvalidCursor
from runs_app.models import RunEvent

# "<transaction id>_<event id>": every string matching it names a position (18 digits stay in a bigint).
EVENT_CURSOR_PATTERN = r"^[0-9]{1,18}_[0-9]{1,18}$"

# The lowest id of a transaction still running, but the reader's own and those of other databases:
# below it every transaction that could have written here has committed or rolled back. From the
# read's own snapshot (uncorrelated: computed once per read): its in-progress list, else its xmax —
# or one more than that when xmax is the reader's own transaction (it has not ended, so xmax stops
# there; PostgreSQL's xmin counts it too, and a reader inside a transaction that wrote events — a
# test's — would wait on itself).
# Transaction ids are the whole server's, so a long writing transaction in another database on the
# same server would hold every feed back. Its id is left out when the server's activity shows a
# backend of another database (or none) running it: a backend never changes database, and no two
# running transactions share the low 32 bits the activity shows, so whenever the activity was read
# that attribution holds. An id the reader may not attribute (the backend's role is not the reader's
# and it lacks pg_read_all_stats; a prepared transaction) stays in: the barrier errs on waiting.
_BARRIER_SQL = (
    "SELECT least((SELECT min(x::text::bigint) FROM pg_snapshot_xip(s) AS x "
    "WHERE mod(x::text::bigint, 4294967296) NOT IN ("
    "SELECT a.backend_xid::text::bigint FROM pg_stat_get_activity(NULL) AS a "
    "WHERE a.backend_xid IS NOT NULL "
    "AND a.datid IS DISTINCT FROM (SELECT oid FROM pg_database WHERE datname = current_database()))), "
    "pg_snapshot_xmax(s)::text::bigint + (pg_snapshot_xmax(s) IS NOT DISTINCT FROM pg_current_xact_id_if_assigned())::int) "
    "FROM pg_current_snapshot() AS s"
)


@dataclass(frozen=True)
class FeedPage:
    events: list[RunEvent]
    held: bool  # events past these are committed but wait for an older transaction still running


def event_cursor(event: RunEvent) -> str:
    return f"{event.xact_id}_{event.pk}"


def event_cursor_decode(cursor: str | None) -> tuple[int, int]:
    """The (transaction id, event id) a cursor names; (0, 0), before everything, for none."""
    if cursor is None:
        return 0, 0
    if not re.fullmatch(EVENT_CURSOR_PATTERN, cursor):
        raise InvalidCursor("The cursor is not one this API handed out.")
    xact_id, event_id = cursor.split("_")
    return int(xact_id), int(event_id)


def event_feed_read(*, events: QuerySet[RunEvent], after: str | None, limit: int) -> FeedPage:
    """The next `limit` events of `events` after the cursor `after`, in commit order, below the
    barrier. One query: the rows past the cursor come with the barrier, and the first row of a
    transaction that may still be followed by an older one's ends the page."""
    xact_id, event_id = event_cursor_decode(after)
    rows = list(
        events.annotate(barrier=RawSQL(_BARRIER_SQL, [], output_field=BigIntegerField()))
        .filter(Q(xact_id__gt=xact_id) | Q(xact_id=xact_id, id__gt=event_id), xact_id__gte=xact_id)
        .order_by("xact_id", "id")[:limit]
    )
    ready = [row for row in rows if row.xact_id < row.barrier]
    return FeedPage(events=ready, held=len(ready) < len(rows))


def feed_events(*, session_id=None) -> QuerySet[RunEvent]:
    """Every run's events, or one session's, each with its session's owner (whose view of the
    payloads a reader gets is the owner's or an operator's: access.reads_desk_notes)."""
    events = RunEvent.objects.annotate(session_owner_id=F("run__session__owner_id"))
    return events if session_id is None else events.filter(run__session_id=session_id)
