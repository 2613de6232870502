"""The console's websocket. The database is the truth and the socket a doorbell (SPEC §3):

- `subscribe` checks the user may see the session (every time), joins its group *first*,
  then sends every RunEvent after the client's last seq per run, then the text streamed so
  far of any model step in progress — so nothing committed between the two is lost.
- Live `run.events` are forwarded gap-free and without duplicates per run: seqs the client
  has are dropped; a jump (a lost or overtaken doorbell) is filled from RunEvent.
- `run.delta` (text and tool-call argument fragments) carries its step and character offset,
  so what a client already has is dropped here and the client reconciles the rest with what it
  shows; a text delta after a gap keeps the text so far when the worker sent it along.
- Events go out as the console shows them (console.presenters.console_event): a tool call with its
  card's words; for the customer, no discarded step's reason, no error code, and no draft call of
  a tool nobody registered (its turn is thrown away unseen).
- `post`, `cancel` and `decide` go through console.actions (the access policy, then
  the engine's actions); a refusal comes back as {"type": "error", "code", "message"}.

Client → server:  {"action": "subscribe", "session": id, "after": {run_id: last_seq}}
                  {"action": "unsubscribe", "session": id}
                  {"action": "post", "session": id, "content": text, "mode": auto|supplement|new_intent|queue}
                  {"action": "cancel", "run": id, "reason": text}
                  {"action": "decide", "approval": id, "decision": approve|reject, "note": text}
                  (any action may carry "ref"; the answer repeats it)
Server → client:  {"type": "events", "session", "run_id", "events": [{"seq", "type", "payload"}], "catchup"?}
                  {"type": "delta", "run_id", "delta": {...}}
                  {"type": "stream", "run_id", "step", "text"}   text so far of a running step
                  {"type": "subscribed", "session", "runs": {run_id: last_seq}}
                  {"type": "posted" | "cancel_requested" | "decided" | "unsubscribed", ...}
                  (unsubscribed with "reason": "access_revoked" when the server left a session the
                  user may no longer see; a logged-out or deactivated user's socket closes, 4401)
                  {"type": "error", "code", "message", "action", "ref"}
"""

import asyncio
import json
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q

from console.errors import ConsoleRefusal
from config.errors import CommonRefusal, WardenError
from operations import liveness
from operations.streams import stream_slot_give_back, stream_slot_renew, stream_slot_take, streams_refusal
from runs_app.events import LiveDeltaKind, RunEventType, event_payload_for_customer
from runs_app.live import session_group
from runs_app.models import Run, RunEvent, RunPhase, RunStatus, Step, StepKind, StepStatus
from access import policy as access
from console.presenters import console_event, draft_call_shown
from console.actions import (
    console_approval_decide,
    console_message_post,
    console_run_cancel,
    console_session_get,
    uuid_or_none,
)

logger = logging.getLogger("warden.console")

# Bounds what one client message can make the server read.
MAX_AFTER_ENTRIES = 500
STEP_CLOSED = float("inf")


def _event_dict(row) -> dict:
    return {"seq": row["seq"], "type": row["type"], "payload": row["payload"]}


def session_catch_up(*, session_id: str, after: dict[str, int]) -> dict:
    """What a (re)subscribing client missed: per run of the session, the events after its last
    seq (all of them for runs it does not know), and the text so far of running model steps."""
    runs = list(Run.objects.filter(session_id=session_id).order_by("created_at").values("id", "status", "phase"))
    events: dict[str, list[dict]] = {str(r["id"]): [] for r in runs}
    rows = RunEvent.objects.filter(run__session_id=session_id).order_by("run__created_at", "run_id", "seq")
    known = {run_id: seq for run_id, seq in after.items() if run_id in events}
    if known:
        # The client's own runs: only what it has not seen. Rows of runs it knows up to their seq
        # are excluded in SQL, so a long history is not read again on every reconnect.
        seen = Q()
        for run_id, seq in known.items():
            seen |= Q(run_id=run_id, seq__lte=seq)
        rows = rows.exclude(seen)
    for row in rows.values("run_id", "seq", "type", "payload"):
        events[str(row["run_id"])].append(_event_dict(row))
    streaming = [str(r["id"]) for r in runs if r["status"] == RunStatus.RUNNING and r["phase"] == RunPhase.CALLING_MODEL]
    streams = [
        {"run_id": str(step.run_id), "step": step.index, "text": step.streamed_text}
        for step in Step.objects.filter(run_id__in=streaming, kind=StepKind.MODEL, status=StepStatus.RUNNING)
        if step.streamed_text
    ]
    return {"runs": [str(r["id"]) for r in runs], "events": events, "streams": streams}


def run_events_between(*, run_id: str, after: int, through: int) -> list[dict]:
    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=after, seq__lte=through).order_by("seq")
    return [_event_dict(row) for row in rows.values("seq", "type", "payload")]


def run_session_id(*, run_id: str) -> str | None:
    session_id = Run.objects.filter(pk=run_id).values_list("session_id", flat=True).first()
    return str(session_id) if session_id else None


def _parse_after(value) -> dict[str, int]:
    if value in (None, ""):
        return {}
    if not isinstance(value, dict) or len(value) > MAX_AFTER_ENTRIES:
        raise WardenError(CommonRefusal.BAD_REQUEST, "'after' must map run ids to the last seq seen.")
    after = {}
    for run_id, seq in value.items():
        pk = uuid_or_none(run_id)
        if pk is None or not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise WardenError(CommonRefusal.BAD_REQUEST, "'after' must map run ids to the last seq seen.")
        after[str(pk)] = seq
    return after


class ConsoleConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)  # before accept: the handshake is refused (HTTP 403)
            return
        self.user = user
        # One of the user's live-connection slots (operations/streams.py), renewed by the access
        # re-check while the socket stays open, given back when it closes.
        self.slot = await database_sync_to_async(stream_slot_take)(user_id=user.pk, kind="websocket",
                                                                    seconds=self._slot_seconds())
        if self.slot is None:
            # Accepted only to say why (a refused handshake carries no reason), then closed.
            await self.accept()
            await self.send_json({"type": "error", "code": "too_many_streams", "message": streams_refusal(user.pk)})
            await self.close(code=4429)
            return
        self.sessions: set[str] = set()
        self.last_seq: dict[str, int] = {}  # per run: the highest seq this client has been sent
        self.run_sessions: dict[str, str | None] = {}
        # Per watched session: the customer's username when this user gets the customer's view
        # (operators' notes and evidence blanked, access.policy.reads_desk_notes), else None.
        self.customer_view: dict[str, str | None] = {}
        # Per (run, step): how far the text this client was sent reaches. A doorbell delivered
        # twice (channels_postgres 1.1 can run two listeners in one process) is dropped here.
        self.text_sent: dict[tuple[str, int], int] = {}
        self.calls_sent: dict[tuple[str, int, int], int] = {}  # per (run, step, call index), likewise
        self.hidden_drafts: set[tuple[str, int, int]] = set()  # draft calls the customer is not shown
        await self.accept()
        liveness.gauge_add("websocket_clients", 1)  # a connected console, for warden_live_clients
        self.counted = True
        self.rechecking = asyncio.create_task(self._recheck_access())

    @staticmethod
    def _slot_seconds() -> float:
        return 3 * settings.WARDEN_CONSOLE_RECHECK_SECONDS + 60

    async def disconnect(self, code):
        if getattr(self, "slot", None) is not None:
            slot, self.slot = self.slot, None
            await database_sync_to_async(stream_slot_give_back)(slot)
        if getattr(self, "counted", False):
            self.counted = False
            liveness.gauge_add("websocket_clients", -1)
        if getattr(self, "rechecking", None) is not None:
            self.rechecking.cancel()
        for session_id in getattr(self, "sessions", set()):
            await self.channel_layer.group_discard(session_group(session_id), self.channel_name)

    async def _recheck_access(self) -> None:
        """Access is checked on connect and on every subscribe, and again now and then while the
        socket stays open: a logout or a deactivated user closes it, a session the user may no
        longer see is left (and the client told)."""
        while True:
            await asyncio.sleep(settings.WARDEN_CONSOLE_RECHECK_SECONDS)
            try:
                user, lost = await database_sync_to_async(self._access_now)(sorted(self.sessions))
            except Exception:  # noqa: BLE001 - a failed check is tried again, never kills the socket
                logger.warning("console access re-check failed", exc_info=True)
                continue
            if user is None:
                await self.close(code=4401)
                return
            self.user = user
            try:
                await database_sync_to_async(stream_slot_renew)(self.slot, seconds=self._slot_seconds())
            except Exception:  # noqa: BLE001 - tried again at the next re-check; the slot outlives a miss
                logger.warning("console stream slot renewal failed", exc_info=True)
            for session_id in lost:
                self.sessions.discard(session_id)
                await self.channel_layer.group_discard(session_group(session_id), self.channel_name)
                await self.send_json({"type": "unsubscribed", "session": session_id, "reason": "access_revoked"})

    def _access_now(self, session_ids: list[str]):
        """(the user, afresh — None when logged out or deactivated; the watched sessions they may
        no longer see)."""
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        if key is None or not session.exists(key):
            return None, []
        user = get_user_model().objects.filter(pk=self.user.pk, is_active=True).first()
        if user is None:
            return None, []
        lost = []
        for session_id in session_ids:
            try:
                console_session_get(user=user, session_id=session_id)
            except WardenError:
                lost.append(session_id)
        return user, lost

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        try:
            content = json.loads(text_data or "")
        except ValueError:
            await self._send_error(WardenError(CommonRefusal.BAD_REQUEST, "Messages must be JSON objects."), {})
            return
        await self.receive_json(content)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict):
            await self._send_error(WardenError(CommonRefusal.BAD_REQUEST, "Messages must be JSON objects."), {})
            return
        handler = {
            "subscribe": self._subscribe,
            "unsubscribe": self._unsubscribe,
            "post": self._post,
            "cancel": self._cancel,
            "decide": self._decide,
        }.get(content.get("action"))
        try:
            if handler is None:
                raise WardenError(ConsoleRefusal.UNKNOWN_ACTION, "action must be subscribe, unsubscribe, post, cancel or decide.")
            await handler(content)
        except WardenError as error:
            await self._send_error(error, content)
        except Exception:  # noqa: BLE001 - the client gets an answer; the details go to the log
            logger.exception("console action %r failed", content.get("action"))
            await self._send_error(WardenError(CommonRefusal.INTERNAL_ERROR, "The server could not do that."), content)

    async def _send_error(self, error: WardenError, content: dict) -> None:
        await self.send_json({"type": "error", **error.body(),
                              "action": content.get("action"), "ref": content.get("ref")})

    # --- actions ------------------------------------------------------------------------------

    async def _subscribe(self, content: dict) -> None:
        after = _parse_after(content.get("after"))
        session = await database_sync_to_async(console_session_get)(user=self.user, session_id=content.get("session"))
        session_id = str(session.pk)
        desk_view = access.reads_desk_notes(user=self.user, session_owner_id=session.owner_id)
        self.customer_view[session_id] = None if desk_view else session.owner.get_username()
        if not await database_sync_to_async(access.can_see_runs_of)(user=self.user, session=session):
            # The session, not its runs (sessions_app.view_session without run access): nothing to stream.
            await self.send_json({"type": "subscribed", "session": session_id, "ref": content.get("ref"), "runs": {}})
            return
        # Join before reading: an event committed after the read is then certainly announced
        # to us, and one announced before it is dropped below as already sent.
        await self.channel_layer.group_add(session_group(session_id), self.channel_name)
        self.sessions.add(session_id)
        missed = await database_sync_to_async(session_catch_up)(session_id=session_id, after=after)
        for run_id in missed["runs"]:
            self.run_sessions[run_id] = session_id
            self.last_seq[run_id] = after.get(run_id, 0)
            await self._send_events(run_id, missed["events"][run_id], catchup=True)
        for stream in missed["streams"]:
            key = (stream["run_id"], stream["step"])
            self.text_sent[key] = max(self.text_sent.get(key, 0), len(stream["text"]))
            await self.send_json({"type": "stream", **stream})
        await self.send_json({
            "type": "subscribed", "session": session_id, "ref": content.get("ref"),
            "runs": {run_id: self.last_seq[run_id] for run_id in missed["runs"]},
        })

    async def _unsubscribe(self, content: dict) -> None:
        session_id = str(uuid_or_none(content.get("session")) or "")
        if session_id in self.sessions:
            self.sessions.discard(session_id)
            await self.channel_layer.group_discard(session_group(session_id), self.channel_name)
        await self.send_json({"type": "unsubscribed", "session": session_id, "ref": content.get("ref")})

    async def _post(self, content: dict) -> None:
        result = await database_sync_to_async(console_message_post)(
            user=self.user, session_id=content.get("session"), content=str(content.get("content") or ""),
            mode=str(content.get("mode") or "auto"),
        )
        await self.send_json({
            "type": "posted", "ref": content.get("ref"), "disposition": result.disposition, "run_id": str(result.run.id),
            "pending_input": result.pending_input.pk if result.pending_input else None,
        })

    async def _cancel(self, content: dict) -> None:
        run = await database_sync_to_async(console_run_cancel)(
            user=self.user, run_id=content.get("run"), reason=str(content.get("reason") or "")
        )
        await self.send_json({"type": "cancel_requested", "ref": content.get("ref"), "run_id": str(run.id), "status": run.status})

    async def _decide(self, content: dict) -> None:
        approval = await database_sync_to_async(console_approval_decide)(
            user=self.user, approval_id=content.get("approval"), decision=str(content.get("decision") or ""),
            note=str(content.get("note") or ""),
        )
        await self.send_json({"type": "decided", "ref": content.get("ref"), "approval": str(approval.id), "status": approval.status})

    # --- live delivery --------------------------------------------------------------------------

    async def _watching(self, run_id: str) -> bool:
        if run_id not in self.run_sessions:
            # A run that started after we subscribed: which session is it in?
            self.run_sessions[run_id] = await database_sync_to_async(run_session_id)(run_id=run_id)
        return self.run_sessions[run_id] in self.sessions

    async def _send_events(self, run_id: str, events: list[dict], *, catchup: bool = False) -> None:
        if not events:
            return
        self.last_seq[run_id] = events[-1]["seq"]
        for event in events:
            if event["type"] in (RunEventType.STEP_COMPLETED, RunEventType.STEP_DISCARDED):
                # The event carries (or voids) the final text: no delta of that step is news now.
                self.text_sent[(run_id, event["payload"].get("step"))] = STEP_CLOSED
        customer = self.customer_view.get(self.run_sessions.get(run_id))
        if customer is not None:
            events = [{**event, "payload": event_payload_for_customer(event["type"], event["payload"], customer_username=customer)}
                      for event in events]
        # The card's words and, for the customer, no internals (console.presenters.console_event).
        events = [console_event(event, desk_view=customer is None) for event in events]
        message = {"type": "events", "session": self.run_sessions.get(run_id), "run_id": run_id, "events": events}
        if catchup:
            message["catchup"] = True
        await self.send_json(message)

    async def run_events(self, message: dict) -> None:
        run_id = message["run_id"]
        if not await self._watching(run_id):
            return
        last = self.last_seq.get(run_id, 0)
        events = [event for event in message["events"] if event["seq"] > last]
        if not events:
            return
        if events[0]["seq"] != last + 1:
            # A doorbell was lost (a full channel) or overtaken (two processes publishing for one
            # run): the log has everything up to this one, since publishing follows the commit.
            events = await database_sync_to_async(run_events_between)(run_id=run_id, after=last, through=events[-1]["seq"])
        await self._send_events(run_id, events)

    async def run_delta(self, message: dict) -> None:
        run_id = message["run_id"]
        if not await self._watching(run_id):
            return
        delta = message["delta"]
        if delta.get("kind") == LiveDeltaKind.TOOL_CALL_DELTA and self._draft_hidden(run_id, delta):
            return
        if delta.get("kind") == LiveDeltaKind.TOOL_CALL_DELTA and isinstance(delta.get("offset"), int):
            key = (run_id, delta["step"], delta["index"])
            sent = self.calls_sent.get(key, -1)  # argument characters the client has; -1: not announced
            end = delta["offset"] + len(delta["arguments"])
            if end <= sent or self.text_sent.get((run_id, delta["step"])) == STEP_CLOSED:
                return
            if delta["offset"] <= max(sent, 0):
                self.calls_sent[key] = end
        elif delta.get("kind") == LiveDeltaKind.TEXT_DELTA:
            key = (run_id, delta["step"])
            sent = self.text_sent.get(key, 0)  # the client has the text up to here, without gaps
            end = delta["offset"] + len(delta["text"])
            if end <= sent:
                return  # the client has every character of it already
            if delta["offset"] <= sent:
                if "so_far" in delta:
                    # No gap before this piece: the whole text so far would only repeat what the
                    # client has (and make the message as long as the answer).
                    delta = {key_: value for key_, value in delta.items() if key_ != "so_far"}
                self.text_sent[key] = end
            elif "so_far" in delta:
                self.text_sent[key] = len(delta["so_far"])  # the text so far closes the gap
            # else: a gap before this piece; the client keeps it aside until a delta carrying
            # the text so far (the worker sends one a second) closes the gap.
        await self.send_json({"type": "delta", "run_id": run_id, "delta": delta})


    def _draft_hidden(self, run_id: str, delta: dict) -> bool:
        """The customer never sees a draft call of a tool nobody registered (its turn is thrown
        away): the call's first fragment names it, the later ones follow it unseen."""
        if self.customer_view.get(self.run_sessions.get(run_id)) is None:
            return False
        key = (run_id, delta.get("step"), delta.get("index"))
        if delta.get("name"):
            if draft_call_shown(delta["name"]):
                self.hidden_drafts.discard(key)
            else:
                self.hidden_drafts.add(key)
        return key in self.hidden_drafts


class EchoConsumer(AsyncWebsocketConsumer):
    """Bench only (mounted when WARDEN_BENCH_ECHO=1): the raw websocket round trip through
    daphne, the floor the console's delta latency is compared with."""

    async def connect(self):
        await self.accept()

    async def receive(self, text_data=None, bytes_data=None):
        await self.send(text_data=text_data, bytes_data=bytes_data)
