"""The hot tables' row rules (config/row_rules.py): the database checks exactly the rules the code
states, through one function per table, and a broken rule is reported by its own name."""

import pytest
from django.db import IntegrityError, connection, transaction

from runs_app.models import RUN_ROW_RULES, STEP_ROW_RULES, Run, Step
from sessions_app.models import MESSAGE_ROW_RULES, Message
from tests.support.factories import RunFactory, SessionFactory, StepFactory, ToolCallFactory
from tools_app.models import TOOL_CALL_ROW_RULES, ToolCall

pytestmark = pytest.mark.django_db

TABLES = [(RUN_ROW_RULES, Run), (STEP_ROW_RULES, Step), (TOOL_CALL_ROW_RULES, ToolCall), (MESSAGE_ROW_RULES, Message)]


@pytest.mark.parametrize(("rules", "model"), TABLES, ids=lambda value: getattr(value, "function", ""))
def test_the_databases_function_is_the_codes_rules(rules, model):
    # A rule changed in the code without a migration fails here: the migration's frozen function
    # text must be rules.function_sql(model) as it now stands.
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [rules.function])
        assert cursor.fetchall() == [(rules.function_body(model),)], f"write a migration creating {rules.function}"
        # ...and it is what the table's one constraint calls; no rule is left as a CHECK of its own.
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'",
            [model._meta.db_table],
        )
        checks = dict(cursor.fetchall())
    assert f"{rules.function}(" in checks[rules.name]
    assert not {name for name, _ in rules.rules} & set(checks)


def _broken_rule(sql: str, params: list) -> str:
    with pytest.raises(IntegrityError) as raised, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
    diag = raised.value.__cause__.diag
    assert diag.message_primary == f'new row for relation "{diag.table_name}" violates check constraint "{diag.constraint_name}"'
    return diag.constraint_name


def test_a_broken_rule_is_reported_by_its_name():
    run = RunFactory()
    update = "UPDATE runs_app_run SET {} WHERE id = %s"
    assert _broken_rule(update.format("status = 'queued', phase = 'calling_model'"), [run.id]) == "run_queued_shape"
    assert _broken_rule(update.format("status = 'thinking'"), [run.id]) == "run_status_valid"
    assert _broken_rule(update.format("lease_token = -1"), [run.id]) == "run_lease_token_non_negative"
    step = StepFactory()
    assert _broken_rule("UPDATE runs_app_step SET status = 'completed' WHERE id = %s", [step.id]) == "step_finished_when_done"
    call = ToolCallFactory()
    assert _broken_rule("UPDATE tools_app_toolcall SET status = 'unknown', idempotency_key = 'k' WHERE id = %s",
                        [call.id]) == "tool_call_unknown_only_for_writes"
    session = SessionFactory()  # messages are append-only: the rule is met or broken as one is added
    assert _broken_rule(
        "INSERT INTO sessions_app_message (session_id, seq, role, content, tool_calls, tool_call_id, tool_name, created_at)"
        " VALUES (%s, 1, 'tool', 'x', '[]', '', '', now())", [session.id],
    ) == "message_tool_answers_a_call"


def test_a_null_passes_as_a_check_lets_it():
    # A CHECK passes a row whose condition is NULL, not false; the function must too. A NULL
    # lease_token makes the rule `lease_token >= 0` (and so the all-rules test) NULL: it passes.
    run = RunFactory()
    with connection.cursor() as cursor:
        cursor.execute("SELECT warden_run_row_valid(status, phase, wait_reason, lease_owner, lease_expires_at, finished_at,"
                       " error_code, outcome, NULL, model_calls, tokens_used) FROM runs_app_run WHERE id = %s", [run.id])
        assert cursor.fetchone() == (True,)
