"""The Server-Sent Events transport of the API: events as they are committed, resumable with
Last-Event-ID — one run's by seq, or many runs' (a session's, or every run the caller may see) by
the commit-order cursor of runs_app.feeds. The database is the truth and the channel layer a
doorbell (runs_app.live): under ASGI a stream sleeps on its session's group and reads when a
doorbell of its events rings; without a layer or a group, or under WSGI and the test client, it
polls. The endpoints that open a stream (api/runs.py, api/sessions.py, api/events.py) decide who
may see what; this module only sends it."""

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from types import SimpleNamespace

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import StreamingHttpResponse
from pydantic_core import to_json

from config.errors import CommonRefusal, WardenError
from operations import liveness
from operations.streams import stream_slot_give_back, stream_slot_take, streams_refusal
from runs_app.events import event_payload_for_customer
from runs_app.feeds import event_cursor, event_feed_read
from runs_app.live import PUBLISH_TIMEOUT_SECONDS, session_group
from runs_app.selectors import run_event_poll
from sessions_app.api_keys import ApiKeyRevoked, api_key_authenticate

logger = logging.getLogger("warden.live")

# The event stream: how often the sync stream (WSGI, the test client) looks for new events, how
# long a stream stays quiet before a keepalive comment, and how many events one read fetches.
SSE_POLL_SECONDS = 0.25
SSE_KEEPALIVE_SECONDS = 15.0
SSE_BATCH = 200
# An open stream checks this often that its caller may still see the run (a revoked key, a
# deactivated user, a logout or a lost permission ends it): as often as the console's socket
# (WARDEN_CONSOLE_RECHECK_SECONDS). Its read of the run doubles as the idle read below.
SSE_RECHECK_SECONDS = 30.0
# Under ASGI a stream sleeps on its session's doorbell (runs_app.live rings it after every commit
# of events) and reads the database when its run's doorbell rings, and otherwise only on every
# SSE_IDLE_READ_KEEPALIVES-th keepalive: the access re-check, and any event whose doorbell was
# lost. With the defaults one read of two queries per 30 s (issue 16: an idle stream ≤ 0.1/s).
SSE_IDLE_READ_KEEPALIVES = 2
# Without a channel layer (none configured, or it failed) the async stream polls this often:
# slower than the sync stream, since under ASGI one process serves every open stream.
SSE_POLL_WITHOUT_LAYER_SECONDS = 1.0
# A stream trusts its doorbell once a message it sent itself came back through the layer. It
# waits SSE_DOORBELL_PROBE_SECONDS for the first, twice as long for each next one, and polls
# after SSE_DOORBELL_PROBES (6.35 s in all).
SSE_DOORBELL_PROBE_SECONDS = 0.05
SSE_DOORBELL_PROBES = 7


def sse_response(*, description: str, id_pattern: str, id_meaning: str, events: str, data: str) -> dict:
    """The OpenAPI description of a Server-Sent Events answer (`openapi_extra={"responses": …}`):
    OpenAPI 3.1's convention for event streams, whose schema describes one event."""
    return {"200": {
        "description": description,
        "content": {"text/event-stream": {"schema": {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "id": {"type": "string", "pattern": id_pattern, "description": id_meaning},
                "event": {"type": "string", "description": events},
                "data": {"type": "string", "contentMediaType": "application/json", "description": data},
                "retry": {"type": "integer", "description": "reconnection delay in milliseconds"},
            },
        }}},
    }}


def as_seen_by(events, customer: str | None):
    if customer is None:
        return events
    return [SimpleNamespace(seq=e.seq, type=e.type, created_at=e.created_at,
                            payload=event_payload_for_customer(e.type, e.payload, customer_username=customer))
            for e in events]


def _sse_event(event) -> str:
    data = to_json({"seq": event.seq, "type": event.type, "payload": event.payload, "created_at": event.created_at},
                   fallback=str, inf_nan_mode="null").decode()
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n"


def feed_event_out(event, customer: str | None) -> dict:
    """An event of a many-runs feed as its reader sees it: which run, and the customer's view of
    the payload for `customer` (None: an operator's)."""
    payload = event.payload if customer is None else event_payload_for_customer(event.type, event.payload,
                                                                                 customer_username=customer)
    return {"cursor": event_cursor(event), "run_id": event.run_id, "seq": event.seq, "type": event.type,
            "payload": payload, "created_at": event.created_at}


def _sse_feed_event(event, customer: str | None) -> str:
    out = feed_event_out(event, customer)
    cursor = out.pop("cursor")
    data = to_json(out, fallback=str, inf_nan_mode="null").decode()
    return f"id: {cursor}\nevent: {event.type}\ndata: {data}\n\n"


def _sse_end(status: str) -> str:
    return f'event: end\ndata: {{"status": "{status}"}}\n\n'


def _sse_access_revoked(what: str) -> str:
    return f'event: error\ndata: {{"code": "access_revoked", "message": "You may no longer see {what}."}}\n\n'


SSE_ACCESS_REVOKED = _sse_access_revoked("this run")


@dataclass(frozen=True)
class _Batch:
    """One read of a feed: the events to send, the run's status and whether the stream is over
    (a run's feed), and whether committed events wait behind an older transaction (many runs')."""

    events: list
    status: str = ""
    finished: bool = False
    held: bool = False


class RunFeed:
    """One run's events by seq (`id:` the seq); the stream ends once the run is terminal and every
    event was sent. `customer`: the customer's view of the payloads, or None for an operator's."""

    def __init__(self, *, run, customer: str | None):
        self.run_id = run.pk
        self.session_id = run.session_id  # its group on the channel layer announces the run's events
        self.customer = customer
        self.label = f"run {run.pk}"
        self.access_revoked = SSE_ACCESS_REVOKED

    def read(self, after: int, seen) -> _Batch:
        """`seen`: the run as the access re-check just read it, or None."""
        if seen is not None and seen.event_seq <= after and not seen.is_terminal:
            return _Batch([], seen.status)  # the re-check read the run: nothing new, no second query
        return _Batch(*run_event_poll(run_id=self.run_id, after_seq=after, limit=SSE_BATCH))

    def frames(self, events) -> list[str]:
        return [_sse_event(event) for event in as_seen_by(events, self.customer)]

    @staticmethod
    def position(event) -> int:
        return event.seq

    def rings(self, message: dict, after: int) -> bool:
        """Whether a doorbell of the session announces this run's events after `after` (deltas and
        other runs' doorbells are not this stream's news)."""
        if message.get("type") != "run.events" or message.get("run_id") != str(self.run_id):
            return False
        return max((event.get("seq", 0) for event in message.get("events", ())), default=0) > after


class ManyRunsFeed:
    """The events of many runs in commit order (runs_app.feeds; `id:` the cursor): a session's —
    whose doorbell is its group — or every run the caller may see (no group: it polls). It never
    ends by itself: the next run's events come through the same stream. `customer_of(event)`: the
    customer's view of its payload, or None for an operator's. `events_for(seen)`: the events the
    caller may see as the access re-check found them (None: the re-check cannot narrow them)."""

    def __init__(self, *, events, customer_of, label: str, what: str, session_id=None, events_for=None):
        self.events = events
        self.events_for = events_for
        self.customer_of = customer_of
        self.session_id = session_id
        self.label = label  # for the log
        self.access_revoked = _sse_access_revoked(what)

    def read(self, after: str | None, seen) -> _Batch:
        if seen is not None and self.events_for is not None:
            self.events = self.events_for(seen)
        page = event_feed_read(events=self.events, after=after, limit=SSE_BATCH)
        return _Batch(page.events, held=page.held)

    def frames(self, events) -> list[str]:
        return [_sse_feed_event(event, self.customer_of(event)) for event in events]

    position = staticmethod(event_cursor)

    @staticmethod
    def rings(message: dict, after: str | None) -> bool:
        return message.get("type") == "run.events"  # a commit in the session: its order is the database's


class _StreamState:
    """What the stream has sent so far; shared by the sync and async generators."""

    def __init__(self, *, feed, after, max_seconds: int, still_allowed=None):
        self.feed = feed
        self.after = after
        now = time.monotonic()
        self.deadline = now + max_seconds
        self.last_sent = now
        self.last_read = now
        self.still_allowed = still_allowed
        self.next_check = now + SSE_RECHECK_SECONDS if still_allowed is not None else math.inf
        self.allowed = True
        self.held = False  # the last read left committed events behind an older transaction

    def recheck_if_due(self):  # database work: called where _poll runs
        """What the re-check read (a feed may use it), when one was due and the caller may still see the events."""
        if time.monotonic() < self.next_check:
            return None
        seen = self.still_allowed()
        self.allowed = seen is not None
        self.next_check = time.monotonic() + SSE_RECHECK_SECONDS
        return seen

    def step(self, batch: _Batch) -> tuple[list[str], bool]:
        """Frames to send for one read, and whether the stream ends after them."""
        if not self.allowed:
            return [self.feed.access_revoked], True
        self.held = batch.held
        frames = self.feed.frames(batch.events)
        if batch.events:
            self.after = self.feed.position(batch.events[-1])
            self.last_sent = time.monotonic()
        if batch.finished:
            return [*frames, _sse_end(batch.status)], True
        if time.monotonic() >= self.deadline:
            return frames, True
        if not frames and time.monotonic() - self.last_sent >= SSE_KEEPALIVE_SECONDS:
            self.last_sent = time.monotonic()
            frames.append(": keepalive\n\n")
        return frames, False


def _poll(state: _StreamState) -> _Batch:
    seen = state.recheck_if_due()
    if not state.allowed:
        return _Batch([])
    return state.feed.read(state.after, seen)


def _sse_sync(state: _StreamState):
    liveness.gauge_add("sse_clients", 1)
    try:
        yield from _sse_sync_frames(state)
    finally:
        liveness.gauge_add("sse_clients", -1)


def _sse_sync_frames(state: _StreamState):
    yield "retry: 2000\n\n"
    while True:
        batch = _poll(state)
        frames, done = state.step(batch)
        yield from frames
        if done:
            return
        if len(batch.events) < SSE_BATCH:
            time.sleep(SSE_POLL_SECONDS)


def _poll_and_release(state: _StreamState):
    """Under ASGI: between polls a stream holds no database connection (the web process's pool
    is shared by every request and stream)."""
    try:
        return _poll(state)
    finally:
        for conn in connections.all(initialized_only=True):
            if not conn.in_atomic_block:  # a test's transaction holds its data: leave it be
                conn.close_if_unusable_or_obsolete()


class _Doorbell:
    """An async stream's seat in its session's group on the channel layer (runs_app.live: the
    database is the truth, the layer a doorbell). `news` is set when a doorbell announces events
    of the stream's feed after what was sent, and when the seat comes into use or fails. It is
    `live` once a message came back through the layer: every commit after that is announced to
    us, so one more read and doorbells cover the rest — the console's join-then-read, made safe
    for channels_postgres, which drops what reaches a channel before its first receive()."""

    def __init__(self, state: _StreamState):
        self.state = state
        self.label = state.feed.label
        self.group = session_group(state.feed.session_id) if state.feed.session_id is not None else None
        self.live = False
        self.news = asyncio.Event()
        self._layer = None
        self._channel = None
        self._joined = False  # group_add was sent: leave the group at the end
        self._listening: asyncio.Task | None = None

    def open(self) -> None:
        if self.group is None:
            return
        try:
            self._layer = get_channel_layer()
        except Exception:  # noqa: BLE001 - a broken layer setting: the stream polls instead
            logger.warning("event stream of %s: the channel layer cannot be built; polling", self.label, exc_info=True)
            return
        if self._layer is not None:
            self._listening = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        layer = self._layer
        try:
            self._channel = await layer.new_channel()
            self._joined = True
            await layer.group_add(self.group, self._channel)
            # One receive() for the seat's life: a cancelled one unsubscribes the channel for good
            # on channels_redis's pub/sub layer, so it is waited on, never timed out.
            receiving = asyncio.ensure_future(layer.receive(self._channel))
            try:
                for attempt in range(SSE_DOORBELL_PROBES):
                    await layer.send(self._channel, {"type": "sse.probe"})
                    done, _ = await asyncio.wait({receiving}, timeout=SSE_DOORBELL_PROBE_SECONDS * 2**attempt)
                    if done:
                        break
                else:
                    raise TimeoutError("nothing came back through the channel layer")
            except BaseException:
                receiving.cancel()
                raise
            message = receiving.result()
            self.live = True
            self.news.set()
            while True:
                self._take(message)
                message = await layer.receive(self._channel)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the stream goes on polling (SSE_POLL_WITHOUT_LAYER_SECONDS)
            logger.warning("event stream of %s: no doorbell from the channel layer; polling", self.label, exc_info=True)
            self.live = False
            self.news.set()

    def _take(self, message: dict) -> None:
        if self.state.feed.rings(message, self.state.after):
            self.news.set()

    async def close(self) -> None:
        """Leaves the group. Runs when the stream ends, and when its client went away: daphne
        then sends http.disconnect, and Django cancels the response's task, inside this stream."""
        if self._listening is not None:
            self._listening.cancel()
            await asyncio.wait({self._listening})
        if self._joined:
            try:
                await asyncio.wait_for(self._layer.group_discard(self.group, self._channel), PUBLISH_TIMEOUT_SECONDS)
            except Exception:  # noqa: BLE001 - the stream is over either way
                logger.warning("event stream of %s: could not leave %s", self.label, self.group, exc_info=True)


async def _sse_async(state: _StreamState):
    """Under ASGI: between reads the stream waits for its session's doorbell (_Doorbell), a
    keepalive or the idle read; without a channel layer or a group it polls. While it waits it runs nothing in a
    thread and holds no database connection (the thread Django gives the sync view's request
    stays, idle, until the response ends)."""
    liveness.gauge_add("sse_clients", 1)  # a connected client, for warden_live_clients
    doorbell = _Doorbell(state)
    try:
        yield "retry: 2000\n\n"
        doorbell.open()
        read = sync_to_async(_poll_and_release)
        while True:
            doorbell.news.clear()  # this read covers every doorbell rung so far
            batch = await read(state)
            state.last_read = time.monotonic()
            frames, done = state.step(batch)
            for frame in frames:
                yield frame
            if done:
                return
            if len(batch.events) == SSE_BATCH:
                continue
            while not await _sse_wait(state, doorbell):  # time for a keepalive, not a read
                if time.monotonic() >= state.deadline:
                    return
                state.last_sent = time.monotonic()
                yield ": keepalive\n\n"
    finally:
        await doorbell.close()
        liveness.gauge_add("sse_clients", -1)


async def _sse_wait(state: _StreamState, doorbell: _Doorbell) -> bool:
    """Waits until a read is due (True): a doorbell, the re-check or the idle read — or, without
    a live doorbell, the next poll; or until a keepalive or the deadline is (False). Events held
    behind an older transaction rang their doorbell already: they are polled for."""
    if state.held:
        read_at = state.last_read + SSE_POLL_SECONDS
    elif doorbell.live:
        read_at = min(state.last_read + SSE_IDLE_READ_KEEPALIVES * SSE_KEEPALIVE_SECONDS, state.next_check)
    else:
        read_at = state.last_read + SSE_POLL_WITHOUT_LAYER_SECONDS
    timeout = min(read_at, state.last_sent + SSE_KEEPALIVE_SECONDS, state.deadline) - time.monotonic()
    if doorbell.news.is_set():
        return True
    if timeout > 0:
        try:
            await asyncio.wait_for(doorbell.news.wait(), timeout)
            return True
        except TimeoutError:
            pass
    return time.monotonic() >= read_at


def event_stream_response(*, feed: RunFeed | ManyRunsFeed, after, max_seconds: int, still_allowed, request):
    """The stream of `feed`'s events after the position `after`, ended when `still_allowed()`
    finds the caller may no longer see them (its result, when not None, is the feed's to use)."""
    state = _StreamState(feed=feed, after=after, max_seconds=max_seconds, still_allowed=still_allowed)
    # Under ASGI (daphne) the body must be an async iterator, or Django would buffer the
    # whole stream before sending it; under WSGI and the test client a plain generator.
    content = _sse_async(state) if isinstance(request, ASGIRequest) else _sse_sync(state)
    # One of the caller's live-connection slots (operations/streams.py), given back when the response
    # is closed — by Django, however the stream ends — and expiring on its own after the deadline.
    slot = stream_slot_take(user_id=request.auth.pk, kind="sse", seconds=max_seconds + 60)
    if slot is None:
        raise WardenError(CommonRefusal.THROTTLED, streams_refusal(request.auth.pk), headers={"Retry-After": "5"})
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response._resource_closers.append(lambda: stream_slot_give_back(slot))
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def caller_again(request):
    """A check of the stream's caller, for its re-checks: the same key (not revoked, owner active)
    or the same browser session (not logged out, user active). The check returns the user, or None
    once they are gone; the endpoint then asks the access policy what they may still see."""
    header = request.headers.get("Authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else None
    session_key = None if token else request.session.session_key
    user_id = request.auth.pk

    def check():
        if token:
            try:
                return api_key_authenticate(token=token)
            except ApiKeyRevoked:
                return None
        if session_key is None or not request.session.exists(session_key):
            return None
        return get_user_model().objects.filter(pk=user_id, is_active=True).first()

    return check
