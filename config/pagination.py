"""Keyset pagination shared by every list (selectors page with it; the API hands the cursors out).
Cursors are opaque to clients and checked here: a damaged one is InvalidCursor, never a
database error; the API's schema carries their pattern."""

import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from django.db.models import Q

from config.errors import CommonRefusal, WardenError


class InvalidCursor(WardenError):
    """A cursor this server did not hand out."""

    def __init__(self, message: str):
        super().__init__(CommonRefusal.INVALID_CURSOR, message,
                         fields=[{"field": "query.cursor", "message": "invalid cursor", "type": "invalid_cursor"}])


# A cursor is the page's last (timestamp in microseconds since the epoch, id): a string the schema
# can describe exactly, so every string matching CURSOR_PATTERN names a position (issue 27, finding
# 11: a schema-valid cursor was refused).
CURSOR_PATTERN = r"^[0-9]{1,17}_[0-9a-f]{32}$"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def cursor_encode(position: datetime, pk) -> str:
    micros = (position - _EPOCH) // timedelta(microseconds=1)
    return f"{max(micros, 0)}_{uuid.UUID(str(pk)).hex}"


def cursor_decode(cursor: str, *, pk_type=uuid.UUID) -> tuple[datetime, Any]:
    """The (timestamp, id) a page ends at."""
    if not re.fullmatch(CURSOR_PATTERN, cursor or ""):
        raise InvalidCursor("The cursor is not one this API handed out.")
    micros, pk = cursor.split("_")
    return _EPOCH + timedelta(microseconds=int(micros)), pk_type(pk)


def keyset_page(queryset, *, cursor: str | None, limit: int, position_field: str, descending: bool = True,
                order_prefix: tuple = ()):
    """One page of `queryset` ordered by (position_field, id), and the cursor of the next page
    (None on the last). The bound is written as `pos <= c AND (pos < c OR id < pk)` so the first
    half is an index range condition: deep pages cost the same as the first. `order_prefix`
    names columns the filters fix to one value: ordering by them changes nothing but tells the
    planner which index already yields the rows in order."""
    order = [f"-{position_field}", "-id"] if descending else [position_field, "id"]
    queryset = queryset.order_by(*order_prefix, *order)
    if cursor:
        position, pk = cursor_decode(cursor)
        if descending:
            queryset = queryset.filter(Q(**{f"{position_field}__lte": position}),
                                       Q(**{f"{position_field}__lt": position}) | Q(id__lt=pk))
        else:
            queryset = queryset.filter(Q(**{f"{position_field}__gte": position}),
                                       Q(**{f"{position_field}__gt": position}) | Q(id__gt=pk))
    rows = list(queryset[: limit + 1])
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1]
        if isinstance(last, dict):  # a .values() page
            next_cursor = cursor_encode(last[position_field], last["id"])
        else:
            next_cursor = cursor_encode(getattr(last, position_field), last.pk)
    return rows, next_cursor
