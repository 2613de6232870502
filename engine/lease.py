"""A worker's side of its leases (SPEC §5): who it is, and the one heartbeat per process that
extends every lease the process holds while its runs work (issue 34: a process drives many runs at
once, so not a thread and a connection per run). The claim, the renewal and every write
conditional on the token are the state module's (engine/state/leases.py), so a worker that stalls
past its lease and wakes up finds its writes refused.

The keeper also looks for cancel requests every WARDEN_CANCEL_POLL_SECONDS, far more often than it
renews: a cancelled run's open model call is closed at once (its socket shut down from here,
runs_app/providers/interrupt.py), not read to its end.
"""

import logging
import os
import socket
import threading
import time
import uuid

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections

from engine.state import Lease, lease_renew_many, runs_cancel_requested, steps_streamed_text_save
from runs_app.providers.interrupt import CallInterrupt

logger = logging.getLogger("warden.lease")


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class RunBeat:
    """What a run's driver learns from the heartbeat — its lease is gone, or a cancel was
    requested — and the interrupt through which either closes the run's model call."""

    def __init__(self, lease: Lease):
        self.lease = lease
        self.lease_lost = threading.Event()
        self.cancel_requested = threading.Event()
        self.interrupt = CallInterrupt()
        self.held_since = time.monotonic()
        self._streaming: tuple[int, object] | None = None

    def streaming(self, *, step_id: int | None, text_getter) -> None:
        """While a model streams, each beat also saves the text so far on the step."""
        self._streaming = (step_id, text_getter) if step_id is not None else None

    def streamed(self) -> tuple[int, int, str] | None:
        streaming = self._streaming
        if streaming is None:
            return None
        step_id, text_getter = streaming
        return step_id, self.lease.token, text_getter()

    def lost(self) -> None:
        self.lease_lost.set()
        self.interrupt.abort()

    def cancel(self) -> None:
        self.cancel_requested.set()
        self.interrupt.abort()

    def beat(self) -> bool:
        """One renewal of this lease alone (the keeper renews all of a process's at once): False
        once the lease is gone."""
        return _renew([self])[0] == 0


# The name the engine used while each run had its own heartbeat thread.
Heartbeat = RunBeat


def _keeper_alias() -> str:
    """The lease keeper's connection: its own alias where the process's runs share a pool (a
    worker process driving many runs, engine/executor.py), else the thread's default one."""
    if "leases" in settings.DATABASES and connections.settings[DEFAULT_DB_ALIAS]["OPTIONS"].get("pool"):
        return "leases"
    return DEFAULT_DB_ALIAS


def _renew(beats: list[RunBeat]) -> tuple[int, int]:
    """Extend these leases in one statement and save what their models have streamed:
    (lost, skipped)."""
    using = _keeper_alias()
    found = lease_renew_many(leases=[beat.lease for beat in beats], using=using)
    lost = skipped = 0
    texts = []
    for beat in beats:
        renewal = found.get(str(beat.lease.run_id))
        if renewal is None or renewal.lost:
            beat.lost()
            lost += 1
            continue
        if not renewal.held:
            skipped += 1  # its row was locked by its own commit: extended at the next beat
        if renewal.cancel_requested:
            beat.cancel()
        streamed = beat.streamed()
        if streamed is not None:
            texts.append(streamed)
    steps_streamed_text_save(texts=texts, using=using)
    return lost, skipped


class LeaseKeeper:
    """The process's heartbeat: one thread, one connection of its own (the `leases` alias, outside
    the pool the runs share: a busy pool never delays a renewal), every lease the process holds
    renewed in one statement each WARDEN_HEARTBEAT_SECONDS.

    A run held longer than its slice plus the task timeout is hung (django-q2's SIGALRM guards
    only a process's main thread): its lease is no longer renewed, so it expires, the sweeper
    hands the run to another worker, and the hung thread's writes, if it ever wakes, are fenced."""

    def __init__(self):
        self._beats: dict[int, RunBeat] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def hold(self, lease: Lease) -> RunBeat:
        beat = RunBeat(lease)
        with self._lock:
            self._beats[id(beat)] = beat
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._keep, name="lease-keeper", daemon=True)
                self._thread.start()
        return beat

    def release(self, beat: RunBeat) -> None:
        with self._lock:
            self._beats.pop(id(beat), None)

    def held(self) -> int:
        with self._lock:
            return len(self._beats)

    def _keep(self) -> None:
        next_renewal = time.monotonic() + settings.WARDEN_HEARTBEAT_SECONDS
        while True:
            self._wake.wait(min(settings.WARDEN_CANCEL_POLL_SECONDS, settings.WARDEN_HEARTBEAT_SECONDS))
            with self._lock:
                beats = list(self._beats.values())
            if not beats:
                connections[_keeper_alias()].close()  # nothing held: keep no connection (a test database can be dropped)
                next_renewal = time.monotonic() + settings.WARDEN_HEARTBEAT_SECONDS
                continue
            try:
                if time.monotonic() >= next_renewal:
                    next_renewal = time.monotonic() + settings.WARDEN_HEARTBEAT_SECONDS
                    self._renew_all(beats)
                else:
                    self._look_for_cancels(beats)
            except Exception:  # a dropped connection: try again next time; the leases may still hold
                logger.warning("heartbeat for %d runs failed", len(beats), exc_info=True)
                connections[_keeper_alias()].close()
            finally:
                connection_give_back()

    def _renew_all(self, beats: list[RunBeat]) -> None:
        hung_after = settings.WARDEN_SLICE_SECONDS + settings.Q_CLUSTER["timeout"]
        now = time.monotonic()
        live = []
        for beat in beats:
            if now - beat.held_since > hung_after:
                if not beat.lease_lost.is_set():
                    logger.error("run %s: held %.0f s, past its slice and the task timeout: its lease is left to expire",
                                 beat.lease.run_id, now - beat.held_since)
                    beat.lost()
            elif not beat.lease_lost.is_set():
                live.append(beat)
        if live:
            lost, skipped = _renew(live)
            if lost or skipped:
                logger.info("heartbeat: %d leases renewed, %d lost, %d skipped (locked)",
                            len(live) - lost - skipped, lost, skipped)

    def _look_for_cancels(self, beats: list[RunBeat]) -> None:
        watched = {str(beat.lease.run_id): beat for beat in beats if not beat.cancel_requested.is_set()}
        for run_id in runs_cancel_requested(run_ids=list(watched), using=_keeper_alias()):
            watched[run_id].cancel()


def connection_give_back() -> None:
    """With a connection pool (worker processes), a thread gives its connection back as soon as it
    is done with it — never inside a transaction — and with persistent connections it keeps it."""
    if connection.settings_dict.get("OPTIONS", {}).get("pool") and not connection.in_atomic_block:
        connection.close()


_keeper: LeaseKeeper | None = None
_keeper_lock = threading.Lock()


def lease_keeper() -> LeaseKeeper:
    """This process's keeper (a forked child gets its own: threads do not cross a fork)."""
    global _keeper
    with _keeper_lock:
        if _keeper is None or _keeper._pid != os.getpid():
            _keeper = LeaseKeeper()
        return _keeper
