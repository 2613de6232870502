"""The two step boundaries every run crosses over and over, each committed as ONE statement.

A read tool call finishing (its outcome, its tool message, the tools step closed and the next
model step opened) and a model turn that asks for reads (the model step closed, the assistant
message, the tools step and its calls) are the engine's hot path: a run of K reads crosses them
K times each. The general code (tool_exec._finish, model_step._commit_turn) writes them through
the ORM in a transaction of some eight statements; here the same rows and the same events go in
one statement of data-modifying CTEs, which PostgreSQL runs as one transaction — one round trip
and one commit per durable step (issue 16).

The fence is unchanged: the session row is locked first (the order every writer takes), the run
row's UPDATE is conditional on the lease token, and every other part is conditional on that
UPDATE having matched. It is also conditional on the run's `snapshot_version` being the one this
worker last wrote: then nobody else touched the run meanwhile (no input queued, no cancel asked),
which is what lets the worker go on from the checkpoint it holds in memory instead of reading it
again (`Checkpoint.carried`). Each status change takes its values from the entity's one
transition function's table check (`step_transition_values`, `tool_call_transition_values`) and
must match exactly the rows it expects; the statement ends in `warden_fence_check`, which raises
when anything did not match, so the statement then wrote nothing at all. The caller falls back to
the general path, which re-checks everything (and raises LeaseLost if the lease is gone).
"""

import copy
import logging
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone
from psycopg import Cursor
from psycopg.types.json import Jsonb

from engine.checkpoint import Checkpoint
from engine.context import CachedContext, message_cost, message_to_openai, seq_ranges
from engine.lease import Lease
from runs_app.events import RunEventType
from runs_app.live import publish_events_on_commit
from runs_app.models import Run, RunPhase, RunStatus, Step, StepKind, StepStatus
from runs_app.notifications import notification_kind
from runs_app.services import run_written_by_lease_holder, step_transition_values
from sessions_app.models import Message
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.services import tool_call_event, tool_call_message, tool_call_transition_values

logger = logging.getLogger("warden.engine")

FENCE_SQLSTATE = "WF001"


class _Missed(Exception):
    """The statement's fence or a status check did not match: nothing was written."""


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


def _events(kinds_payloads: list[tuple[str, dict]]) -> tuple[list[str], list[Jsonb]]:
    events = [(RunEventType(kind), payload) for kind, payload in kinds_payloads]
    if any(notification_kind(kind, payload) for kind, payload in events):
        raise _Missed("a notification event goes the general way (the outbox)")
    return [kind.value for kind, _ in events], [Jsonb(payload) for _, payload in events]


def _message_columns(messages: list[Message]) -> dict:
    return {
        "m_role": [m.role for m in messages],
        "m_content": [m.content for m in messages],
        "m_tool_calls": [Jsonb(m.tool_calls) for m in messages],
        "m_tool_call_id": [m.tool_call_id for m in messages],
        "m_tool_name": [m.tool_name for m in messages],
        "m_step": [m.step_id for m in messages],
    }


# The session row first (every writer's order), then the run row under the fence; the rest only
# when the run's UPDATE matched.
_HEAD = """
WITH se AS (
    UPDATE "sessions_app_session" SET "message_seq" = "message_seq" + %(m_count)s, "updated_at" = %(now)s
    WHERE "id" = %(session)s RETURNING "message_seq"
), r AS (
    UPDATE "runs_app_run" SET {run_set}, "event_seq" = "event_seq" + %(e_count)s,
        "snapshot_version" = "snapshot_version" + 1, "updated_at" = %(now)s
    WHERE "id" = %(run)s AND "lease_token" = %(token)s AND "snapshot_version" = %(snapshot)s AND "status" = 'running'
        AND EXISTS (SELECT 1 FROM se)
    RETURNING "event_seq", "snapshot_version", "cancel_requested_at"
), m AS (
    INSERT INTO "sessions_app_message" ("session_id", "seq", "role", "content", "tool_calls", "tool_call_id",
        "tool_name", "run_id", "step_id", "created_at")
    SELECT %(session)s, se."message_seq" - %(m_count)s + u.ord, u.role, u.content, u.tool_calls, u.tool_call_id,
        u.tool_name, %(run)s, u.step_id, %(now)s
    FROM se, r, unnest(%(m_role)s::varchar[], %(m_content)s::text[], %(m_tool_calls)s::jsonb[],
        %(m_tool_call_id)s::varchar[], %(m_tool_name)s::varchar[], %(m_step)s::bigint[])
        WITH ORDINALITY AS u(role, content, tool_calls, tool_call_id, tool_name, step_id, ord)
    RETURNING "id", "seq"
), ev AS (
    INSERT INTO "runs_app_runevent" ("run_id", "seq", "type", "payload", "created_at")
    SELECT %(run)s, r."event_seq" - %(e_count)s + e.ord, e.type, e.payload, %(now)s
    FROM r, unnest(%(e_type)s::varchar[], %(e_payload)s::jsonb[]) WITH ORDINALITY AS e(type, payload, ord)
    RETURNING "seq"
)"""


# --- A read's outcome: the tool message, the tools step closed, the next model step opened ------------------

_READS_FINISHED = _HEAD + """, tc AS (
    UPDATE "tools_app_toolcall" AS t SET "status" = u.status, "result" = u.result, "error_code" = u.error_code,
        "error_detail" = u.error_detail, "attempts" = u.attempts, "finished_at" = u.finished_at
    FROM r, unnest(%(t_id)s::uuid[], %(t_status)s::varchar[], %(t_result)s::jsonb[], %(t_error_code)s::varchar[],
        %(t_error_detail)s::text[], %(t_attempts)s::int[], %(t_finished_at)s::timestamptz[])
        AS u(id, status, result, error_code, error_detail, attempts, finished_at)
    WHERE t."id" = u.id AND t."status" = 'running' AND t."lease_token" = %(token)s
    RETURNING t."id"
), st AS (
    UPDATE "runs_app_step" SET "status" = %(tools_status)s, "finished_at" = %(tools_finished_at)s
    FROM r WHERE "runs_app_step"."id" = %(tools_step)s AND "runs_app_step"."status" = 'running'
    RETURNING "runs_app_step"."id"
), ns AS (
    INSERT INTO "runs_app_step" ("run_id", "index", "kind", "status", "started_at", "finished_at", "input_tokens",
        "output_tokens", "finish_reason", "context_manifest", "discard_reason", "streamed_text", "lease_token")
    SELECT %(run)s, %(model_index)s, 'model', 'running', %(now)s, NULL, 0, 0, '', '{{}}'::jsonb, '', '', %(token)s
    FROM r RETURNING "id"
)
SELECT (SELECT "event_seq" FROM r), (SELECT "snapshot_version" FROM r), (SELECT "cancel_requested_at" FROM r),
    (SELECT "message_seq" FROM se), (SELECT "id" FROM ns), (SELECT array_agg("id" ORDER BY "seq") FROM m),
    warden_fence_check(EXISTS (SELECT 1 FROM r) AND (SELECT count(*) FROM tc) = %(t_count)s
        AND (SELECT count(*) FROM st) = 1 AND (SELECT count(*) FROM ev) = %(e_count)s, 'reads finished')
"""


def reads_finished(*, cp: Checkpoint, lease: Lease, outcomes: list) -> bool:
    """Commit the outcomes of the tools step's last reads and open the next model step, in one
    statement, and carry the checkpoint that follows (`cp.carried`). False when this is not
    that case or the statement's fence missed (nothing written): the general path does it."""
    return _taken(_reads_finished, cp=cp, lease=lease, outcomes=outcomes)


def _reads_finished(*, cp: Checkpoint, lease: Lease, outcomes: list) -> bool:
    run = cp.run
    expected = run.snapshot_version
    if cp.tools_step is None:
        return False
    now = timezone.now()
    calls, call_values = [], []
    for outcome in outcomes:
        call = outcome.call
        if call.status != ToolCallStatus.RUNNING or call.lease_token != lease.token:
            return False
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
    kinds, payloads = _events([
        *(tool_call_event(call) for call in calls),
        (RunEventType.STEP_COMPLETED, {"step": cp.tools_step.index, "kind": StepKind.TOOLS}),
        (RunEventType.STEP_STARTED, {"step": index, "kind": StepKind.MODEL}),
        (RunEventType.RUN_STATUS, {"status": RunStatus.RUNNING, "phase": RunPhase.CALLING_MODEL, "wait_reason": ""}),
    ])
    changes = {"phase": RunPhase.CALLING_MODEL, "model_calls": run.model_calls + 1, "step_count": index + 1}
    sql = _READS_FINISHED.format(run_set=_run_set(changes))
    params = {
        **_run_params(changes), "now": now, "run": run.id, "session": run.session_id, "token": lease.token,
        "snapshot": expected, "m_count": len(messages), **_message_columns(messages),
        "e_count": len(kinds), "e_type": kinds, "e_payload": payloads,
        "t_count": len(calls), "t_id": [c.id for c in calls], "t_status": [c.status for c in calls],
        "t_result": [None if c.result is None else Jsonb(c.result) for c in calls],
        "t_error_code": [c.error_code for c in calls], "t_error_detail": [c.error_detail for c in calls],
        "t_attempts": [c.attempts for c in calls], "t_finished_at": [c.finished_at for c in calls],
        "tools_step": cp.tools_step.pk, "tools_status": step_values["status"],
        "tools_finished_at": step_values["finished_at"], "model_index": index,
    }
    row = _execute(sql, params)  # raises _Missed, having written nothing, unless every part matched
    event_seq, snapshot, cancel_requested_at, message_seq, model_step_id, message_ids, _ = row
    for outcome, values in zip(outcomes, call_values):
        for name, value in values.items():
            setattr(outcome.call, name, value)
    for name, value in step_values.items():
        setattr(cp.tools_step, name, value)
    _run_written(run, changes, event_seq=event_seq, snapshot=snapshot, cancel_requested_at=cancel_requested_at,
                 events=len(kinds))
    _announce(run, event_seq=event_seq, kinds=kinds, payloads=payloads)
    model_step = Step(pk=model_step_id, run_id=run.id, index=index, kind=StepKind.MODEL, status=StepStatus.RUNNING,
                      started_at=now, lease_token=lease.token)
    model_step._state.adding = False
    model_step._state.db = connection.alias
    cp.carried = Checkpoint(run=run, latest_step=model_step,
                            context=_context_extended(cp.context, messages, message_ids, message_seq))
    return True


# --- A model turn that asks for reads: the assistant message, the tools step and its calls -------------------

_TURN_WITH_READS = _HEAD + """, ms AS (
    UPDATE "runs_app_step" SET "status" = %(model_status)s, "finished_at" = %(model_finished_at)s,
        "input_tokens" = %(input_tokens)s, "output_tokens" = %(output_tokens)s, "finish_reason" = %(finish_reason)s,
        "context_manifest" = %(manifest)s, "streamed_text" = %(text)s
    FROM r WHERE "runs_app_step"."id" = %(model_step)s AND "runs_app_step"."status" = 'running'
        AND "runs_app_step"."lease_token" = %(token)s
    RETURNING "runs_app_step"."id"
), ts AS (
    INSERT INTO "runs_app_step" ("run_id", "index", "kind", "status", "started_at", "finished_at", "input_tokens",
        "output_tokens", "finish_reason", "context_manifest", "discard_reason", "streamed_text", "lease_token")
    SELECT %(run)s, %(tools_index)s, 'tools', 'running', %(now)s, NULL, 0, 0, '', '{{}}'::jsonb, '', '', %(token)s
    FROM r RETURNING "id"
), tc AS (
    INSERT INTO "tools_app_toolcall" ("id", "run_id", "step_id", "index", "tool_call_id", "tool_name", "arguments",
        "effect", "status", "attempts", "idempotency_key", "reused_from_id", "result", "error_code", "error_detail",
        "created_at", "started_at", "finished_at", "next_attempt_at", "lease_token", "reconcile_attempts",
        "resolution", "resolved_by_id", "resolved_at", "evidence")
    SELECT u.id, %(run)s, ts."id", u.ord - 1, u.tool_call_id, u.tool_name, u.arguments, u.effect, u.status, 0, NULL,
        NULL, NULL, '', '', %(now)s, u.started_at, NULL, NULL, u.lease_token, 0, '', NULL, NULL, ''
    FROM ts, unnest(%(t_id)s::uuid[], %(t_tool_call_id)s::varchar[], %(t_tool_name)s::varchar[],
        %(t_arguments)s::jsonb[], %(t_effect)s::varchar[], %(t_status)s::varchar[], %(t_started_at)s::timestamptz[],
        %(t_lease_token)s::bigint[])
        WITH ORDINALITY AS u(id, tool_call_id, tool_name, arguments, effect, status, started_at, lease_token, ord)
    RETURNING "id"
)
SELECT (SELECT "event_seq" FROM r), (SELECT "snapshot_version" FROM r), (SELECT "cancel_requested_at" FROM r),
    (SELECT "message_seq" FROM se), (SELECT "id" FROM ts), (SELECT array_agg("id" ORDER BY "seq") FROM m),
    warden_fence_check(EXISTS (SELECT 1 FROM r) AND (SELECT count(*) FROM ms) = 1
        AND (SELECT count(*) FROM tc) = %(t_count)s AND (SELECT count(*) FROM ev) = %(e_count)s, 'model turn with reads')
"""


def turn_with_reads(*, cp: Checkpoint, lease: Lease, step: Step, result, manifest: dict, rows: list[ToolCall],
                    assistant: Message, events: list[tuple[str, dict]], changes: dict) -> bool:
    """Commit a model turn whose calls are new reads (`rows`, built by tool_exec, not yet saved):
    as `_commit_turn` would, in one statement, and carry the checkpoint that follows."""
    return _taken(_turn_with_reads, cp=cp, lease=lease, step=step, result=result, manifest=manifest, rows=rows,
                  assistant=assistant, events=events, changes=changes)


def _turn_with_reads(*, cp: Checkpoint, lease: Lease, step: Step, result, manifest: dict, rows: list[ToolCall],
                     assistant: Message, events: list[tuple[str, dict]], changes: dict) -> bool:
    run = cp.run
    if step.lease_token != lease.token:
        return False
    now = timezone.now()
    step_values = step_transition_values(
        step=step, to=StepStatus.COMPLETED, input_tokens=result.input_tokens, output_tokens=result.output_tokens,
        finish_reason=result.finish_reason, context_manifest=manifest, streamed_text=result.text, finished_at=now,
    )
    kinds, payloads = _events(events)
    sql = _TURN_WITH_READS.format(run_set=_run_set(changes))
    params = {
        **_run_params(changes), "now": now, "run": run.id, "session": run.session_id, "token": lease.token,
        "snapshot": run.snapshot_version, "m_count": 1, **_message_columns([assistant]),
        "e_count": len(kinds), "e_type": kinds, "e_payload": payloads,
        "model_step": step.pk, "model_status": step_values["status"], "model_finished_at": step_values["finished_at"],
        "input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
        "finish_reason": result.finish_reason, "manifest": Jsonb(manifest), "text": result.text,
        "tools_index": run.step_count, "t_count": len(rows),
        "t_id": [r.id for r in rows], "t_tool_call_id": [r.tool_call_id for r in rows],
        "t_tool_name": [r.tool_name for r in rows], "t_arguments": [Jsonb(r.arguments) for r in rows],
        "t_effect": [r.effect for r in rows], "t_status": [r.status for r in rows],
        "t_started_at": [r.started_at for r in rows], "t_lease_token": [r.lease_token for r in rows],
    }
    row = _execute(sql, params)  # raises _Missed, having written nothing, unless every part matched
    event_seq, snapshot, cancel_requested_at, message_seq, tools_step_id, message_ids, _ = row
    for name, value in step_values.items():
        setattr(step, name, value)
    _run_written(run, changes, event_seq=event_seq, snapshot=snapshot, cancel_requested_at=cancel_requested_at,
                 events=len(kinds))
    _announce(run, event_seq=event_seq, kinds=kinds, payloads=payloads)
    tools_step = Step(pk=tools_step_id, run_id=run.id, index=changes["step_count"] - 1, kind=StepKind.TOOLS,
                      status=StepStatus.RUNNING, started_at=now, lease_token=lease.token)
    for saved in (tools_step, *rows):
        saved._state.adding = False
        saved._state.db = connection.alias
    for row_ in rows:
        row_.step_id = tools_step_id
        row_.created_at = now
    open_calls = [r for r in rows if r.status in (ToolCallStatus.PENDING, ToolCallStatus.RUNNING)]
    cp.carried = Checkpoint(run=run, latest_step=tools_step, tools_step=tools_step, open_tool_calls=open_calls,
                            context=_context_extended(cp.context, [assistant], message_ids, message_seq))
    return True


# --- Shared ---------------------------------------------------------------------------------------------------

def _taken(commit, *, cp: Checkpoint, **kwargs) -> bool:
    """Whether `commit` committed; a miss of its fence or checks (nothing written) is False."""
    try:
        return commit(cp=cp, **kwargs)
    except _Missed as missed:
        logger.debug("run %s: one-statement commit not taken (%s)", cp.run.id, missed)
        return False


def _run_set(changes: dict) -> str:
    return ", ".join(f'"{column}" = %(run_{column})s' for column in changes)


def _run_params(changes: dict) -> dict:
    return {f"run_{column}": value for column, value in changes.items()}


def _run_written(run: Run, changes: dict, *, event_seq: int, snapshot: int, cancel_requested_at,
                 events: int) -> None:
    for name, value in changes.items():
        setattr(run, name, value)
    run.event_seq = event_seq
    run.snapshot_version = snapshot
    run.cancel_requested_at = cancel_requested_at
    # The snapshot matched: nobody wrote to the run since the worker read or wrote it last. That
    # is not "the worker saw everything": input queued before a fresh read is still unseen until
    # a safe point looks, so what the safe point knows is kept as run_write keeps it.
    run_written_by_lease_holder(run_id=run.id, event_seq=event_seq, events=events)


def _announce(run: Run, *, event_seq: int, kinds: list[str], payloads: list[Jsonb]) -> None:
    first = event_seq - len(kinds) + 1
    publish_events_on_commit(
        session_id=run.session_id, run_id=run.id,
        events=[{"seq": first + i, "type": kind, "payload": payload.obj} for i, (kind, payload) in enumerate(zip(kinds, payloads))],
    )


def _context_extended(cached: CachedContext | None, messages: list[Message], ids: list[int] | None,
                      message_seq: int) -> CachedContext | None:
    """The cached context with this commit's messages appended, or None (read it again) when the
    session got messages from elsewhere meanwhile or they no longer fit the window."""
    for message, pk, offset in zip(messages, ids or [], range(len(messages))):
        message.pk = pk
        message.seq = message_seq - len(messages) + 1 + offset
        message._state.adding = False
        message._state.db = connection.alias
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
