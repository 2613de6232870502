"""Leases with fencing tokens (SPEC §5): the claim of a queued run, the heartbeat's renewal, and the
sweeper's revocation of an expired lease. Ownership changes bump the token, so every earlier
holder's conditional writes match no row from then on."""

import functools
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from config import rows
from engine.state.runs import _run_update, run_row_lock, run_seen_by_lease_holder, run_transition, run_transition_values
from operations import liveness
from runs_app.models import Run, RunPhase, RunStatus


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
    one run never wait on each other and exactly one wins. The claim is the run's
    queued → running transition (RUN_TRANSITIONS), with a new fencing token."""
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
        changes, status_event = run_transition_values(
            run=run, to=RunStatus.RUNNING, phase=RunPhase.PREPARING_CONTEXT,
            event_payload={"lease_owner": owner, "lease_token": run.lease_token + 1,
                           "previous_lease_token": run.lease_token},
            lease_owner=owner, lease_expires_at=lease_expiry(),
            # The first claim starts the run's clock (read under the row lock just taken).
            **({"started_at": now} if run.started_at is None else {}),
        )
        written = _run_update(run_id=run_id, changes=changes, events=[status_event], expect_statuses=[RunStatus.QUEUED],
                              new_lease_token=True)
    for name, value in changes.items():
        setattr(run, name, value)
    run.lease_token, run.event_seq, run.snapshot_version = written.lease_token, written.event_seq, written.snapshot_version
    run.updated_at = now
    if not input_waiting:
        # No input was waiting under the claim's lock: the worker has seen all there is up to
        # this event seq (input posted since writes an event of its own, after it).
        run_seen_by_lease_holder(run)
    return Lease(run_id=str(run_id), owner=owner, token=written.lease_token, session_id=str(written.session_id), run=run)


def lease_renew(*, lease: Lease) -> tuple[bool, bool]:
    """Extend the lease while its holder works: (still held, a cancel was requested)."""
    with connection.cursor() as cursor:
        cursor.execute(
            'UPDATE "runs_app_run" SET "lease_expires_at" = %s '
            'WHERE "id" = %s AND "lease_token" = %s AND "status" = %s RETURNING "cancel_requested_at"',
            [lease_expiry(), lease.run_id, lease.token, RunStatus.RUNNING],
        )
        row = cursor.fetchone()
    return row is not None, row is not None and row[0] is not None


def step_streamed_text_save(*, step_id: int, lease_token: int, text: str) -> None:
    """What a model has streamed so far, on its running step (a console joining mid-stream shows it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            'UPDATE "runs_app_step" SET "streamed_text" = %s '
            'WHERE "id" = %s AND "lease_token" = %s AND "status" = \'running\'',
            [text, step_id, lease_token],
        )


def lease_revoke_expired(*, run_id) -> Run | None:
    """The sweeper takes back a run whose lease expired: it goes back to the queue with a new
    token (the stalled holder's writes now match nothing). None when it was not (or no longer)
    expired, or another sweeper holds it."""
    with transaction.atomic():
        run = run_row_lock(run_id=run_id, skip_locked=True, status=RunStatus.RUNNING, lease_expires_at__lt=timezone.now())
        if run is None:
            return None
        # Fenced on the token we saw, and bumped.
        if not run_transition(
            run=run, to=RunStatus.QUEUED, lease_token=run.lease_token, new_lease_token=True,
            event_payload={"reason": "lease expired", "previous_owner": run.lease_owner,
                           "previous_lease_token": run.lease_token},
        ):
            return None
    return run
