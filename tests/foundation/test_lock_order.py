"""The lock order that keeps posting input, decisions, reconciliation and cancellation from
deadlocking each other or a worker (issue 12, finding 3; PITFALLS.md):

- every change made outside a run's worker takes the session's row lock first, before anything of
  the run — as posting input and ending a run do — so no two of them wait on each other in
  opposite orders;
- that lock is FOR NO KEY UPDATE: it serialises those changes but lets through the KEY SHARE lock a
  concurrent commit's foreign-key checks take on the session row (a message or a run pointing at
  it, a run row updated twice) — FOR UPDATE would block that commit while waiting for its run row.

Each action runs in a thread while another connection holds the session's row: it must wait for
exactly that lock, holding nothing of the run meanwhile. The real-process reproduction is
tests/engine/test_lock_order.py."""

import threading

import psycopg
import pytest
from django.contrib.auth.models import Permission
from django.db import connection, transaction

from engine.actions.approvals import approval_decide, approval_expire
from engine.actions.cancel import run_cancel_request
from engine.actions.messages import message_post
from engine.actions.reconciliation import tool_call_resolve
from sessions_app.services import session_lock
from tests.support.api import build_world
from tests.support.factories import UserFactory
from tests.support.processes import test_database_url as database_url_of_the_tests
from tests.support.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _operator():
    user = UserFactory(username="lock-operator", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval", "reconcile_toolcall", "change_run"]))
    return user


# What each web path (and the sweeper's expiry) does to a customer's world: (session, run, action).
ACTIONS = {
    "post input to an active run": lambda w, op: (
        w.approval_run.session_id, w.approval_run.pk,
        lambda: message_post(session=w.approval_run.session, content="the order is 9527", acting_user=w.session.owner)),
    "cancel": lambda w, op: (
        w.approval_run.session_id, w.approval_run.pk,
        lambda: run_cancel_request(run=w.approval_run, acting_user=w.session.owner, reason="changed my mind")),
    "approve": lambda w, op: (
        w.operator_run.session_id, w.operator_run.pk,
        lambda: approval_decide(approval=w.operator_approval, decision="approve", acting_user=op)),
    "reject": lambda w, op: (
        w.operator_run.session_id, w.operator_run.pk,
        lambda: approval_decide(approval=w.operator_approval, decision="reject", note="no", acting_user=op)),
    "expire": lambda w, op: (
        w.operator_run.session_id, w.operator_run.pk, lambda: approval_expire(approval=w.operator_approval)),
    "resolve": lambda w, op: (
        w.unknown_run.session_id, w.unknown_run.pk,
        lambda: tool_call_resolve(tool_call=w.unknown_call, applied=False, evidence="ledger: nothing", acting_user=op)),
}


@pytest.mark.parametrize("name", list(ACTIONS))
def test_a_change_from_outside_the_worker_locks_the_session_before_the_run(name):
    world = build_world(UserFactory(username="customer"))
    session_id, run_id, action = ACTIONS[name](world, _operator())
    url = database_url_of_the_tests()
    outcome: dict = {}

    def act() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cursor.fetchone()[0]
            action()
            outcome["done"] = True
        except Exception as error:  # reported below
            outcome["error"] = error
        finally:
            connection.close()

    with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as observer:
        holder.execute('SELECT 1 FROM "sessions_app_session" WHERE "id" = %s FOR NO KEY UPDATE', [session_id])
        thread = threading.Thread(target=act)
        thread.start()

        def blocked_by_holder() -> bool:
            if "pid" not in outcome:
                return False
            (blockers,) = observer.execute("SELECT pg_blocking_pids(%s)", [outcome["pid"]]).fetchone()
            return holder.info.backend_pid in blockers

        wait_for(lambda: not thread.is_alive() or blocked_by_holder(), message=f"{name} to reach the session's lock")
        assert thread.is_alive(), f"{name} finished without the session's lock: {outcome}"
        # Waiting there, it holds nothing of the run: a worker (or anyone) may still write it.
        observer.execute('SELECT 1 FROM "runs_app_run" WHERE "id" = %s FOR NO KEY UPDATE NOWAIT', [run_id])
        holder.rollback()
    thread.join()
    assert outcome.get("done") and "error" not in outcome, outcome


def test_the_session_lock_serialises_writers_but_lets_foreign_key_checks_through():
    world = build_world(UserFactory(username="customer"))
    with psycopg.connect(database_url_of_the_tests(), autocommit=True) as other, transaction.atomic():
        session_lock(session_id=world.session.pk)
        # What a concurrent commit's foreign-key check asks for (a message or run pointing at
        # the session): granted at once.
        other.execute('SELECT 1 FROM "sessions_app_session" WHERE "id" = %s FOR KEY SHARE NOWAIT', [world.session.pk])
        # Another poster (or a run ending) waits its turn.
        with pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute('SELECT 1 FROM "sessions_app_session" WHERE "id" = %s FOR NO KEY UPDATE NOWAIT', [world.session.pk])
