"""Leases with fencing tokens (SPEC §5): the claim of a queued run, the heartbeat's renewal, and the
sweeper's revocation of an expired lease. Ownership changes bump the token, so every earlier
holder's conditional writes match no row from then on."""

import functools
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
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
        if settings.WARDEN_CUSTOMER_MAX_RUNNING and _owner_at_limit(run):
            liveness.count("claims:customer-limit")
            return None  # stays queued; asked for again when one of the owner's runs stops (engine/executor.py)
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


@dataclass(frozen=True)
class Renewal:
    """What one lease's renewal found: `held` (extended), `lost` (the token moved on or the run is
    no longer running: its holder must stop writing), or neither (its row was locked by a commit
    in progress, so it was skipped this time and is extended at the next beat)."""
    held: bool
    lost: bool
    cancel_requested: bool


_RENEW_MANY = (
    'WITH "h" AS (SELECT * FROM unnest(%s::uuid[], %s::bigint[]) AS "h"("id", "token")), '
    # SKIP LOCKED: one run's long commit never holds up the renewal of every other lease.
    '"locked" AS (SELECT r."id" FROM "runs_app_run" r JOIN "h" ON r."id" = "h"."id" AND r."lease_token" = "h"."token" '
    'AND r."status" = %s ORDER BY r."id" FOR NO KEY UPDATE OF r SKIP LOCKED), '
    '"renewed" AS (UPDATE "runs_app_run" r SET "lease_expires_at" = %s FROM "locked" WHERE r."id" = "locked"."id" '
    'RETURNING r."id", r."cancel_requested_at" IS NOT NULL AS "cancel") '
    'SELECT "h"."id", "renewed"."id" IS NOT NULL, COALESCE("renewed"."cancel", FALSE), '
    'EXISTS (SELECT 1 FROM "runs_app_run" r WHERE r."id" = "h"."id" AND r."lease_token" = "h"."token" AND r."status" = %s) '
    'FROM "h" LEFT JOIN "renewed" ON "renewed"."id" = "h"."id"'
)


# The pg_advisory_xact_lock(space, key) space of the claims of one customer's runs (steps.py has 26 and 27).
CUSTOMER_CLAIM_LOCK_SPACE = 29


def _owner_at_limit(run: Run) -> bool:
    """Does the run's customer (its session's owner) already have WARDEN_CUSTOMER_MAX_RUNNING runs
    running? Their claims take turns (an advisory lock until the claim commits), so two workers
    never both see room for one more."""
    with connection.cursor() as cursor:
        cursor.execute('SELECT "owner_id" FROM "sessions_app_session" WHERE "id" = %s', [run.session_id])
        owner_id = cursor.fetchone()[0]
        cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [CUSTOMER_CLAIM_LOCK_SPACE, str(owner_id)])
        cursor.execute('SELECT count(*) FROM "runs_app_run" r JOIN "sessions_app_session" s ON s."id" = r."session_id" '
                       'WHERE s."owner_id" = %s AND r."status" = %s', [owner_id, RunStatus.RUNNING])
        return cursor.fetchone()[0] >= settings.WARDEN_CUSTOMER_MAX_RUNNING


def lease_renew_many(*, leases: list[Lease], using: str = DEFAULT_DB_ALIAS) -> dict[str, Renewal]:
    """Extend every lease a worker process holds, in one statement (one heartbeat per process,
    not one per run): by run id, what each renewal found."""
    if not leases:
        return {}
    with connections[using].cursor() as cursor:
        cursor.execute(_RENEW_MANY, [[lease.run_id for lease in leases], [lease.token for lease in leases],
                                     RunStatus.RUNNING, lease_expiry(), RunStatus.RUNNING])
        found = cursor.fetchall()
    return {str(run_id): Renewal(held=held, lost=not held and not still, cancel_requested=cancel)
            for run_id, held, cancel, still in found}


def lease_renew(*, lease: Lease) -> tuple[bool, bool]:
    """Extend one lease: (still held, a cancel was requested). A row locked by a commit in
    progress counts as held: its holder is alive and writing."""
    renewal = lease_renew_many(leases=[lease])[str(lease.run_id)]
    return not renewal.lost, renewal.cancel_requested


def runs_cancel_requested(*, run_ids: list[str], using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Which of these runs have a cancel requested (the heartbeat's frequent look, cheaper than a
    renewal: a cancelled run's open model stream is closed at once, not at the next beat)."""
    if not run_ids:
        return []
    with connections[using].cursor() as cursor:
        cursor.execute('SELECT "id" FROM "runs_app_run" WHERE "id" = ANY(%s::uuid[]) AND "cancel_requested_at" IS NOT NULL '
                       'AND "status" = %s', [run_ids, RunStatus.RUNNING])
        return [str(row[0]) for row in cursor.fetchall()]


def steps_streamed_text_save(*, texts: list[tuple[int, int, str]], using: str = DEFAULT_DB_ALIAS) -> None:
    """What the models have streamed so far on their running steps, as (step id, lease token,
    text), in one statement (a console joining mid-stream shows it)."""
    if not texts:
        return
    ids, tokens, values = zip(*texts)
    with connections[using].cursor() as cursor:
        cursor.execute(
            'UPDATE "runs_app_step" s SET "streamed_text" = t."text" '
            'FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS t("id", "token", "text") '
            'WHERE s."id" = t."id" AND s."lease_token" = t."token" AND s."status" = \'running\'',
            [list(ids), list(tokens), list(values)],
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
