"""A write PostgreSQL rolls back because of a concurrent one — a deadlock or a serialization
failure — is answered 503 with Retry-After and the JSON error body, never a 500 (issue 12,
finding 3). The engine's lock order keeps deadlocks away (tests/engine/test_lock_order.py); this is
what a client sees should the database abandon a write anyway.

The failure is PostgreSQL's own: the action an endpoint calls is replaced by one that raises the
SQLSTATE in the database (deadlocks cannot be scheduled from outside), so the error reaches the
API exactly as a real one would, through psycopg and Django."""

import pytest
from django.db import connection, transaction

from runs_app.models import Run
from sessions_app.models import Message, PendingInput

pytestmark = pytest.mark.django_db

# Class 40 (rolled back), class 08 (the connection failed), class 57 (terminated by an operator,
# the server shutting down or not yet accepting): each is "try again", never a 500.
ROLLBACKS = ["deadlock_detected", "serialization_failure", "connection_failure", "admin_shutdown", "cannot_connect_now"]


def _rolled_back_by_postgres(condition: str):
    def action(**kwargs):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"DO $$ BEGIN RAISE EXCEPTION 'injected by the test' USING ERRCODE = '{condition}'; END $$")

    return action


def _answered_try_again(response) -> dict:
    assert response.status_code == 503, response.content
    assert response["Content-Type"].startswith("application/json")
    assert int(response["Retry-After"]) >= 1
    body = response.json()
    assert body["code"] == "try_again" and "retry" in body["message"].lower()
    return body


@pytest.mark.parametrize("condition", ROLLBACKS)
def test_a_message_post_the_database_rolled_back_is_503_with_retry_after(world, alice_api, monkeypatch, condition):
    monkeypatch.setattr("api.sessions.message_post", _rolled_back_by_postgres(condition))
    messages, pending = Message.objects.count(), PendingInput.objects.count()
    _answered_try_again(alice_api.post(f"/sessions/{world.session.pk}/messages", {"content": "refund order 9527"}))
    assert (Message.objects.count(), PendingInput.objects.count()) == (messages, pending)
    # The database is usable again at once: the same request, unpatched, goes through.
    monkeypatch.undo()
    assert alice_api.post(f"/sessions/{world.session.pk}/messages", {"content": "refund order 9527"}).status_code == 201


@pytest.mark.parametrize("condition", ROLLBACKS)
def test_a_cancel_the_database_rolled_back_is_503(world, alice_api, monkeypatch, condition):
    monkeypatch.setattr("api.runs.run_cancel_request", _rolled_back_by_postgres(condition))
    _answered_try_again(alice_api.post(f"/runs/{world.approval_run.pk}/cancel", {"reason": "changed my mind"}))
    assert Run.objects.get(pk=world.approval_run.pk).cancel_requested_at is None


@pytest.mark.parametrize("condition", ROLLBACKS)
def test_a_decision_the_database_rolled_back_is_503(world, alice_api, monkeypatch, condition):
    monkeypatch.setattr("api.approvals.approval_decide", _rolled_back_by_postgres(condition))
    _answered_try_again(alice_api.post(f"/approvals/{world.user_approval.pk}/decision", {"decision": "approve"}))


@pytest.mark.parametrize("condition", ROLLBACKS)
@pytest.mark.parametrize(("endpoint", "action", "body"), [
    ("resolve", "api.tool_calls.tool_call_resolve", {"applied": True, "evidence": "ledger entry L-1"}),
    ("reconcile", "api.tool_calls.tool_call_reconcile_auto", None),
])
def test_a_reconciliation_the_database_rolled_back_is_503(world, operator_api, monkeypatch, condition, endpoint, action, body):
    monkeypatch.setattr(action, _rolled_back_by_postgres(condition))
    _answered_try_again(operator_api.post(f"/tool-calls/{world.unknown_call.pk}/{endpoint}", body))


@pytest.mark.django_db(transaction=True)
def test_a_post_whose_database_connection_is_terminated_is_503_and_the_next_one_goes_through(world, alice_api, monkeypatch):
    """Issue 27, finding 6, as it was found: pg_terminate_backend while a post is in flight — the
    real thing, the server ending this very connection mid-request."""
    def terminated(**kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    monkeypatch.setattr("api.sessions.message_post", terminated)
    messages, pending = Message.objects.count(), PendingInput.objects.count()
    _answered_try_again(alice_api.post(f"/sessions/{world.session.pk}/messages", {"content": "refund order 9527"}))
    connection.close()  # this test shares the request's connection: open a fresh one
    assert (Message.objects.count(), PendingInput.objects.count()) == (messages, pending)
    monkeypatch.undo()
    assert alice_api.post(f"/sessions/{world.session.pk}/messages", {"content": "refund order 9527"}).status_code == 201


def test_other_database_errors_stay_a_logged_500(world, alice_api, monkeypatch):
    """Only a rollback the client can retry is a 503; anything else is a bug."""
    monkeypatch.setattr("api.sessions.message_post", _rolled_back_by_postgres("insufficient_resources"))
    response = alice_api.post(f"/sessions/{world.session.pk}/messages", {"content": "hi"})
    assert response.status_code == 500 and response.json()["code"] == "internal_error"
    assert "Retry-After" not in response
