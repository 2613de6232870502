"""Single-app writes about runs and their steps. `run_write` is the one conditional UPDATE of a
run row (the lease fence); `run_transition` and `step_transition` are the one write path of a
run's and a step's status (STYLE.md: one write path per status). Changes that span apps
(ending a run, resuming one, cancelling) are the orchestration layer's (engine/actions/)."""

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone
from psycopg.types.json import Jsonb

from runs_app.events import RunEventType
from runs_app.live import publish_events_on_commit
from runs_app.notifications import notifications_for_events
from runs_app.models import RUNNING_PHASES, Run, RunEvent, RunPhase, RunStatus, Step, StepStatus, WaitReason
from runs_app.transitions import RUN_TRANSITIONS, STEP_TRANSITIONS, LeaseLost, check_transition


def require_transaction(what: str) -> None:
    """Writes that only make sense as part of a larger commit refuse to run outside one."""
    if not connection.in_atomic_block:
        raise RuntimeError(f"{what} must run inside the caller's transaction")


# Columns a transition resets so the row always has the shape its status requires.
_WAIT_CONTEXT_CLEARED = {"wait_type": "", "request_id": "", "expires_at": None, "resume_target": ""}
_LEASE_RELEASED = {"lease_owner": "", "lease_expires_at": None}


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
    new_lease_token: bool = False,
) -> RunWrite | None:
    """The one conditional UPDATE behind every run change: sets `changes`, bumps the snapshot
    version, allocates gap-free event seqs and appends `events` — all in the caller's
    transaction. Returns None (or raises LeaseLost) when the condition no longer holds; then
    nothing was written. The row lock it takes is what fences out concurrent writers."""
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
        notifications_for_events(run_id=run_id, session_id=written.session_id, events=records)
        publish_events_on_commit(
            session_id=written.session_id,
            run_id=run_id,
            events=[{"seq": r.seq, "type": r.type, "payload": r.payload} for r in records],
        )
    return written


def run_event_append(*, run_id, kind: str, payload: dict, lease_token: int | None = None) -> int:
    """Append one event to a run's log (e.g. approval requested, input queued)."""
    with transaction.atomic():
        written = run_write(run_id=run_id, events=[(kind, payload)], lease_token=lease_token, raise_on_miss=True)
    return written.event_seq


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
    values, payload = run_transition_values(run=run, to=to, phase=phase, wait_reason=wait_reason,
                                            event_payload=event_payload, **changes)
    with transaction.atomic(savepoint=False):  # part of the caller's commit, if there is one
        written = run_write(
            run_id=run.id,
            changes=values,
            events=[*events_before, (RunEventType.RUN_STATUS, payload), *extra_events],
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


def run_transition_values(*, run: Run, to: str, phase: str = "", wait_reason: str = "", event_payload: dict | None = None,
                          **changes: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The columns a move of `run` to `to` sets (the shape its status requires, and `changes`)
    and its `run_status` event's payload, after checking RUN_TRANSITIONS (IllegalTransition
    otherwise). `run_transition` writes them; the engine's one-statement step commits
    (engine/step_commit.py) write the same values under the same fence."""
    check_transition(RUN_TRANSITIONS, "run", run.status, to)
    values = {"status": to, **_shape_for(to, phase, wait_reason), **changes}
    payload = {"status": to, "phase": values["phase"], "wait_reason": values["wait_reason"], **(event_payload or {})}
    if to == RunStatus.FAILED:
        payload.update(error_code=values.get("error_code", ""), error_detail=values.get("error_detail", ""))
    return values, payload


@dataclass(frozen=True)
class BudgetOverCap:
    """One requested budget above its configured cap."""

    field: str  # as requested: max_model_calls, max_tokens or deadline_seconds
    requested: int
    cap: int
    setting: str  # the setting (environment variable) that holds the cap


class RunBudgetsOverCap(Exception):
    code = "budget_over_cap"

    def __init__(self, over: list[BudgetOverCap]):
        self.over = over
        self.message = "; ".join(
            f"budgets.{o.field} may be at most {o.cap} (the cap {o.setting}), not {o.requested}" for o in over
        ) + ". Going above a cap needs the runs_app.exceed_budget_caps permission."
        super().__init__(self.message)


def run_budgets_over_caps(*, budgets: dict[str, Any], agent_version=None) -> list[BudgetOverCap]:
    """Which of a request's budgets (max_model_calls, max_tokens, deadline_seconds — or an
    absolute `deadline`) exceed the deployment's caps, or the agent version's own maxima (its
    `budget_limits`) where those are lower; empty when none does."""
    requested = {key: budgets.get(key) for key in ("max_model_calls", "max_tokens", "deadline_seconds")}
    if requested["deadline_seconds"] is None and budgets.get("deadline") is not None:
        requested["deadline_seconds"] = int((budgets["deadline"] - timezone.now()).total_seconds())
    caps = {
        "max_model_calls": (settings.WARDEN_MODEL_CALLS_CAP, "WARDEN_MODEL_CALLS_CAP"),
        "max_tokens": (settings.WARDEN_TOKENS_CAP, "WARDEN_TOKENS_CAP"),
        "deadline_seconds": (settings.WARDEN_DEADLINE_CAP_SECONDS, "WARDEN_DEADLINE_CAP_SECONDS"),
    }
    for field, limit in ((agent_version.budget_limits or {}) if agent_version is not None else {}).items():
        if field in caps and limit < caps[field][0]:
            caps[field] = (limit, f"the budget_limits of agent {agent_version.name} v{agent_version.number}")
    return [
        BudgetOverCap(field=field, requested=value, cap=caps[field][0], setting=caps[field][1])
        for field, value in requested.items()
        if value is not None and value > caps[field][0]
    ]


def run_create(
    *,
    session,
    created_by=None,
    provider: str | None = None,
    provider_options: dict | None = None,
    budgets: dict | None = None,
    budgets_set_by=None,
    agent_version=None,
) -> Run:
    """A queued run for `session`. The caller owns the transaction and enqueues after commit.
    The database's partial unique index refuses a second active run in the same session.
    `budgets` (max_model_calls, max_tokens, deadline_seconds or an absolute deadline) override
    the defaults — the agent version's, else the deployment's; `budgets_set_by` is who asked for
    them (callers check the caps first). With `agent_version` the run records it and takes its
    provider, model and provider options (a request's own options on top)."""
    if agent_version is not None:
        budgets = {**(agent_version.budgets or {}), **(budgets or {})}
        provider = provider or agent_version.provider
        provider_options = {**(agent_version.provider_options or {}),
                            **({"model": agent_version.model} if agent_version.model else {}), **(provider_options or {})}
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
    )
    run_write(run_id=run.id, events=[(RunEventType.RUN_STATUS, {"status": RunStatus.QUEUED, "phase": RunPhase.WAITING_WORKER, "wait_reason": ""})])
    run.refresh_from_db(fields=["event_seq", "snapshot_version"])
    return run


def step_create(*, run_id, index: int, kind: str, lease_token: int) -> Step:
    """A new step, `running` from the start (its model call or tool batch has begun). The
    caller's transaction also carries the run write that counts it (step_count)."""
    require_transaction("step_create")
    return Step.objects.create(run_id=run_id, index=index, kind=kind, status=StepStatus.RUNNING, lease_token=lease_token)


def step_transition(*, step: Step, to: str, lease_token: int | None = None, **changes: Any) -> bool:
    """Move `step` from the status we read to `to`: one conditional UPDATE, fenced (with
    `lease_token`) by the run's lease. False when someone else moved the step first;
    IllegalTransition for a move STEP_TRANSITIONS forbids; LeaseLost when the lease is gone.
    The caller's transaction carries the event (and its run_write re-checks the fence under
    the run row's lock, so a revocation committed meanwhile rolls everything back)."""
    require_transaction("step_transition")
    values = step_transition_values(step=step, to=to, **changes)
    if not lease_fenced_update(Step.objects.filter(pk=step.pk, status=step.status), run_id=step.run_id,
                               lease_token=lease_token, values=values):
        return False
    for field, value in values.items():
        setattr(step, field, value)
    return True


def step_transition_values(*, step: Step, to: str, **changes: Any) -> dict[str, Any]:
    """The columns a move of `step` to `to` sets, after checking STEP_TRANSITIONS (IllegalTransition
    otherwise). `step_transition` writes them; the engine's one-statement step commits
    (engine/step_commit.py) write the same values under the same fence, composed into one statement."""
    check_transition(STEP_TRANSITIONS, "step", step.status, to)
    values: dict[str, Any] = {"status": to, **changes}
    if to != StepStatus.RUNNING:
        values.setdefault("finished_at", timezone.now())
    return values


def lease_fenced_update(rows: QuerySet, *, run_id, lease_token: int | None, values: dict[str, Any]) -> bool:
    """UPDATE `rows` — one row of a run's (a step, a tool call), filtered by the status it was read
    in — only while `lease_token`, when given, is still the run's. False when the row had moved
    on; LeaseLost when the lease is gone (then nothing was written)."""
    if lease_token is not None:
        rows = rows.filter(Exists(Run.objects.filter(pk=OuterRef("run_id"), lease_token=lease_token)))
    if rows.update(**values):
        return True
    if lease_token is not None and not Run.objects.filter(pk=run_id, lease_token=lease_token).exists():
        raise LeaseLost(f"run {run_id}: lease token {lease_token} no longer current")
    return False
