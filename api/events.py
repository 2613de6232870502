"""The events of many runs over HTTP: every run the caller may see, as a page or live (SSE), in
commit order with the cursor of runs_app.feeds; a session's events use the same schemas and
parameters (api/sessions.py). Following every run is a permission of its own
(runs_app.follow_all_events): an integrator's key gets it, a customer's does not need it."""

import uuid
from datetime import datetime

from ninja import Field, Header, Query, Router, Schema

from access import policy as access
from api import streams
from api.base import COMMON_ERRORS, ShownJSON, errors
from config.errors import CommonRefusal, WardenError
from runs_app.feeds import EVENT_CURSOR_PATTERN, event_feed_read, feed_events

router = Router(tags=["events"])

FEED_PAGE_LIMIT = 500


class FeedEventOut(Schema):
    cursor: str = Field(description="the event's place in commit order: pass it back as ?after= or Last-Event-ID")
    run_id: uuid.UUID
    seq: int = Field(description="the event's seq within its run")
    type: str
    payload: ShownJSON
    created_at: datetime


class FeedPage(Schema):
    items: list[FeedEventOut]
    next_after: str | None = Field(description="pass as ?after= to continue; null: nothing yet, start again from the beginning")


def after_query(description: str = "the cursor of the last event seen (absent: from the first event)"):
    return Query(None, max_length=40, pattern=EVENT_CURSOR_PATTERN, description=description)


def last_event_id_header():
    # Empty as well: an SSE client whose last event had no id sends an empty Last-Event-ID.
    return Header(None, alias="Last-Event-ID", pattern=f"^({EVENT_CURSOR_PATTERN.strip('^$')})?$")


def resume_from(*, last_event_id: str | None, after: str | None) -> str | None:
    """Where a stream starts: Last-Event-ID wins over ?after= (an empty one names no event)."""
    return last_event_id or after


def max_seconds_query():
    return Query(300, ge=1, le=3600, description="end the stream after this long; reconnect to continue")


def limit_query():
    return Query(100, ge=1, le=FEED_PAGE_LIMIT)


def feed_page(*, events, after: str | None, limit: int, customer_of) -> dict:
    """A page of a many-runs feed; its events are all committed, and nothing committed later will
    ever sort before its end."""
    page = event_feed_read(events=events, after=after, limit=limit)
    items = [streams.feed_event_out(event, customer_of(event)) for event in page.events]
    return {"items": items, "next_after": items[-1]["cursor"] if items else after}


def customer_view_of(user):
    """Per event: the customer's view of its payload when it is of `user`'s own session (their
    username), an operator's otherwise (access.reads_desk_notes)."""
    username = user.get_username()

    def customer_of(event) -> str | None:
        return None if access.reads_desk_notes(user=user, session_owner_id=event.session_owner_id) else username

    return customer_of


def _may_follow_all(user) -> None:
    if not access.can_follow_all_events(user=user):
        raise WardenError(CommonRefusal.NOT_PERMITTED,
                          f"Following every run's events needs the {access.FOLLOW_ALL_EVENTS} permission.")


def _events_of(user):
    return access.visible_run_parts(user=user, parts=feed_events())


SSE_MANY_RUNS_RESPONSE = streams.sse_response(
    description=(
        "`text/event-stream`: one event per RunEvent of any of the runs, in commit order (`id:` its cursor, "
        "`event:` its type, `data:` JSON {run_id, seq, type, payload, created_at}); `: keepalive` comments while "
        "quiet. The stream does not end when a run does: it ends after `max_seconds`, or with `event: error` "
        "(`{\"code\": \"access_revoked\"}`) when the caller's access, checked again every 30 seconds, is gone. "
        "Reconnect with `Last-Event-ID`: nothing is missed, nothing repeated."
    ),
    id_pattern=EVENT_CURSOR_PATTERN, id_meaning="the event's cursor: send it back as Last-Event-ID",
    events="the RunEvent type (run_status, tool_call, …) or `error`",
    data="JSON: {run_id, seq, type, payload, created_at}",
)


@router.get("", response={200: FeedPage, **COMMON_ERRORS, **errors(403)}, summary="Events of every run, in commit order")
def events_list(request, after: str | None = after_query(), limit: int = limit_query()):
    """Every event of every run the caller may see, in the order they were committed, from the cursor
    `after`: for catching up after a reconnect, or polling. Needs runs_app.follow_all_events (403)."""
    _may_follow_all(request.auth)
    return feed_page(events=_events_of(request.auth), after=after, limit=limit, customer_of=customer_view_of(request.auth))


@router.get(
    "/stream",
    response={**COMMON_ERRORS, **errors(403)},
    summary="Live events of every run (Server-Sent Events)",
    openapi_extra={"responses": SSE_MANY_RUNS_RESPONSE},
)
def events_stream(
    request,
    after: str | None = after_query("start after this cursor (Last-Event-ID wins if both are sent)"),
    last_event_id: str = last_event_id_header(),
    max_seconds: int = max_seconds_query(),
):
    """Streams every event of every run the caller may see as it is committed, catching up from
    `after` / `Last-Event-ID` first. Needs runs_app.follow_all_events (403)."""
    _may_follow_all(request.auth)
    caller = streams.caller_again(request)

    def still_allowed():
        user = caller()
        return user if user is not None and access.can_follow_all_events(user=user) else None

    feed = streams.ManyRunsFeed(events=_events_of(request.auth), customer_of=customer_view_of(request.auth),
                                label=f"every run of user {request.auth.pk}", what="these events",
                                events_for=_events_of)
    return streams.event_stream_response(feed=feed, after=resume_from(last_event_id=last_event_id, after=after),
                                         max_seconds=max_seconds, still_allowed=still_allowed, request=request)
