"""Input posted in bursts to a session whose run is active never deadlocks the web request against
the worker driving the run, nor against the other web paths that change the run — an operator's
decision, a cancel (issue 12, finding 3: 15 messages 30 ms apart gave 2 of 60
`500 internal_error`; PostgreSQL logged `deadlock detected` between the request's
`UPDATE runs_app_run SET event_seq` and a worker's commit).

Real processes: the web server (daphne) answering the API, two django-q2 workers driving the
runs, the sweeper. PostgreSQL counts every deadlock it breaks in pg_stat_database.deadlocks, per
database; the test database's count must not move. The lock modes and orders behind it are
checked one by one in tests/foundation/test_lock_order.py."""

import threading
import time

import httpx
import pytest
from django.contrib.auth.models import Permission
from django.db import connection

from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import ACTIVE_STATUSES, Run, RunStatus, WaitReason
from engine.actions.sessions import session_open
from tests.support.factories import ApiKeyFactory, UserFactory
from tests.support.processes import wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# Marks the connections of the processes this test starts (libpq reads PGAPPNAME), so the test
# can wait for every one of them to be gone: a backend reports its counts when it exits.
APPLICATION = "warden-lock-order-test"
BURST = 15
SPACING_SECONDS = 0.03
SESSIONS = 4  # bursts at once, each to its own session
# What the customer types while the run works: no number and no switch phrase, so the classifier
# (mode auto) and the explicit modes all keep the run going.
TEXTS = ("keep going please", "and be thorough", "take your time")


def _deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def _children_connected() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APPLICATION])
        return cursor.fetchone()[0]


def _active_run(session) -> Run | None:
    return Run.objects.filter(session=session, status__in=ACTIVE_STATUSES).first()


class Customer:
    """One customer with one session, speaking to the real web server."""

    def __init__(self, base_url: str, index: int):
        self.user = UserFactory(username=f"burst{index}")
        self.session = session_open(owner=self.user, title=f"bursts {index}")
        self.path = f"/api/v1/sessions/{self.session.pk}/messages"
        self.http = httpx.Client(base_url=base_url, timeout=60, trust_env=False,
                                 headers={"Authorization": f"Bearer {ApiKeyFactory(owner=self.user).secret}"})

    def say(self, content: str, mode: str = "auto") -> int:
        return self.http.post(self.path, json={"content": content, "mode": mode}).status_code

    def burst(self, mode: str, *, midway=None) -> list[int]:
        """BURST posts, each started SPACING_SECONDS after the previous one (so they overlap);
        `midway` (another request, e.g. an operator's decision) goes out in the middle."""
        statuses: list[int] = []
        lock = threading.Lock()

        def send(request) -> None:
            status = request()
            with lock:
                statuses.append(status)

        threads = []
        for i in range(BURST):
            requests = [lambda i=i: self.say(TEXTS[i % len(TEXTS)], mode)]
            if midway is not None and i == BURST // 2:
                requests.append(midway)
            for request in requests:
                thread = threading.Thread(target=send, args=(request,))
                thread.start()
                threads.append(thread)
            time.sleep(SPACING_SECONDS)
        for thread in threads:
            thread.join()
        return statuses


def _in_parallel(jobs) -> list[int]:
    results: list[list[int]] = [[] for _ in jobs]

    def run(i, job):
        results[i] = job()

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [status for statuses in results for status in statuses]


def _operator(base_url: str) -> httpx.Client:
    user = UserFactory(username="burst-operator", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval", "change_run"]))
    return httpx.Client(base_url=base_url, timeout=60, trust_env=False,
                        headers={"Authorization": f"Bearer {ApiKeyFactory(owner=user).secret}"})


def _running(customers) -> None:
    """Each customer's session has a run a worker is driving (a long one: fifteen tool rounds)."""
    for customer in customers:
        def running(c=customer) -> bool:
            run = _active_run(c.session)
            if run is None:
                assert c.say("please run noop 15", mode="queue") in (201, 202)
                return False
            return run.status == RunStatus.RUNNING

        wait_for(running, timeout=120, message="a running run")


def _waiting_for_approval(customers, first_order: int) -> list[Approval]:
    """Each customer's (fresh) session asks to refund an order of its own and waits for an operator."""
    for index, customer in enumerate(customers):
        assert customer.say(f"Check order {first_order + index} and refund it if it's eligible") == 201
    approvals = []
    for customer in customers:
        wait_for(lambda c=customer: Run.objects.filter(session=c.session, status=RunStatus.WAITING,
                                                       wait_reason=WaitReason.APPROVAL).exists(),
                 timeout=120, message="the refund to wait for approval")
        approvals.append(Approval.objects.get(run__session=customer.session, status=ApprovalStatus.PENDING))
    return approvals


def test_bursts_of_input_to_an_active_run_never_deadlock(procs, demo_world):
    # The bursts are to meet on the session's lock: a caller's fair share of the connections
    # (config/fair_share.py, which would answer most of each burst 503 at once) is not under test here.
    procs.base_env.update(PGAPPNAME=APPLICATION, WARDEN_SCRIPTED_DELAY_SECONDS="0.02", WARDEN_DB_FAIR_SHARE="0")
    procs.keep_shared = False  # every connection of the processes is counted below
    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    customers = [Customer(procs.base_url, i) for i in range(SESSIONS)]
    rejected = [Customer(procs.base_url, SESSIONS + i) for i in range(SESSIONS)]
    approved = [Customer(procs.base_url, 2 * SESSIONS + i) for i in range(SESSIONS)]
    operator = _operator(procs.base_url)

    def decide(approval: Approval, decision: str):
        return lambda: operator.post(f"/api/v1/approvals/{approval.pk}/decision",
                                     json={"decision": decision, "note": "lock order test"}).status_code

    def cancel(run: Run | None):
        if run is None:  # it ended before its burst began: nothing to cancel
            return None
        return lambda: operator.post(f"/api/v1/runs/{run.pk}/cancel", json={"reason": "lock order test"}).status_code

    before = _deadlocks()
    statuses: list[int] = []
    # While a worker drives the run (the finding): input the classifier judges, and supplements.
    for mode in ("auto", "supplement", "auto"):
        _running(customers)
        statuses += _in_parallel([lambda c=c: c.burst(mode) for c in customers])
    # While the run waits for an operator who rejects, or approves, it mid-burst.
    for group, decision, first_order in ((rejected, "reject", 1001), (approved, "approve", 1005)):
        approvals = _waiting_for_approval(group, first_order)
        statuses += _in_parallel([lambda c=c, a=a: c.burst("auto", midway=decide(a, decision))
                                  for c, a in zip(group, approvals)])
    # While an operator cancels the running run mid-burst.
    _running(customers)
    statuses += _in_parallel([lambda c=c, r=_active_run(c.session): c.burst("auto", midway=cancel(r)) for c in customers])

    assert not [status for status in statuses if status >= 500], statuses
    procs.stop_all()
    wait_for(lambda: _children_connected() == 0, message="the processes' database connections to close")
    assert _deadlocks() - before == 0
