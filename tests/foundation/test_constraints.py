"""Raw SQL that violates each database invariant fails: no code path can store an
impossible state, even one that bypasses the services."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.utils import DatabaseError

from tests.support.factories import (
    ApprovalFactory,
    MessageFactory,
    PendingInputFactory,
    RunEventFactory,
    RunFactory,
    SessionFactory,
    StepFactory,
    ToolCallFactory,
)

pytestmark = pytest.mark.django_db


def _violates(sql: str, params: list) -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
    except IntegrityError:
        return True
    return False


RUN_UPDATES = {
    "run_status_valid": "status = 'thinking'",
    "run_phase_valid": "phase = 'dreaming'",
    "run_wait_reason_valid": "status = 'waiting', phase = '', wait_reason = 'coffee'",
    "run_queued_shape (phase)": "status = 'queued', phase = 'calling_model'",
    "run_queued_shape (lease)": "status = 'queued', lease_owner = 'w1', lease_expires_at = now()",
    "run_running_shape (no lease)": "status = 'running', phase = 'calling_model'",
    "run_running_shape (phase)": "status = 'running', phase = 'waiting_worker', lease_owner = 'w', lease_expires_at = now()",
    "run_running_shape (wait)": "status = 'running', phase = 'calling_model', wait_reason = 'approval', lease_owner = 'w', lease_expires_at = now()",
    "run_waiting_shape (no reason)": "status = 'waiting', phase = ''",
    "run_waiting_shape (phase)": "status = 'waiting', phase = 'calling_model', wait_reason = 'approval'",
    "run_waiting_shape (lease)": "status = 'waiting', phase = '', wait_reason = 'approval', lease_owner = 'w', lease_expires_at = now()",
    "run_terminal_shape (no finish time)": "status = 'completed', phase = ''",
    "run_terminal_shape (phase)": "status = 'completed', phase = 'calling_model', finished_at = now()",
    "run_terminal_shape (wait)": "status = 'cancelled', phase = '', wait_reason = 'approval', finished_at = now()",
    "run_finished_only_when_terminal": "finished_at = now()",
    "run_failed_has_error_code": "status = 'failed', phase = '', finished_at = now(), error_code = ''",
    "run_lease_token_non_negative": "lease_token = -1",
}


@pytest.mark.parametrize("name", list(RUN_UPDATES))
def test_run_row_constraint(name):
    run = RunFactory()
    assert _violates(f"UPDATE runs_app_run SET {RUN_UPDATES[name]} WHERE id = %s", [run.id]), name


def test_a_valid_raw_update_is_accepted():
    # The constraint tests above mean something only if a legal shape passes.
    run = RunFactory()
    assert not _violates(
        "UPDATE runs_app_run SET status = 'waiting', phase = '', wait_reason = 'approval' WHERE id = %s", [run.id]
    )


def test_at_most_one_active_run_per_session():
    run = RunFactory()
    assert _violates(
        "INSERT INTO runs_app_run (id, session_id, status, phase, wait_reason, wait_type, request_id, resume_target,"
        " provider, max_model_calls, model_calls, max_tokens, tokens_used, deadline, model_retries, lease_owner,"
        " lease_token, cancel_reason, error_code, error_detail, snapshot_version, event_seq, step_count,"
        " created_at, updated_at)"
        " SELECT gen_random_uuid(), session_id, 'queued', 'waiting_worker', '', '', '', '', 'scripted', 1, 0, 1, 0,"
        " now(), 0, '', 0, '', '', '', 0, 0, 0, now(), now() FROM runs_app_run WHERE id = %s",
        [run.id],
    )


def test_a_finished_run_does_not_block_a_new_one():
    run = RunFactory(status="completed", phase="", finished_at="2026-01-01T00:00:00Z")
    RunFactory(session=run.session)  # no IntegrityError


def test_run_event_seq_unique_per_run():
    event = RunEventFactory()
    assert _violates(
        "INSERT INTO runs_app_runevent (run_id, seq, type, payload, created_at) VALUES (%s, %s, 'x', '{}', now())",
        [event.run_id, event.seq],
    )


def test_message_seq_unique_per_session():
    message = MessageFactory()
    assert _violates(
        "INSERT INTO sessions_app_message (session_id, seq, role, content, tool_calls, tool_call_id, tool_name, created_at)"
        " VALUES (%s, %s, 'user', 'x', '[]', '', '', now())",
        [message.session_id, message.seq],
    )


def test_message_role_must_be_known():
    session = SessionFactory()
    assert _violates(
        "INSERT INTO sessions_app_message (session_id, seq, role, content, tool_calls, tool_call_id, tool_name, created_at)"
        " VALUES (%s, 1, 'wizard', 'x', '[]', '', '', now())",
        [session.id],
    )


def test_tool_message_must_answer_a_call():
    session = SessionFactory()
    assert _violates(
        "INSERT INTO sessions_app_message (session_id, seq, role, content, tool_calls, tool_call_id, tool_name, created_at)"
        " VALUES (%s, 1, 'tool', 'x', '[]', '', '', now())",
        [session.id],
    )


def test_pending_input_consumed_requires_disposition():
    pending = PendingInputFactory()
    assert _violates("UPDATE sessions_app_pendinginput SET consumed_at = now() WHERE id = %s", [pending.id])
    assert _violates("UPDATE sessions_app_pendinginput SET disposition = 'supplemented' WHERE id = %s", [pending.id])
    assert _violates("UPDATE sessions_app_pendinginput SET mode = 'shout' WHERE id = %s", [pending.id])


@pytest.mark.parametrize(
    "assignment",
    [
        "status = 'exploded'",
        "effect = 'delete'",
        "resolution = 'maybe'",
        "status = 'succeeded'",  # final without finished_at
        "status = 'unknown', idempotency_key = 'k'",  # unknown only for writes
    ],
)
def test_tool_call_row_constraints(assignment):
    call = ToolCallFactory()
    assert _violates(f"UPDATE tools_app_toolcall SET {assignment} WHERE id = %s", [call.id])


def test_write_tool_call_cannot_run_without_an_idempotency_key():
    call = ToolCallFactory(effect="write", tool_name="execute_refund")
    assert _violates("UPDATE tools_app_toolcall SET status = 'running' WHERE id = %s", [call.id])
    assert not _violates("UPDATE tools_app_toolcall SET status = 'running', idempotency_key = 'k1' WHERE id = %s", [call.id])


def test_idempotency_key_is_unique():
    ToolCallFactory(effect="write", idempotency_key="refund:9527")
    other = ToolCallFactory(effect="write")
    assert _violates("UPDATE tools_app_toolcall SET idempotency_key = 'refund:9527' WHERE id = %s", [other.id])


def test_step_index_unique_per_run_and_finished_when_done():
    step = StepFactory()
    assert _violates(
        "INSERT INTO runs_app_step (run_id, index, kind, status, started_at, input_tokens, output_tokens, finish_reason,"
        " context_manifest, discard_reason, lease_token) VALUES (%s, %s, 'model', 'running', now(), 0, 0, '', '{}', '', 0)",
        [step.run_id, step.index],
    )
    assert _violates("UPDATE runs_app_step SET status = 'completed' WHERE id = %s", [step.id])
    assert _violates("UPDATE runs_app_step SET kind = 'dance' WHERE id = %s", [step.id])


@pytest.mark.parametrize(
    "assignment",
    [
        "status = 'maybe'",
        "policy = 'anyone'",
        "status = 'approved', decided_at = NULL",
        "status = 'approved', decided_at = now(), decided_by_id = NULL",
    ],
)
def test_approval_row_constraints(assignment):
    approval = ApprovalFactory()
    assert _violates(f"UPDATE approvals_app_approval SET {assignment} WHERE id = %s", [approval.id])


def test_one_approval_per_tool_call():
    approval = ApprovalFactory()
    assert _violates(
        "INSERT INTO approvals_app_approval (id, tool_call_id, run_id, policy, status, requested_at, expires_at, note)"
        " VALUES (gen_random_uuid(), %s, %s, 'operator', 'pending', now(), now(), '')",
        [approval.tool_call_id, approval.run_id],
    )


def test_messages_refuse_update_and_delete_at_the_database():
    message = MessageFactory(content="the order number is 9527")
    for sql in (
        "UPDATE sessions_app_message SET content = 'rewritten' WHERE id = %s",
        "DELETE FROM sessions_app_message WHERE id = %s",
    ):
        with pytest.raises(DatabaseError, match="append-only"):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql, [message.id])
    message.refresh_from_db()
    assert message.content == "the order number is 9527"


def test_messages_refuse_orm_update():
    message = MessageFactory()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        type(message).objects.filter(pk=message.pk).update(content="x")


def test_audit_entries_refuse_update_and_delete():
    from tests.support.factories import AuditEntryFactory

    entry = AuditEntryFactory()
    for sql in (
        "UPDATE approvals_app_auditentry SET action = 'forged' WHERE id = %s",
        "DELETE FROM approvals_app_auditentry WHERE id = %s",
    ):
        with pytest.raises(DatabaseError, match="append-only"):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql, [entry.id])
