"""Live delivery: the database is the truth and the socket a doorbell.

Lifecycle events are committed to RunEvent first and announced here only after commit;
token deltas are announced directly and never stored one row per token. Delivery is
best-effort by design: a watcher that misses a doorbell catches up from RunEvent by seq.
"""

import asyncio
import logging
import os
import threading
import time

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from runs_app.events import LiveDeltaKind

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


# --- streamed text ---------------------------------------------------------------------------------

# A step's text goes out at most this often: one doorbell per burst of tokens, not one per token.
DELTA_FLUSH_SECONDS = 0.05
# Some deltas also carry the whole text so far ("keyframes"), so a console that joined in the
# middle of a stream, or missed a doorbell, is whole again by the next one: every delta while
# the text is short, then one a second (carrying it in every delta made each doorbell as long
# as the answer), and the stream's last. Beyond SO_FAR_LIMIT such a console waits for the
# step's final text (step_completed).
SO_FAR_ALWAYS = 1_000
SO_FAR_LIMIT = 16_000
KEYFRAME_SECONDS = 1.0


def step_deltas(*, session_id, run_id, step: int) -> "StepDeltas | SilentDeltas":
    """Where a model step's stream goes out: nowhere without a channel layer (publishing off)."""
    if get_channel_layer() is None:
        return SilentDeltas()
    return StepDeltas(session_id=session_id, run_id=run_id, step=step)


class SilentDeltas:
    """StepDeltas with no channel layer to send to: every piece is dropped at once, without
    handing it to the publisher thread and waiting for it there."""

    def text(self, text: str) -> bool:
        return False

    def call(self, *, index: int, id: str, name: str, arguments: str) -> bool:
        return False

    def close(self, text: str) -> None:
        pass

    def abandon(self) -> None:
        pass


class StepDeltas:
    """One model step's stream, published as deltas: text {kind: text_delta, step, offset, text
    [, so_far]} and tool-call argument fragments {kind: tool_call_delta, step, index, id, name,
    offset, arguments}. Offsets let a console skip what it has and notice what it missed.

    The streaming thread only hands over what it has so far (`text`, `call`); the process's
    publisher thread sends what is new at once after a quiet spell and then at most every
    DELTA_FLUSH_SECONDS — so no piece waits longer than that, even when the model pauses after
    it, and the stream never waits for a publish. One send at a time, so deltas leave in order.
    `close` sends the rest and returns once it is out (the step's events must follow its text);
    `abandon` drops what is not sent yet (a worker that lost its lease must go quiet)."""

    def __init__(self, *, session_id, run_id, step: int):
        self.group = session_group(session_id)
        self.run_id = str(run_id)
        self.step = step
        self._loop = _publisher_loop()
        self._lock = threading.Lock()  # the fields below, between the two threads
        self._text = ""
        self._sent = 0
        self._calls: dict[int, tuple[str, str, str]] = {}  # index -> (id, name, arguments so far)
        self._calls_sent: dict[int, int] = {}  # index -> argument characters published
        self._last_flush = 0.0
        self._last_keyframe = time.monotonic()
        self._keyframe_owed = False
        self._busy = False  # a send is scheduled or on its way; it schedules the next itself
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None  # loop side only
        self._sending: asyncio.Task | None = None  # loop side only

    def text(self, text: str) -> bool:
        """The whole text after a piece; True when this started a send."""
        with self._lock:
            self._text = text
            return self._kick()

    def call(self, *, index: int, id: str, name: str, arguments: str) -> bool:
        """A tool call's arguments so far, after a fragment; True when this started a send."""
        with self._lock:
            self._calls[index] = (id, name, arguments)
            return self._kick()

    def close(self, text: str) -> None:
        with self._lock:
            self._text = text
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._finish(), self._loop).result(timeout=PUBLISH_TIMEOUT_SECONDS)
        except Exception:  # noqa: BLE001 - as publish(): the event log holds the truth
            logger.warning("live stream of run %s step %s: last deltas not sent", self.run_id, self.step, exc_info=True)

    def abandon(self) -> None:
        with self._lock:
            self._closed = True
        self._loop.call_soon_threadsafe(self._cancel_timer)

    def _kick(self) -> bool:  # with the lock held
        if self._busy or self._closed:
            return False
        self._busy = True
        self._loop.call_soon_threadsafe(self._schedule, self._delay())
        return True

    def _delay(self) -> float:
        return max(0.0, self._last_flush + DELTA_FLUSH_SECONDS - time.monotonic())

    def _news(self) -> bool:  # with the lock held
        return len(self._text) > self._sent or any(
            len(arguments) > self._calls_sent.get(index, -1) for index, (_, _, arguments) in self._calls.items()
        )

    # --- on the publisher loop ----------------------------------------------------------------------

    def _schedule(self, delay: float) -> None:
        with self._lock:
            if self._closed:
                self._busy = False
                return
        self._timer = self._loop.call_later(delay, self._start)

    def _start(self) -> None:
        self._timer = None
        self._sending = self._loop.create_task(self._send_new())

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _send_new(self) -> None:
        for delta in self._take(last=False):
            await self._send(delta)
        with self._lock:
            if self._closed or not self._news():
                self._busy = False
                return
            delay = self._delay()
        self._schedule(delay)

    async def _finish(self) -> None:
        self._cancel_timer()
        if self._sending is not None and not self._sending.done():
            await self._sending
        for delta in self._take(last=True):
            await self._send(delta)

    def _take(self, *, last: bool) -> list[dict]:
        with self._lock:
            now = time.monotonic()
            deltas = []
            for index, (call_id, name, arguments) in sorted(self._calls.items()):
                sent = self._calls_sent.get(index, -1)  # -1: not even announced yet
                if len(arguments) > sent:
                    offset = max(sent, 0)
                    deltas.append({"kind": LiveDeltaKind.TOOL_CALL_DELTA.value, "step": self.step, "index": index, "id": call_id,
                                   "name": name, "offset": offset, "arguments": arguments[offset:]})
                    self._calls_sent[index] = len(arguments)
            text = self._text
            if len(text) > self._sent or (last and self._keyframe_owed):
                delta = {"kind": LiveDeltaKind.TEXT_DELTA.value, "step": self.step, "offset": self._sent, "text": text[self._sent:]}
                keyframe = last or len(text) <= SO_FAR_ALWAYS or now - self._last_keyframe >= KEYFRAME_SECONDS
                if keyframe and len(text) <= SO_FAR_LIMIT:
                    delta["so_far"] = text
                    self._last_keyframe, self._keyframe_owed = now, False
                else:
                    self._keyframe_owed = True
                self._sent = len(text)
                deltas.insert(0, delta)
            if deltas:
                self._last_flush = now
            return deltas

    async def _send(self, delta: dict) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        message = {"type": "run.delta", "run_id": self.run_id, "delta": delta}
        try:
            await asyncio.wait_for(layer.group_send(self.group, message), PUBLISH_TIMEOUT_SECONDS)
        except Exception:  # noqa: BLE001 - as publish()
            logger.warning("live stream of run %s step %s: delta not sent", self.run_id, self.step, exc_info=True)
