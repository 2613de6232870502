"""One customer cannot starve the others (issue 27, finding 4): 50 concurrent posts by one customer to
one session — each waiting on the session's row lock — answered 500 (PoolTimeout) and made another
customer wait half a minute. Through a real web server with a pool of 4: none of the burst is a 500
(each is done, queued, or told to try again with Retry-After), and the other customer's requests
meanwhile answer normally. And the posts of one session take turns before they wait on its row, giving
their connection back while they wait: with no per-caller share at all, the burst holds one
connection, not the pool."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from tests.support.factories import ApiKeyFactory, SessionFactory, UserFactory
from tests.support.metrics import samples, value
from tests.support.processes import ProcessGroup, wait_for
from tests.support.processes import test_database_url as database_url

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


class Burst:
    """A web server of its own (the group's environment), a greedy customer with a session and a
    patient one, and the session's row held by another transaction (as a long one of the session
    would hold it) until `release`."""

    def __init__(self, group: ProcessGroup):
        self.group = group
        group.start_web()
        greedy, patient = UserFactory(username="greedy"), UserFactory(username="patient")
        self.session = SessionFactory(owner=greedy)
        self.greedy_key, self.patient_key = ApiKeyFactory(owner=greedy).secret, ApiKeyFactory(owner=patient).secret
        self.holder = psycopg.connect(database_url())
        self.holder.execute("SELECT 1 FROM sessions_app_session WHERE id = %s FOR UPDATE", [self.session.pk])

    def send(self, secret: str, method: str, path: str, body=None) -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=600, headers={"Authorization": f"Bearer {secret}"}) as http:
            return http.request(method, f"{self.group.base_url}/api/v1{path}", json=body)

    def post(self, n: int) -> httpx.Response:
        return self.send(self.greedy_key, "POST", f"/sessions/{self.session.pk}/messages", {"content": f"refund {n}"})

    def clicks(self) -> list[int]:
        """The other customer, one request at a time, as a person clicks."""
        return [self.send(self.patient_key, "GET", "/me").status_code for _ in range(10)]

    def release(self) -> None:
        self.holder.commit()
        self.holder.close()


def _waiting_on_a_lock() -> int:
    with psycopg.connect(database_url(), autocommit=True) as probe:
        return probe.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                             "AND datname = current_database()").fetchone()[0]


def _burst(name: str, env: dict[str, str]):
    group = ProcessGroup(name=name)
    group.base_env |= env
    burst = None
    try:
        burst = Burst(group)
        yield burst
    finally:
        if burst is not None:
            burst.holder.close()  # a failed wait must not leave the session's row locked for the cleanup
        group.stop_all()


@pytest.fixture
def shared_pool():
    yield from _burst("fair-share", {"WARDEN_DB_POOL_SIZE": "4"})


@pytest.fixture
def turns_only():
    # No per-caller share: the turn alone must keep the pool of 4 free for others.
    yield from _burst("session-turn", {"WARDEN_DB_POOL_SIZE": "4", "WARDEN_DB_FAIR_SHARE": "0",
                                       "WARDEN_SESSION_TURN_WAIT": "600"})


def test_fifty_concurrent_posts_by_one_customer_are_never_a_500_and_others_go_on(shared_pool):
    # The post whose turn it is waits on the held row, holding a connection; the burst's others wait
    # for their turn or are beyond the caller's share.
    with ThreadPoolExecutor(max_workers=50) as pool:
        burst = [pool.submit(shared_pool.post, n) for n in range(50)]
        wait_for(lambda: _waiting_on_a_lock() >= 1, timeout=60, message="the burst to wait on the session")
        # Answered at once from the connections the burst may not take.
        others = shared_pool.clicks()
        shared_pool.release()
        burst = [f.result() for f in burst]
    statuses = [response.status_code for response in burst]
    assert 500 not in statuses and set(statuses) <= {201, 202, 503}, statuses
    assert statuses.count(201) == 1  # the first starts the run; the others queue or try again
    assert all(int(response.headers.get("Retry-After") or 0) >= 1 for response in burst if response.status_code == 503)
    assert others == [200] * 10


def test_a_sessions_posts_wait_for_their_turn_without_a_connection(turns_only):
    def waiting_for_a_turn() -> float:
        with httpx.Client(trust_env=False, timeout=60) as http:
            found = samples(http.get(f"{turns_only.group.base_url}/metrics").text)
        return value(found, "warden_session_turn_waiting") or 0

    with ThreadPoolExecutor(max_workers=30) as pool:
        burst = [pool.submit(turns_only.post, n) for n in range(30)]
        # Every post of the burst is in: one waits on the session's row, 29 for their turn.
        wait_for(lambda: waiting_for_a_turn() == 29, timeout=120, message="29 posts to wait for their turn")
        assert _waiting_on_a_lock() == 1
        others = turns_only.clicks()
        turns_only.release()
        statuses = [f.result().status_code for f in burst]
    assert others == [200] * 10
    assert sorted(statuses) == [201] + [202] * 29, statuses  # one started the run; the rest are queued for it
    assert waiting_for_a_turn() == 0
