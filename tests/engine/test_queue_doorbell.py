"""The task queue's doorbell (engine/broker.py, issue 16): a queued task rings a PostgreSQL NOTIFY
that wakes an idle cluster, so pickup does not wait for a poll. The fallback poll is set far
beyond every wait here (120 s against 60 s bounds): whatever is picked up was picked up by the
bell. Nothing asserts how long anything took."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.models import OrmQ

from approvals_app.models import Approval
from engine.actions.approvals import approval_decide
from engine.actions.messages import message_post
from engine.broker import LISTENER_APPLICATION_NAME, DoorbellBroker
from runs_app.models import Run, RunEvent, RunStatus, WaitReason
from engine.actions.sessions import session_open
from tests.support.factories import UserFactory
from tests.support.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FALLBACK_POLL = "120"


@pytest.fixture
def broker(transactional_db, settings):
    settings.WARDEN_Q_FALLBACK_POLL_SECONDS = float(FALLBACK_POLL)
    broker = DoorbellBroker(list_key=f"doorbell-{uuid.uuid4().hex[:12]}")
    yield broker
    broker.listener_close()


def _listener_pids() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [LISTENER_APPLICATION_NAME],
        )
        return [row[0] for row in cursor.fetchall()]


def _dequeue_until_delivered(broker, *, timeout: float = 60.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tasks = broker.dequeue()
        if tasks:
            return tasks
    raise AssertionError("nothing was delivered")


def test_the_doorbell_queues_the_orm_brokers_row_and_either_broker_claims_the_others(broker):
    orm = ORM(list_key=broker.list_key)
    ours = OrmQ.objects.get(pk=broker.enqueue("signed-task"))
    assert orm.dequeue() == [(ours.pk, "signed-task")]
    theirs = OrmQ.objects.get(pk=orm.enqueue("signed-task"))
    assert (ours.key, ours.payload) == (theirs.key, theirs.payload) == (broker.list_key, "signed-task")
    assert ours.lock <= theirs.lock
    assert broker.dequeue() == [(theirs.pk, "signed-task")]
    # A claimed row is handed out again by neither (not before `retry` runs out).
    assert broker.dequeue() is None and orm.dequeue() is None


def test_acknowledging_a_task_deletes_its_row_alone_and_again_is_harmless(broker):
    done, waiting = broker.enqueue("done-task"), broker.enqueue("waiting-task")
    broker.acknowledge(done)
    assert list(OrmQ.objects.filter(key=broker.list_key).values_list("pk", flat=True)) == [waiting]
    broker.acknowledge(done)  # a second acknowledgement (the monitor's after a redelivery) finds nothing
    with transaction.atomic():  # inside a caller's transaction it is part of that transaction
        broker.acknowledge(waiting)
        transaction.set_rollback(True)
    assert list(OrmQ.objects.filter(key=broker.list_key).values_list("pk", flat=True)) == [waiting]


def test_a_queued_task_wakes_a_dequeue_waiting_on_an_empty_queue(broker):
    idle = threading.Event()
    delivered = []

    def pusher():
        try:
            assert broker.dequeue() is None  # listening, the queue looked at and found empty
            idle.set()
            delivered.extend(_dequeue_until_delivered(broker))
        finally:
            connection.close()

    thread = threading.Thread(target=pusher)
    thread.start()
    assert idle.wait(timeout=60)
    task_id = DoorbellBroker(list_key=broker.list_key).enqueue("wake-up")
    thread.join(timeout=60)
    assert delivered == [(task_id, "wake-up")]


def test_a_task_queued_inside_a_transaction_rings_when_that_commits_as_durably_as_the_rest(broker):
    assert broker.dequeue() is None
    with transaction.atomic():
        task_id = DoorbellBroker(list_key=broker.list_key).enqueue("in-a-transaction")
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on"
        assert broker.dequeue() is None  # neither visible nor rung before the commit
    assert _dequeue_until_delivered(broker) == [(task_id, "in-a-transaction")]


def test_a_row_that_is_not_due_yet_is_claimed_when_it_falls_due_without_a_bell(broker):
    """As a claim that ran out (`retry`) is, or a row stamped by a host whose clock runs ahead."""
    row = OrmQ.objects.create(key=broker.list_key, payload="later", lock=timezone.now() + timedelta(seconds=1))
    assert _dequeue_until_delivered(broker) == [(row.pk, "later")]


def test_a_killed_listener_reconnects_and_still_delivers(broker, caplog):
    assert broker.dequeue() is None
    (listener,) = _listener_pids()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [listener])
    wait_for(lambda: listener not in _listener_pids(), message="the listener's backend to end")
    # Queued while nobody listens: its bell is lost, the reconnected listener looks at the queue.
    lost_bell = broker.enqueue("while-deaf")
    assert _dequeue_until_delivered(broker) == [(lost_bell, "while-deaf")]
    assert any("database connection lost" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    (reconnected,) = _listener_pids()
    assert reconnected != listener
    # And the new listener hears the next bell.
    rung = broker.enqueue("after-reconnect")
    assert _dequeue_until_delivered(broker) == [(rung, "after-reconnect")]


# --- real clusters --------------------------------------------------------------------------------


def _post(text: str) -> Run:
    user = UserFactory()
    session = session_open(owner=user, title="doorbell")
    return message_post(session=session, content=text, acting_user=user).run


def _status(run_id) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run_id)


def _claims(run_id) -> int:
    return RunEvent.objects.filter(run_id=run_id, type="run_status", payload__status="running", payload__phase="preparing_context").count()


def _doorbell_cluster(procs):
    return procs.start_workers(env={"WARDEN_Q_DOORBELL": "1", "WARDEN_Q_FALLBACK_POLL_SECONDS": FALLBACK_POLL})


@pytest.mark.processes
def test_messages_posted_to_an_idle_cluster_are_picked_up_by_the_bell(procs):
    _doorbell_cluster(procs)
    # The first run may be found by the cluster's first look; each later one is posted to a
    # cluster that has gone idle after the run before it, so only its bell can wake it.
    for n in range(3):
        run = _post(f"please run noop {n + 1}")
        wait_for(lambda: _status(run.id) in ("completed", "failed"), timeout=60, message=f"run {n + 1} to finish")
        assert _status(run.id) == RunStatus.COMPLETED


@pytest.mark.processes
def test_an_approval_wakes_the_idle_cluster_to_resume_the_run(procs, demo_world, operator):
    procs.start_sim()  # the simulated payment service the refund tools call
    _doorbell_cluster(procs)
    run = _post("Check order 9527 and refund it if it's eligible")
    wait_for(lambda: _status(run.id) in ("waiting", "completed", "failed"), timeout=60, message="the run to wait for approval")
    assert Run.objects.filter(pk=run.id, status=RunStatus.WAITING, wait_reason=WaitReason.APPROVAL).exists()
    approval_decide(approval=Approval.objects.get(run_id=run.id), decision="approve", note="doorbell", acting_user=operator)
    wait_for(lambda: _status(run.id) in ("completed", "failed"), timeout=60, message="the approved run to finish")
    assert _status(run.id) == RunStatus.COMPLETED
    assert _claims(run.id) == 2
