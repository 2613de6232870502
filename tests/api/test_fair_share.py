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


def test_fifty_concurrent_posts_by_one_customer_are_never_a_500_and_others_go_on():
    group = ProcessGroup(name="fair-share")
    group.base_env |= {"WARDEN_DB_POOL_SIZE": "4"}
    holder = None
    try:
        group.start_web()
        greedy, other = UserFactory(username="greedy"), UserFactory(username="patient")
        session = SessionFactory(owner=greedy)
        greedy_key, other_key = ApiKeyFactory(owner=greedy).secret, ApiKeyFactory(owner=other).secret

        def send(secret, method, path, body=None):
            with httpx.Client(trust_env=False, timeout=120, headers={"Authorization": f"Bearer {secret}"}) as http:
                response = http.request(method, f"{group.base_url}/api/v1{path}", json=body)
                return response.status_code, response.headers.get("Retry-After")

        # The session's row is held (as a long transaction of the session would): the post whose
        # turn it is waits on it, holding a connection; the burst's others wait for their turn or
        # beyond the caller's share.
        holder = psycopg.connect(database_url())
        holder.execute("SELECT 1 FROM sessions_app_session WHERE id = %s FOR UPDATE", [session.pk])

        def waiting_on_the_session() -> int:
            with psycopg.connect(database_url(), autocommit=True) as probe:
                return probe.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                     "AND datname = current_database()").fetchone()[0]

        with ThreadPoolExecutor(max_workers=50) as pool:
            burst = [pool.submit(send, greedy_key, "POST", f"/sessions/{session.pk}/messages", {"content": f"refund {n}"})
                     for n in range(50)]
            wait_for(lambda: waiting_on_the_session() >= 1, timeout=60, message="the burst to wait on the session")
            # Meanwhile the other customer, one request at a time, as a person clicks: answered at
            # once from the connections the burst may not take.
            others = [send(other_key, "GET", "/me") for _ in range(10)]
            holder.commit()
            holder.close()
            burst = [f.result() for f in burst]
        statuses = [status for status, _ in burst]
        assert 500 not in statuses and set(statuses) <= {201, 202, 503}, statuses
        assert statuses.count(201) == 1  # the first starts the run; the others queue or try again
        assert all(retry_after and int(retry_after) >= 1 for status, retry_after in burst if status == 503)
        assert [status for status, _ in others] == [200] * 10
    finally:
        if holder is not None:
            holder.close()  # a failed wait must not leave the session's row locked for the cleanup
        group.stop_all()


def test_a_sessions_posts_wait_for_their_turn_without_a_connection():
    group = ProcessGroup(name="session-turn")
    # No per-caller share: the turn alone must keep the pool of 4 free for others.
    group.base_env |= {"WARDEN_DB_POOL_SIZE": "4", "WARDEN_DB_FAIR_SHARE": "0", "WARDEN_SESSION_TURN_WAIT": "600"}
    holder = None
    try:
        group.start_web()
        greedy, other = UserFactory(username="greedy"), UserFactory(username="patient")
        session = SessionFactory(owner=greedy)
        greedy_key, other_key = ApiKeyFactory(owner=greedy).secret, ApiKeyFactory(owner=other).secret

        def send(secret, method, path, body=None):
            with httpx.Client(trust_env=False, timeout=600, headers={"Authorization": f"Bearer {secret}"}) as http:
                return http.request(method, f"{group.base_url}/api/v1{path}", json=body).status_code

        def waiting_for_a_turn() -> float:
            with httpx.Client(trust_env=False, timeout=60) as http:
                found = samples(http.get(f"{group.base_url}/metrics").text)
            return value(found, "warden_session_turn_waiting") or 0

        def waiting_on_the_session() -> int:
            with psycopg.connect(database_url(), autocommit=True) as probe:
                return probe.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                     "AND datname = current_database()").fetchone()[0]

        holder = psycopg.connect(database_url())
        holder.execute("SELECT 1 FROM sessions_app_session WHERE id = %s FOR UPDATE", [session.pk])
        with ThreadPoolExecutor(max_workers=30) as pool:
            burst = [pool.submit(send, greedy_key, "POST", f"/sessions/{session.pk}/messages", {"content": f"refund {n}"})
                     for n in range(30)]
            # Every post of the burst is in: one waits on the session's row, 29 for their turn.
            wait_for(lambda: waiting_for_a_turn() == 29, timeout=120, message="29 posts to wait for their turn")
            assert waiting_on_the_session() == 1
            others = [send(other_key, "GET", "/me") for _ in range(10)]
            holder.commit()
            holder.close()
            statuses = [f.result() for f in burst]
        assert [status for status in others] == [200] * 10
        assert sorted(statuses) == [201] + [202] * 29, statuses  # one started the run; the rest are queued for it
        assert waiting_for_a_turn() == 0
    finally:
        if holder is not None:
            holder.close()  # a failed wait must not leave the session's row locked for the cleanup
        group.stop_all()
