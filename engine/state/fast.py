"""The step boundaries every run crosses over and over, each committed as ONE statement.

A read tool call finishing (its outcome, its tool message, the tools step closed and the next
model step opened), a model turn that asks for reads (the model step closed, the assistant
message, the tools step and its calls) and a model turn that answers (the model step closed, the
assistant message, the run completed) are the engine's hot path: a run of K reads crosses the
first two K times each, and ends with the third. The general code (tool_exec._finish,
model_step._commit_turn, engine.actions.runs.run_end) writes them through the ORM in a
transaction of some eight statements; here the same rows and the same events go in one statement
of data-modifying CTEs, which PostgreSQL runs as one transaction — one round trip and one commit
per durable step (issue 16). The rows travel as one JSON document (`%(doc)s`), unpacked by the
server: adapting a dozen arrays element by element cost the worker more than the statement.
They are the second implementation of this module's named changes — a run entering a phase, a
step or tool call moving on, a run completing — taking every value from the same functions
(`run_phase_values`, `step_transition_values`, `tool_call_transition_values`,
`run_transition_values`), and tests/engine/test_step_commit.py proves the rows equal.

The fence is unchanged: the session row is locked first (the order every writer takes), the run
row's UPDATE is conditional on the lease token, and every other part is conditional on that
UPDATE having matched. It is also conditional on the run's `snapshot_version` being the one this
worker last wrote: then nobody else touched the run meanwhile (no input queued, no cancel asked),
which is what lets the worker go on from the checkpoint it holds in memory instead of reading it
again (what it returns becomes `Checkpoint.carried`). Each status change must match exactly the
rows it expects; the statement ends in
`warden_fence_check`, which raises when anything did not match, so the statement then wrote
nothing at all. The caller falls back to the general path, which re-checks everything (and
raises LeaseLost if the lease is gone).
"""

import copy
import functools
import logging
from dataclasses import dataclass, field

from django.db import DatabaseError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone
from psycopg import Cursor
from psycopg.types.json import Jsonb

from config.rows import insert_list
from engine.context import CachedContext, message_cost, message_to_openai, seq_ranges
from engine.state.leases import Lease
from engine.state.runs import run_ending_outcome, run_phase_values, run_transition_values, run_written_by_lease_holder
from engine.state.steps import step_transition_values, tool_call_transition_values
from notifications.outbox import notification_kind
from runs_app.events import RunEventType
from runs_app.live import publish_events_on_commit
from runs_app.models import Run, RunOutcome, RunPhase, RunStatus, Step, StepKind, StepStatus
from sessions_app.models import Message
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect
from tools_app.services import tool_call_event, tool_call_message

logger = logging.getLogger("warden.engine")

FENCE_SQLSTATE = "WF001"


class _Missed(Exception):
    """The statement's fence or a status check did not match: nothing was written."""


@dataclass
class Carried:
    """The checkpoint a one-statement commit leads to, known without reading it again (the run's
    snapshot showed nobody else wrote meanwhile): the worker goes on from it."""

    latest_step: Step
    tools_step: Step | None = None
    open_tool_calls: list[ToolCall] = field(default_factory=list)
    context: CachedContext | None = None


class _PreparedCursor(CursorWrapper):
    """A server-side-binding cursor whose statements are prepared (Django turns psycopg's
    automatic preparing off): planning these statements costs the server more than running
    them. Wrapped like Django's own cursors, so execute wrappers and error translation apply."""

    def _execute(self, sql, params, *ignored_wrapper_args):
        self.db.validate_no_broken_transaction()
        with self.db.wrap_database_errors:
            return self.cursor.execute(sql, params, prepare=True)


def _cursor() -> CursorWrapper:
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        # psycopg prepares nothing at all while the threshold is None (Django's setting); a
        # threshold no query reaches keeps automatic preparing off and lets `prepare=True` work.
        raw.prepare_threshold = 2**31 - 1
    return _PreparedCursor(Cursor(raw), connection)


def _execute(sql: str, params: dict) -> tuple:
    try:
        with _cursor() as cursor:
            if connection.in_atomic_block:
                with transaction.atomic():  # a savepoint: a miss leaves the caller's transaction usable
                    cursor.execute(sql, params)
                    return cursor.fetchone()
            cursor.execute(sql, params)
            return cursor.fetchone()
    except DatabaseError as error:
        if getattr(error.__cause__, "sqlstate", None) == FENCE_SQLSTATE:
            raise _Missed(str(error.__cause__)) from error
        raise


def _events(kinds_payloads: list[tuple[str, dict]], *, notifying: str | None = None) -> list[dict]:
    """The events for the document. A notification event goes the general way (the outbox),
    but for the kind `notifying`, which the statement takes only while no endpoint subscribes
    to it (`_NOBODY_NOTIFIED`)."""
    events = [{"type": RunEventType(kind).value, "payload": payload} for kind, payload in kinds_payloads]
    if any(notification_kind(e["type"], e["payload"]) not in (None, notifying) for e in events):
        raise _Missed("a notification event goes the general way (the outbox)")
    return events


def _message_rows(messages: list[Message]) -> list[dict]:
    return [{"role": m.role, "content": m.content, "tool_calls": m.tool_calls, "tool_call_id": m.tool_call_id,
             "tool_name": m.tool_name, "step_id": m.step_id} for m in messages]


# The session row first (every writer's order), then the run row under the fence; the rest only
# when the run's UPDATE matched. `doc` holds the rows: {"messages": [...], "events": [...], ...}.
# A commit that adds nothing to the history leaves the session row alone (`_RUN` without `se`).
_SESSION = """
WITH se AS (
    UPDATE "sessions_app_session" SET "message_seq" = "message_seq" + %(m_count)s, "updated_at" = %(now)s
    WHERE "id" = %(session)s RETURNING "message_seq"
), """

_RUN = """r AS (
    UPDATE "runs_app_run" SET {run_set}, "event_seq" = "event_seq" + %(e_count)s,
        "snapshot_version" = "snapshot_version" + 1, "updated_at" = %(now)s
    WHERE "id" = %(run)s AND "lease_token" = %(token)s AND "snapshot_version" = %(snapshot)s AND "status" = 'running'
        {after_session}{run_where}
    RETURNING "event_seq", "snapshot_version", "cancel_requested_at"
)"""

_MESSAGES = """, m AS (
    INSERT INTO "sessions_app_message" ("session_id", "seq", "role", "content", "tool_calls", "tool_call_id",
        "tool_name", "run_id", "step_id", "created_at")
    SELECT %(session)s, se."message_seq" - %(m_count)s + u.ord, u.m->>'role', u.m->>'content', u.m->'tool_calls',
        u.m->>'tool_call_id', u.m->>'tool_name', %(run)s, (u.m->>'step_id')::bigint, %(now)s
    FROM se, r, jsonb_array_elements(%(doc)s->'messages') WITH ORDINALITY AS u(m, ord)
)"""

_EVENTS = """, ev AS (
    INSERT INTO "runs_app_runevent" ("run_id", "seq", "type", "payload", "created_at")
    SELECT %(run)s, r."event_seq" - %(e_count)s + e.ord, e.ev->>'type', e.ev->'payload', %(now)s
    FROM r, jsonb_array_elements(%(doc)s->'events') WITH ORDINALITY AS e(ev, ord)
    RETURNING "seq"
)"""

_TAIL = """
SELECT (SELECT "event_seq" FROM r), (SELECT "snapshot_version" FROM r), (SELECT "cancel_requested_at" FROM r),
    {message_seq}, {returned},
    warden_fence_check(EXISTS (SELECT 1 FROM r) AND (SELECT count(*) FROM ev) = %(e_count)s AND {checks}, '{what}')
"""

# The model step a turn closes: still running, opened under this lease.
_MODEL_STEP_CLOSED = """, ms AS (
    UPDATE "runs_app_step" SET "status" = %(model_status)s, "finished_at" = %(model_finished_at)s,
        "input_tokens" = %(input_tokens)s, "output_tokens" = %(output_tokens)s, "finish_reason" = %(finish_reason)s,
        "context_manifest" = %(doc)s->'manifest', "streamed_text" = %(text)s,
        "endpoint" = %(answered_endpoint)s, "model" = %(answered_model)s, "cost" = %(answered_cost)s
    FROM r WHERE "runs_app_step"."id" = %(model_step)s AND "runs_app_step"."status" = 'running'
        AND "runs_app_step"."lease_token" = %(token)s
    RETURNING "runs_app_step"."id"
)"""


def _step_opened(name: str, kind: str) -> str:
    """A CTE inserting the run's next step, of `kind`, running under this lease."""
    columns, values = insert_list(Step, {
        "run_id": "%(run)s", "index": "%(new_index)s", "kind": f"'{kind}'", "status": f"'{StepStatus.RUNNING}'",
        "started_at": "%(now)s", "lease_token": "%(token)s",
    })
    return f""", {name} AS (
    INSERT INTO "{Step._meta.db_table}" ({columns})
    SELECT {values}
    FROM r RETURNING "id"
)"""


@dataclass(frozen=True)
class _Statement:
    """One kind of step commit: what it writes besides the head, what it returns, what must have
    matched. The SQL is made once per set of run columns it sets."""

    what: str
    body: str
    returned: str
    checks: str
    run_where: str = ""
    history: bool = True  # it appends messages to the session's history

    def sql(self, changes: dict) -> str:
        return _sql(self, tuple(changes))


@functools.lru_cache(maxsize=None)
def _sql(statement: _Statement, columns: tuple[str, ...]) -> str:
    run = _RUN.format(run_set=", ".join(f'"{column}" = %(run_{column})s' for column in columns),
                      after_session="AND EXISTS (SELECT 1 FROM se)" if statement.history else "",
                      run_where=statement.run_where)
    head = _SESSION + run + _MESSAGES if statement.history else "\nWITH " + run
    tail = _TAIL.format(message_seq='(SELECT "message_seq" FROM se)' if statement.history else "NULL",
                        returned=statement.returned, checks=statement.checks, what=statement.what)
    return head + _EVENTS + statement.body + tail


def _head_params(*, run: Run, lease: Lease, now, messages: list[Message], events: list[dict], changes: dict,
                 doc: dict) -> dict:
    doc |= {"messages": _message_rows(messages), "events": events}
    return {**_run_params(changes), "now": now, "run": run.id, "session": run.session_id, "token": lease.token,
            "snapshot": run.snapshot_version, "m_count": len(messages), "e_count": len(events), "doc": Jsonb(doc)}


# --- A read's outcome: the tool message, the tools step closed, the next model step opened ------------------

_READS_FINISHED = _Statement(
    what="reads finished",
    body=""", tc AS (
    UPDATE "tools_app_toolcall" AS t SET "status" = u.c->>'status', "result" = NULLIF(u.c->'result', 'null'::jsonb),
        "error_code" = u.c->>'error_code', "error_detail" = u.c->>'error_detail', "attempts" = (u.c->>'attempts')::int,
        "finished_at" = %(now)s
    FROM r, jsonb_array_elements(%(doc)s->'calls') AS u(c)
    WHERE t."id" = (u.c->>'id')::uuid AND t."status" = 'running' AND t."lease_token" = %(token)s
    RETURNING t."id"
), st AS (
    UPDATE "runs_app_step" SET "status" = %(tools_status)s, "finished_at" = %(now)s
    FROM r WHERE "runs_app_step"."id" = %(tools_step)s AND "runs_app_step"."status" = 'running'
    RETURNING "runs_app_step"."id"
)""" + _step_opened("ns", StepKind.MODEL),
    returned='(SELECT "id" FROM ns)',
    checks="(SELECT count(*) FROM tc) = %(t_count)s AND (SELECT count(*) FROM st) = 1",
)


def reads_finished(*, cp, lease: Lease, outcomes: list) -> Carried | None:
    """Commit the outcomes of the checkpoint `cp`'s last reads and open the next model step, in one
    statement; returns the checkpoint that follows. None when this is not that case or the
    statement's fence missed (nothing written): the general path does it."""
    return _taken(_reads_finished, cp=cp, lease=lease, outcomes=outcomes)


def _reads_finished(*, cp, lease: Lease, outcomes: list) -> Carried | None:
    run = cp.run
    if cp.tools_step is None:
        return None
    now = timezone.now()
    calls, call_values = [], []
    for outcome in outcomes:
        call = outcome.call
        if call.status != ToolCallStatus.RUNNING or call.lease_token != lease.token:
            return None
        if call.effect != ToolEffect.READ:
            return None  # a write's outcome goes on the ledger (approvals_app.ledger): the general path
        values = tool_call_transition_values(
            tool_call=call, to=outcome.status, lease_token=lease.token, result=outcome.result,
            error_code=outcome.error_code, error_detail=outcome.error_detail, attempts=outcome.attempts, finished_at=now,
        )
        after = copy.copy(call)
        for name, value in values.items():
            setattr(after, name, value)
        calls.append(after)
        call_values.append(values)
    step_values = step_transition_values(step=cp.tools_step, to=StepStatus.COMPLETED, finished_at=now)
    index = run.step_count
    messages = [tool_call_message(call) for call in calls]
    phase, phase_events = run_phase_values(run=run, phase=RunPhase.CALLING_MODEL)
    events = _events([
        *(tool_call_event(call) for call in calls),
        (RunEventType.STEP_COMPLETED, {"step": cp.tools_step.index, "kind": StepKind.TOOLS}),
        (RunEventType.STEP_STARTED, {"step": index, "kind": StepKind.MODEL}),
        *phase_events,
    ])
    changes = {**phase, "model_calls": run.model_calls + 1, "step_count": index + 1}
    calls_doc = [{"id": str(c.id), "status": c.status, "result": c.result, "error_code": c.error_code,
                  "error_detail": c.error_detail, "attempts": c.attempts} for c in calls]
    params = {
        **_head_params(run=run, lease=lease, now=now, messages=messages, events=events, changes=changes,
                       doc={"calls": calls_doc}),
        "t_count": len(calls), "tools_step": cp.tools_step.pk, "tools_status": step_values["status"], "new_index": index,
    }
    row = _execute(_READS_FINISHED.sql(changes), params)  # raises _Missed, having written nothing, unless every part matched
    event_seq, snapshot, cancel_requested_at, message_seq, model_step_id, _ = row
    for outcome, values in zip(outcomes, call_values):
        for name, value in values.items():
            setattr(outcome.call, name, value)
    for name, value in step_values.items():
        setattr(cp.tools_step, name, value)
    _run_written(run, changes, event_seq=event_seq, snapshot=snapshot, cancel_requested_at=cancel_requested_at,
                 events=events)
    model_step = _saved(Step(pk=model_step_id, run_id=run.id, index=index, kind=StepKind.MODEL,
                             status=StepStatus.RUNNING, started_at=now, lease_token=lease.token))
    return Carried(latest_step=model_step, context=_context_extended(cp.context, messages, message_seq))


# --- A model step opened: the run calls its model (the first step of a slice) ------------------------------

_MODEL_STEP_OPENED = _Statement(
    what="model step opened",
    body=_step_opened("ns", StepKind.MODEL),
    returned='(SELECT "id" FROM ns)',
    checks="(SELECT count(*) FROM ns) = 1",
    history=False,
)


def model_step_opened(*, run: Run, lease: Lease, changes: dict, events: list[tuple[str, dict]]) -> Step | None:
    """Open the run's next model step (`changes` count it and enter its phase, `events` announce
    it: engine.model_step.model_step_open builds both), in one statement, as the general path
    would; None when it is not taken (nothing written)."""
    now = timezone.now()
    events = _events(events)
    params = {**_head_params(run=run, lease=lease, now=now, messages=[], events=events, changes=changes, doc={}),
              "new_index": run.step_count}
    try:
        event_seq, snapshot, cancel_requested_at, _, step_id, _ = _execute(_MODEL_STEP_OPENED.sql(changes), params)
    except _Missed as missed:
        logger.debug("run %s: one-statement commit not taken (%s)", run.id, missed)
        return None
    index = run.step_count
    _run_written(run, changes, event_seq=event_seq, snapshot=snapshot, cancel_requested_at=cancel_requested_at,
                 events=events)
    return _saved(Step(pk=step_id, run_id=run.id, index=index, kind=StepKind.MODEL, status=StepStatus.RUNNING,
                       started_at=now, lease_token=lease.token))


# --- A model turn that asks for reads: the assistant message, the tools step and its calls -------------------

_TURN_WITH_READS = _Statement(
    what="model turn with reads",
    body=_MODEL_STEP_CLOSED + _step_opened("ts", StepKind.TOOLS) + """, tc AS (
    INSERT INTO "{table}" ({columns})
    SELECT {values}
    FROM ts, jsonb_array_elements(%(doc)s->'calls') WITH ORDINALITY AS u(c, ord)
    RETURNING "id"
)""".format(table=ToolCall._meta.db_table, **dict(zip(("columns", "values"), insert_list(ToolCall, {
        "id": "(u.c->>'id')::uuid", "run_id": "%(run)s", "step_id": 'ts."id"', "index": "u.ord - 1",
        "tool_call_id": "u.c->>'tool_call_id'", "tool_name": "u.c->>'tool_name'", "arguments": "u.c->'arguments'",
        "effect": "u.c->>'effect'", "status": "u.c->>'status'", "created_at": "%(now)s",
        "started_at": f"CASE WHEN u.c->>'status' = '{ToolCallStatus.RUNNING}' THEN %(now)s END",
        "lease_token": "(u.c->>'lease_token')::bigint",
    })))),
    returned='(SELECT "id" FROM ts)',
    checks="(SELECT count(*) FROM ms) = 1 AND (SELECT count(*) FROM tc) = %(t_count)s",
)


def turn_with_reads(*, cp, lease: Lease, step: Step, result, manifest: dict, rows: list[ToolCall],
                    assistant: Message, events: list[tuple[str, dict]], changes: dict) -> Carried | None:
    """Commit a model turn whose calls are new reads (`rows`, built by tool_exec, not yet saved):
    as `_commit_turn` would, in one statement; returns the checkpoint that follows, or None when
    it is not taken (nothing written)."""
    return _taken(_turn_with_reads, cp=cp, lease=lease, step=step, result=result, manifest=manifest, rows=rows,
                  assistant=assistant, events=events, changes=changes)


def _turn_with_reads(*, cp, lease: Lease, step: Step, result, manifest: dict, rows: list[ToolCall],
                     assistant: Message, events: list[tuple[str, dict]], changes: dict) -> Carried | None:
    run = cp.run
    if step.lease_token != lease.token:
        return None
    now = timezone.now()
    step_values = _model_step_values(step, result, manifest, now)
    events = _events(events)
    calls_doc = [{"id": str(r.id), "tool_call_id": r.tool_call_id, "tool_name": r.tool_name, "arguments": r.arguments,
                  "effect": r.effect, "status": r.status, "lease_token": r.lease_token} for r in rows]
    params = {
        **_head_params(run=run, lease=lease, now=now, messages=[assistant], events=events, changes=changes,
                       doc={"calls": calls_doc, "manifest": manifest}),
        **_model_step_params(step, step_values, result), "new_index": run.step_count, "t_count": len(rows),
    }
    row = _execute(_TURN_WITH_READS.sql(changes), params)  # raises _Missed, having written nothing, unless every part matched
    event_seq, snapshot, cancel_requested_at, message_seq, tools_step_id, _ = row
    for name, value in step_values.items():
        setattr(step, name, value)
    _run_written(run, changes, event_seq=event_seq, snapshot=snapshot, cancel_requested_at=cancel_requested_at,
                 events=events)
    tools_step = _saved(Step(pk=tools_step_id, run_id=run.id, index=changes["step_count"] - 1, kind=StepKind.TOOLS,
                             status=StepStatus.RUNNING, started_at=now, lease_token=lease.token))
    for row_ in rows:
        _saved(row_)
        row_.step_id = tools_step_id
        row_.created_at = now
        if row_.status == ToolCallStatus.RUNNING:
            row_.started_at = now
    open_calls = [r for r in rows if r.status in (ToolCallStatus.PENDING, ToolCallStatus.RUNNING)]
    return Carried(latest_step=tools_step, tools_step=tools_step, open_tool_calls=open_calls,
                   context=_context_extended(cp.context, [assistant], message_seq))


# --- A model turn that answers: the assistant message, the run completed --------------------------------------

# Taken only when ending the run asks nothing more than this statement writes: no input waits to
# start the next run, the run asked for no write (its outcome is `none`), and no endpoint
# subscribes to `run_completed` (no outbox rows to write). Otherwise run_end does it.
_TURN_ANSWERED = _Statement(
    what="model turn answered",
    body=_MODEL_STEP_CLOSED,
    returned="NULL",
    checks="(SELECT count(*) FROM ms) = 1",
    run_where="""
        AND NOT EXISTS (SELECT 1 FROM "sessions_app_pendinginput" WHERE "session_id" = %(session)s
            AND "consumed_at" IS NULL)
        AND NOT EXISTS (SELECT 1 FROM "tools_app_toolcall" WHERE "run_id" = %(run)s AND "effect" = 'write')
        AND NOT EXISTS (SELECT 1 FROM "runs_app_webhookendpoint" WHERE "active" AND %(notified)s = ANY("kinds"))""",
)


def turn_answered(*, cp, lease: Lease, step: Step, result, manifest: dict, assistant: Message,
                  events: list[tuple[str, dict]], changes: dict) -> bool:
    """Commit a model turn that gives the final answer, completing the run, as `_commit_turn` and
    run_end would, in one statement. False when it is not taken (nothing written)."""
    return bool(_taken(_turn_answered, cp=cp, lease=lease, step=step, result=result, manifest=manifest,
                       assistant=assistant, events=events, changes=changes))


def _turn_answered(*, cp, lease: Lease, step: Step, result, manifest: dict, assistant: Message,
                   events: list[tuple[str, dict]], changes: dict) -> bool:
    run = cp.run
    if step.lease_token != lease.token or run.cancel_requested_at is not None:
        return False
    now = timezone.now()
    step_values = _model_step_values(step, result, manifest, now)
    values, payload = dict(changes), {}
    run_ending_outcome(values, payload, outcome=RunOutcome.NONE)
    run_values, status_event = run_transition_values(run=run, to=RunStatus.COMPLETED, event_payload=payload, **values)
    run_values["finished_at"] = now
    notified = notification_kind(*status_event)
    events = _events([*events, status_event], notifying=notified)
    params = {
        **_head_params(run=run, lease=lease, now=now, messages=[assistant], events=events, changes=run_values,
                       doc={"manifest": manifest}),
        **_model_step_params(step, step_values, result), "notified": notified,
    }
    row = _execute(_TURN_ANSWERED.sql(run_values), params)  # raises _Missed, having written nothing, unless every part matched
    event_seq, snapshot, cancel_requested_at, *_ = row
    for name, value in step_values.items():
        setattr(step, name, value)
    _run_written(run, run_values, event_seq=event_seq, snapshot=snapshot, cancel_requested_at=cancel_requested_at,
                 events=events)
    return True


# --- Shared ---------------------------------------------------------------------------------------------------

def _taken(commit, *, cp, **kwargs):
    """What `commit` returned; a miss of its fence or checks (nothing written) is None."""
    try:
        return commit(cp=cp, **kwargs)
    except _Missed as missed:
        logger.debug("run %s: one-statement commit not taken (%s)", cp.run.id, missed)
        return None


def _model_step_values(step: Step, result, manifest: dict, now) -> dict:
    return step_transition_values(
        step=step, to=StepStatus.COMPLETED, input_tokens=result.input_tokens, output_tokens=result.output_tokens,
        finish_reason=result.finish_reason, context_manifest=manifest, streamed_text=result.text, finished_at=now,
        **result.answered_by(),
    )


def _model_step_params(step: Step, values: dict, result) -> dict:
    return {"model_step": step.pk, "model_status": values["status"], "model_finished_at": values["finished_at"],
            "input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
            "finish_reason": result.finish_reason, "text": result.text, "answered_endpoint": values["endpoint"],
            "answered_model": values["model"], "answered_cost": values["cost"]}


def _run_params(changes: dict) -> dict:
    return {f"run_{column}": value for column, value in changes.items()}


def _saved(instance):
    """A model instance for a row the statement wrote (as if read back, without reading it)."""
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance


def _run_written(run: Run, changes: dict, *, event_seq: int, snapshot: int, cancel_requested_at,
                 events: list[dict]) -> None:
    for name, value in changes.items():
        setattr(run, name, value)
    run.event_seq = event_seq
    run.snapshot_version = snapshot
    run.cancel_requested_at = cancel_requested_at
    # The snapshot matched: nobody wrote to the run since the worker read or wrote it last. That
    # is not "the worker saw everything": input queued before a fresh read is still unseen until
    # a safe point looks, so what the safe point knows is kept as run_write keeps it.
    run_written_by_lease_holder(run_id=run.id, event_seq=event_seq, events=len(events))
    first = event_seq - len(events) + 1
    publish_events_on_commit(session_id=run.session_id, run_id=run.id,
                             events=[{"seq": first + i, **event} for i, event in enumerate(events)])


def _context_extended(cached: CachedContext | None, messages: list[Message], message_seq: int) -> CachedContext | None:
    """The cached context with this commit's messages appended, or None (read it again) when the
    session got messages from elsewhere meanwhile or they no longer fit the window."""
    for offset, message in enumerate(messages):
        message.seq = message_seq - len(messages) + 1 + offset
    if cached is None or cached.message_seq != message_seq - len(messages):
        return None
    cost = sum(message_cost(m) for m in messages)
    if cost > cached.budget_left:
        return None
    return CachedContext(
        session_id=cached.session_id, message_seq=message_seq,
        messages=[*cached.messages, *(message_to_openai(m) for m in messages)],
        seq_ranges=seq_ranges((m.seq for m in messages), after=cached.seq_ranges),
        budget_left=cached.budget_left - cost, manifest=cached.manifest,
    )
