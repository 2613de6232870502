"""Leases with fencing tokens (SPEC §5).

A worker claims a queued run with a locking read that skips rows others hold, bumps the
token and sets an expiry; a heartbeat thread extends the expiry while it works. Every
later write is conditional on the token (runs_app.services.run_write), so a worker that
stalls past its lease and wakes up finds its writes refused.
"""

import functools
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from config import rows
from runs_app import liveness
from runs_app.events import RunEventType
from runs_app.models import Run, RunPhase, RunStatus
from runs_app.services import run_seen_by_lease_holder, run_write

logger = logging.getLogger("warden.lease")


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_expiry():
    return timezone.now() + timedelta(seconds=settings.WARDEN_LEASE_SECONDS)


@dataclass
class Lease:
    run_id: str
    owner: str
    token: int
    session_id: str = ""
    # The run as the claim left it (read under the claim's row lock, with the claim's own
    # changes): the worker's first checkpoint, without reading it again.
    run: Run | None = None


@functools.cache
def _claimable() -> str:
    return (
        f'SELECT {rows.columns(Run, "r")}, EXISTS (SELECT 1 FROM "sessions_app_pendinginput" p '
        'WHERE p."session_id" = r."session_id" AND p."consumed_at" IS NULL) '
        'FROM "runs_app_run" r WHERE r."id" = %s AND r."status" = %s FOR NO KEY UPDATE OF r SKIP LOCKED'
    )


def run_claim(*, run_id, owner: str) -> Lease | None:
    """Take a queued run, or None when it is not claimable (not queued, or another worker is
    claiming it right now). The row lock is taken with SKIP LOCKED, so two workers racing for
    one run never wait on each other and exactly one wins."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_claimable(), [run_id, RunStatus.QUEUED])
            row = cursor.fetchone()
        if row is None:
            return None
        run, input_waiting = rows.instance(Run, row), row[-1]
        now = timezone.now()
        # Queue pickup latency: since the run was last queued (or re-announced by the sweeper).
        liveness.observe("queue_pickup_seconds", max(0.0, (now - run.updated_at).total_seconds()))
        changes = {
            "status": RunStatus.RUNNING,
            "phase": RunPhase.PREPARING_CONTEXT,
            "lease_owner": owner,
            "lease_expires_at": lease_expiry(),
            # The first claim starts the run's clock (read under the row lock just taken).
            **({"started_at": now} if run.started_at is None else {}),
        }
        written = run_write(
            run_id=run_id,
            changes=changes,
            events=[
                (
                    RunEventType.RUN_STATUS,
                    {
                        "status": RunStatus.RUNNING,
                        "phase": RunPhase.PREPARING_CONTEXT,
                        "wait_reason": "",
                        "lease_owner": owner,
                        "lease_token": run.lease_token + 1,
                        "previous_lease_token": run.lease_token,
                    },
                )
            ],
            expect_statuses=[RunStatus.QUEUED],
            new_lease_token=True,
        )
    for name, value in changes.items():
        setattr(run, name, value)
    run.lease_token, run.event_seq, run.snapshot_version = written.lease_token, written.event_seq, written.snapshot_version
    run.updated_at = now
    if not input_waiting:
        # No input was waiting under the claim's lock: the worker has seen all there is up to
        # this event seq (input posted since writes an event of its own, after it).
        run_seen_by_lease_holder(run)
    return Lease(run_id=str(run_id), owner=owner, token=written.lease_token, session_id=str(written.session_id), run=run)


class Heartbeat(threading.Thread):
    """Extends the lease every WARDEN_HEARTBEAT_SECONDS while the worker works, and reports
    what it learns: the lease is gone, or a cancel was requested."""

    def __init__(self, lease: Lease):
        super().__init__(name=f"heartbeat-{lease.run_id}", daemon=True)
        self.lease = lease
        self.lease_lost = threading.Event()
        self.cancel_requested = threading.Event()
        self._stop = threading.Event()
        self._streaming: tuple[int, object] | None = None

    def streaming(self, *, step_id: int | None, text_getter) -> None:
        """While a model streams, each beat also saves the text so far on the step."""
        self._streaming = (step_id, text_getter) if step_id is not None else None

    def run(self) -> None:
        try:
            while not self._stop.wait(settings.WARDEN_HEARTBEAT_SECONDS):
                if not self.beat():
                    break
        finally:
            connection.close()

    def beat(self) -> bool:
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    'UPDATE "runs_app_run" SET "lease_expires_at" = %s '
                    'WHERE "id" = %s AND "lease_token" = %s AND "status" = %s RETURNING "cancel_requested_at"',
                    [lease_expiry(), self.lease.run_id, self.lease.token, RunStatus.RUNNING],
                )
                row = cursor.fetchone()
        except Exception:  # a dropped connection: try again next beat; the lease may still hold
            logger.warning("heartbeat for run %s failed", self.lease.run_id, exc_info=True)
            connection.close()
            return True
        if row is None:
            self.lease_lost.set()
            return False
        if row[0] is not None:
            self.cancel_requested.set()
        streaming = self._streaming
        if streaming is not None:
            step_id, text_getter = streaming
            with connection.cursor() as cursor:
                cursor.execute(
                    'UPDATE "runs_app_step" SET "streamed_text" = %s '
                    'WHERE "id" = %s AND "lease_token" = %s AND "status" = \'running\'',
                    [text_getter(), step_id, self.lease.token],
                )
        return True

    def stop(self) -> None:
        self._stop.set()
