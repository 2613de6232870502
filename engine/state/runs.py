"""The run row: the one fenced UPDATE behind every change of it, and the named changes of its state.

`run_write` sets a run's counters and budgets and appends its events; it refuses the fields of the
run's state shape (status, phase, wait reason and wait context, lease, cancel request, ending),
which change only through a named change here — `run_transition` (status), `run_phase_enter`
(phase), `run_cancel_request` (the request) — each checking RUN_TRANSITIONS and writing its
`run_status` event, built by `run_status_event` alone.
"""

import functools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from access.policy import why_not_a_decider
from config import rows
from notifications.outbox import notifications_for_events
from runs_app.endpoints import ENDPOINT_OPTION, FALLBACK_ENDPOINT_OPTION, FALLBACK_MODEL_OPTION
from runs_app.events import RunEventType
from runs_app.live import publish_events_on_commit
from runs_app.models import RUNNING_PHASES, Run, RunEvent, RunPhase, RunStatus, Step, WaitReason
from runs_app.transitions import RUN_TRANSITIONS, LeaseLost, check_transition

# The columns of a run's state shape: only the named changes of this module write them.
RUN_STATE_FIELDS = frozenset({
    "status", "phase", "wait_reason", "wait_type", "request_id", "expires_at", "resume_target", "wait_started_at",
    "lease_owner", "lease_expires_at", "lease_token", "cancel_requested_at", "cancel_requested_by",
    "cancel_requested_by_id", "cancel_reason", "finished_at", "outcome",
})

# Columns a transition resets so the row always has the shape its status requires.
_WAIT_CONTEXT_CLEARED = {"wait_type": "", "request_id": "", "expires_at": None, "resume_target": ""}
_LEASE_RELEASED = {"lease_owner": "", "lease_expires_at": None}


def require_transaction(what: str) -> None:
    """Writes that only make sense as part of a larger commit refuse to run outside one."""
    if not connection.in_atomic_block:
        raise RuntimeError(f"{what} must run inside the caller's transaction")


def run_status_event(*, status: str, phase: str = "", wait_reason: str = "", **extra: Any) -> tuple[str, dict]:
    """The `run_status` event of a run now in `status` (docs/EVENTS.md): built here and nowhere else."""
    return RunEventType.RUN_STATUS, {"status": status, "phase": phase, "wait_reason": wait_reason, **extra}


# --- what the lease holder has seen ---------------------------------------------------------------

# The event seq of this process's own last fenced write per run: a checkpoint whose event_seq
# differs was touched by someone else (input queued, cancel requested, a decision), so only
# then does the worker look for those things. Rolled-back writes leave a stale value, which
# only costs one extra look.
_lease_holder_seq: dict[str, int] = {}


def run_touched_by_others(run: Run) -> bool:
    return _lease_holder_seq.get(str(run.id)) != run.event_seq


def run_seen_by_lease_holder(run: Run) -> None:
    """The worker has looked at everything up to the event_seq it loaded."""
    _lease_holder_seq[str(run.id)] = run.event_seq


def run_written_by_lease_holder(*, run_id, event_seq: int, events: int) -> None:
    """The lease holder's write left the run at `event_seq`, `events` of them its own. They are
    all it has seen only if nobody else's events landed since its last write; otherwise forget
    it, so the next safe point looks. (A claim records nothing: input may predate it.)"""
    key = str(run_id)
    if _lease_holder_seq.get(key) == event_seq - events:
        _lease_holder_seq[key] = event_seq
    else:
        _lease_holder_seq.pop(key, None)


def run_lease_holder_forget(*, run_id) -> None:
    """The worker's time slice is over: what it knew ends with it (the next claim, here or in
    another process, records nothing either), and a long-lived worker keeps no entry per run."""
    _lease_holder_seq.pop(str(run_id), None)


# --- the fenced write -----------------------------------------------------------------------------

@dataclass(frozen=True)
class RunWrite:
    """What a fenced run write returned."""

    session_id: Any
    status: str
    event_seq: int
    snapshot_version: int
    cancel_requested_at: Any
    lease_token: int


def run_write(
    *,
    run_id,
    changes: dict[str, Any] | None = None,
    events: Iterable[tuple[str, dict]] = (),
    expect_statuses: Iterable[str] | None = None,
    lease_token: int | None = None,
    raise_on_miss: bool = False,
) -> RunWrite | None:
    """Set `changes` (counters, budgets, usage: never the state shape, which changes through the
    named changes of this module), bump the snapshot version and append `events` with gap-free
    seqs — in the caller's transaction, one conditional UPDATE. None (or LeaseLost) when the
    condition no longer holds; then nothing was written."""
    refused = RUN_STATE_FIELDS.intersection(changes or ())
    if refused:
        raise ValueError(f"run_write does not change {', '.join(sorted(refused))}: use the named change "
                         "(run_transition, run_phase_enter, run_cancel_request)")
    return _run_update(run_id=run_id, changes=changes, events=events, expect_statuses=expect_statuses,
                       lease_token=lease_token, raise_on_miss=raise_on_miss)


def _run_update(
    *,
    run_id,
    changes: dict[str, Any] | None = None,
    events: Iterable[tuple[str, dict]] = (),
    expect_statuses: Iterable[str] | None = None,
    lease_token: int | None = None,
    raise_on_miss: bool = False,
    new_lease_token: bool = False,
) -> RunWrite | None:
    """The one conditional UPDATE behind every run change: sets `changes`, bumps the snapshot
    version, allocates gap-free event seqs and appends `events` — all in the caller's
    transaction, as one statement. The row lock it takes is what fences out concurrent writers."""
    require_transaction("run_write")
    changes = dict(changes or {})
    events = [(RunEventType(kind), payload) for kind, payload in events]  # ValueError for a type not in the contract
    assignments = [f'"{column}" = %s' for column in changes]
    params: list[Any] = list(changes.values())
    if new_lease_token:
        # Ownership changes (claim, revocation) bump the fencing token, so every earlier
        # holder's conditional writes match no row from now on.
        assignments.append('"lease_token" = "lease_token" + 1')
    assignments += [
        '"event_seq" = "event_seq" + %s',
        '"snapshot_version" = "snapshot_version" + 1',
        '"updated_at" = now()',
    ]
    params.append(len(events))
    where = ['"id" = %s']
    params.append(run_id)
    if expect_statuses is not None:
        where.append('"status" = ANY(%s)')
        params.append([str(s) for s in expect_statuses])
    if lease_token is not None:
        where.append('"lease_token" = %s')
        params.append(lease_token)
    sql = (
        f'WITH r AS (UPDATE "runs_app_run" SET {", ".join(assignments)} WHERE {" AND ".join(where)} '
        'RETURNING "session_id", "status", "event_seq", "snapshot_version", "cancel_requested_at", "lease_token")'
    )
    now = timezone.now()
    if events:
        # The events go in the same statement, numbered from the seq the UPDATE allocated.
        sql += (', ev AS (INSERT INTO "runs_app_runevent" ("run_id", "seq", "type", "payload", "created_at") '
                'SELECT %s, r."event_seq" - %s + e.ord, e.ev->>\'type\', e.ev->\'payload\', %s '
                'FROM r, jsonb_array_elements(%s) WITH ORDINALITY AS e(ev, ord))')
        params += [run_id, len(events), now, Jsonb([{"type": kind.value, "payload": payload} for kind, payload in events])]
    with connection.cursor() as cursor:
        cursor.execute(sql + " SELECT * FROM r", params)
        row = cursor.fetchone()
    if row is None:
        if raise_on_miss or lease_token is not None:
            raise LeaseLost(f"run {run_id}: lease token {lease_token} no longer current")
        return None
    written = RunWrite(*row)
    if lease_token is not None:
        run_written_by_lease_holder(run_id=run_id, event_seq=written.event_seq, events=len(events))
    if events:
        first_seq = written.event_seq - len(events) + 1
        records = [
            RunEvent(run_id=run_id, seq=first_seq + i, type=kind.value, payload=payload, created_at=now)
            for i, (kind, payload) in enumerate(events)
        ]
        # The policy decides who is told of an approval (notifications.notices), as it decides who may decide it.
        notifications_for_events(run_id=run_id, session_id=written.session_id, events=records,
                                 decider_refusal=why_not_a_decider)
        publish_events_on_commit(
            session_id=written.session_id,
            run_id=run_id,
            events=[{"seq": r.seq, "type": r.type, "payload": r.payload} for r in records],
        )
    return written


def run_event_append(*, run_id, events: Iterable[tuple[str, dict]], lease_token: int | None = None) -> int:
    """Append events to a run's log (an approval requested, input queued…) and nothing else;
    returns the last event's seq. Its own commit, or part of the caller's."""
    with transaction.atomic():
        written = _run_update(run_id=run_id, events=events, lease_token=lease_token, raise_on_miss=True)
    return written.event_seq


def run_row_lock(*, run_id, skip_locked: bool = False, **conditions: Any) -> Run | None:
    """The run's row, locked for the caller's transaction — FOR NO KEY UPDATE, never FOR UPDATE: a
    commit's deferred foreign-key checks take KEY SHARE on the rows it points at, which FOR UPDATE
    would block while its holder waits for that commit's run row (the deadlock of issue 12;
    docs/ARCHITECTURE.md, "Lock order"). None when no row matches `conditions` (or, with
    `skip_locked`, another transaction holds it)."""
    require_transaction("run_row_lock")
    return Run.objects.select_for_update(no_key=True, skip_locked=skip_locked).filter(pk=run_id, **conditions).first()


# --- the named changes ----------------------------------------------------------------------------

def _shape_for(to_status: str, phase: str, wait_reason: str) -> dict[str, Any]:
    if to_status == RunStatus.QUEUED:
        return {"phase": RunPhase.WAITING_WORKER, "wait_reason": "", **_LEASE_RELEASED, **_WAIT_CONTEXT_CLEARED,
                "wait_started_at": None}
    if to_status == RunStatus.RUNNING:
        if phase not in RUNNING_PHASES:
            raise ValueError(f"a running run needs a working phase, not {phase!r}")
        return {"phase": phase, "wait_reason": "", **_WAIT_CONTEXT_CLEARED}
    if to_status == RunStatus.WAITING:
        if wait_reason not in WaitReason.values:
            raise ValueError(f"a waiting run needs a wait reason, not {wait_reason!r}")
        return {"phase": "", "wait_reason": wait_reason, **_LEASE_RELEASED, "wait_started_at": timezone.now()}
    return {"phase": "", "wait_reason": "", **_LEASE_RELEASED, **_WAIT_CONTEXT_CLEARED, "finished_at": timezone.now(),
            "wait_started_at": None}


def run_transition_values(*, run: Run, to: str, phase: str = "", wait_reason: str = "", event_payload: dict | None = None,
                          **changes: Any) -> tuple[dict[str, Any], tuple[str, dict]]:
    """The columns a move of `run` to `to` sets (the shape its status requires, and `changes`)
    and its `run_status` event, after checking RUN_TRANSITIONS (IllegalTransition otherwise).
    `run_transition` writes them; the one-statement commits (engine/state/fast.py) write the same
    values under the same fence."""
    check_transition(RUN_TRANSITIONS, "run", run.status, to)
    values = {"status": to, **_shape_for(to, phase, wait_reason), **changes}
    extra = dict(event_payload or {})
    if to == RunStatus.FAILED:
        extra.update(error_code=values.get("error_code", ""), error_detail=values.get("error_detail", ""))
    return values, run_status_event(status=to, phase=values["phase"], wait_reason=values["wait_reason"], **extra)


def run_transition(
    *,
    run: Run,
    to: str,
    phase: str = "",
    wait_reason: str = "",
    lease_token: int | None = None,
    event_payload: dict | None = None,
    extra_events: Iterable[tuple[str, dict]] = (),
    events_before: Iterable[tuple[str, dict]] = (),
    new_lease_token: bool = False,
    **changes: Any,
) -> bool:
    """Move `run` to status `to` if it is still in the status we read it in (and, for a
    worker, still under our lease). Raises IllegalTransition for a move the table forbids;
    returns False if someone else changed the run first. Writes the status event with it, after
    `events_before` (what led to the change, e.g. the step that gave the final answer) and
    before `extra_events`."""
    values, status_event = run_transition_values(run=run, to=to, phase=phase, wait_reason=wait_reason,
                                                 event_payload=event_payload, **changes)
    with transaction.atomic(savepoint=False):  # part of the caller's commit, if there is one
        written = _run_update(
            run_id=run.id,
            changes=values,
            events=[*events_before, status_event, *extra_events],
            expect_statuses=[run.status],
            lease_token=lease_token,
            new_lease_token=new_lease_token,
        )
    if written is None:
        return False
    for field, value in values.items():
        setattr(run, field, value)
    run.lease_token = written.lease_token
    run.event_seq = written.event_seq
    run.snapshot_version = written.snapshot_version
    return True


def run_phase_values(*, run: Run, phase: str, announce_unchanged: bool = False) -> tuple[dict[str, Any], list[tuple[str, dict]]]:
    """The column and the event of a running run entering `phase`: no event when it is in that
    phase already (a phase change is a lifecycle event, SPEC §3; staying in one is not) unless
    `announce_unchanged` (a model step opened always says the run is calling its model)."""
    check_transition(RUN_TRANSITIONS, "run", run.status, RunStatus.RUNNING)
    if phase not in RUNNING_PHASES:
        raise ValueError(f"a running run needs a working phase, not {phase!r}")
    if run.phase == phase and not announce_unchanged:
        return {}, []
    return {"phase": phase}, [run_status_event(status=RunStatus.RUNNING, phase=phase)]


def run_phase_enter(*, run: Run, phase: str, lease_token: int, events_before: Iterable[tuple[str, dict]] = (),
                    events_after: Iterable[tuple[str, dict]] = (), changes: dict[str, Any] | None = None,
                    announce_unchanged: bool = False) -> RunWrite:
    """The lease holder moves its running run into `phase` (with its `run_status` event when the
    phase changes), with the events and counters of the step boundary that leads there."""
    values, phase_events = run_phase_values(run=run, phase=phase, announce_unchanged=announce_unchanged)
    written = _run_update(run_id=run.id, changes={**(changes or {}), **values},
                          events=[*events_before, *phase_events, *events_after], lease_token=lease_token)
    run.phase = phase
    run.event_seq, run.snapshot_version = written.event_seq, written.snapshot_version
    return written


def run_cancel_request(*, run: Run, by_id: int | None, by_username: str | None, reason: str,
                       lease_token: int | None = None, event_extra: dict | None = None) -> bool:
    """Record that `run` is to be cancelled (SPEC §9: requested is not done — the status does not
    change here): when, by whom, why, and the `cancel_requested` event. False when a request is
    on record already (the first one stands)."""
    if run.cancel_requested_at is not None:
        return False
    now = timezone.now()
    written = _run_update(
        run_id=run.id,
        changes={"cancel_requested_at": now, "cancel_requested_by_id": by_id, "cancel_reason": reason[:300]},
        events=[(RunEventType.CANCEL_REQUESTED, {"by": by_username, "reason": reason, **(event_extra or {})})],
        lease_token=lease_token, raise_on_miss=True,
    )
    run.cancel_requested_at, run.cancel_requested_by_id, run.cancel_reason = now, by_id, reason[:300]
    run.event_seq, run.snapshot_version = written.event_seq, written.snapshot_version
    return True


def run_ending_outcome(values: dict, payload: dict, *, outcome: str) -> None:
    """Beside the status, what the run's writes came to (a refused refund is `completed`): stored
    with the terminal status and told in its event. Both ways a run ends (engine.actions.runs.run_end
    and the one-statement answer of engine/state/fast.py) set it here."""
    values["outcome"] = payload["outcome"] = outcome


def run_create(
    *,
    session,
    created_by=None,
    provider: str | None = None,
    provider_options: dict | None = None,
    budgets: dict | None = None,
    budgets_set_by=None,
    agent_version=None,
    retry_of=None,
    forked_from=None,
) -> Run:
    """A queued run for `session`, with its first event. The caller owns the transaction and
    enqueues after commit. The database's partial unique index refuses a second active run in the
    same session. `budgets` (max_model_calls, max_tokens, deadline_seconds or an absolute
    deadline) override the defaults — the agent version's, else the deployment's; `budgets_set_by`
    is who asked for them (callers check the caps first). With `agent_version` the run records it
    and takes its provider, model and provider options (a request's own options on top)."""
    if agent_version is not None:
        budgets = {**(agent_version.budgets or {}), **(budgets or {})}
        provider = provider or agent_version.provider
        provider_options = {**(agent_version.provider_options or {}),
                            **({"model": agent_version.model} if agent_version.model else {}), **(provider_options or {})}
    # Which model endpoints a run calls — its own and its fallback — is its agent version's alone,
    # never a request's option.
    routed = (ENDPOINT_OPTION, FALLBACK_ENDPOINT_OPTION, FALLBACK_MODEL_OPTION)
    provider_options = {k: v for k, v in (provider_options or {}).items() if k not in routed}
    if agent_version is not None and agent_version.endpoint_id is not None:
        provider_options[ENDPOINT_OPTION] = agent_version.endpoint_id
        if agent_version.fallback_endpoint_id is not None:
            provider_options[FALLBACK_ENDPOINT_OPTION] = agent_version.fallback_endpoint_id
            provider_options[FALLBACK_MODEL_OPTION] = agent_version.fallback_model
    budgets = budgets or {}
    now = timezone.now()
    deadline = budgets.get("deadline")
    if budgets.get("deadline_seconds") is not None:
        deadline = now + timedelta(seconds=budgets["deadline_seconds"])
    run = Run.objects.create(
        session=session,
        created_by=created_by,
        provider=provider or settings.WARDEN_MODEL_PROVIDER,
        provider_options=provider_options or {},
        max_model_calls=budgets.get("max_model_calls", settings.WARDEN_MAX_MODEL_CALLS),
        max_tokens=budgets.get("max_tokens", settings.WARDEN_MAX_TOKENS),
        deadline=deadline or now + timedelta(seconds=settings.WARDEN_RUN_DEADLINE_SECONDS),
        budgets_set_by=budgets_set_by,
        agent_version=agent_version,
        retry_of=retry_of,
        forked_from=forked_from,
    )
    written = _run_update(run_id=run.id, events=[run_status_event(status=RunStatus.QUEUED, phase=RunPhase.WAITING_WORKER)])
    run.event_seq, run.snapshot_version = written.event_seq, written.snapshot_version
    return run


# --- reading the checkpoint -----------------------------------------------------------------------

@functools.cache
def _run_and_latest_step_sql() -> str:
    """The run and its latest step, in one statement of fixed columns (config.rows: no ORM compiling)."""
    return (
        f'SELECT {rows.columns(Run, "r")}, {rows.columns(Step, "s")} FROM "runs_app_run" r '
        'LEFT JOIN LATERAL (SELECT * FROM "runs_app_step" WHERE "run_id" = r."id" ORDER BY "index" DESC LIMIT 1) s '
        'ON TRUE WHERE r."id" = %s'
    )


def run_and_latest_step(*, run_id) -> tuple[Run, Step | None]:
    """The run and its latest step (what a worker resumes from), in one round trip."""
    with connection.cursor() as cursor:
        cursor.execute(_run_and_latest_step_sql(), [run_id])
        row = cursor.fetchone()
    if row is None:
        raise Run.DoesNotExist(f"run {run_id}")
    step_offset = rows.width(Run)
    return rows.instance(Run, row), (rows.instance(Step, row, step_offset) if row[step_offset] is not None else None)
