"""One customer cannot starve the others (issue 27, finding 4): 50 concurrent posts by one customer to
one session — each waiting on the session's row lock — answered 500 (PoolTimeout) and made another
customer wait half a minute. Through a real web server with a pool of 4: none of the burst is a 500
(each is done, queued, or told to try again with Retry-After), and the other customer's requests
meanwhile answer normally."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from tests.support.factories import ApiKeyFactory, SessionFactory, UserFactory
from tests.support.processes import ProcessGroup, wait_for
from tests.support.processes import test_database_url as database_url

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_fifty_concurrent_posts_by_one_customer_are_never_a_500_and_others_go_on():
    group = ProcessGroup(name="fair-share")
    group.base_env |= {"WARDEN_DB_POOL_SIZE": "4"}
    try:
        group.start_web()
        greedy, other = UserFactory(username="greedy"), UserFactory(username="patient")
        session = SessionFactory(owner=greedy)
        greedy_key, other_key = ApiKeyFactory(owner=greedy).secret, ApiKeyFactory(owner=other).secret

        def send(secret, method, path, body=None):
            with httpx.Client(trust_env=False, timeout=120, headers={"Authorization": f"Bearer {secret}"}) as http:
                response = http.request(method, f"{group.base_url}/api/v1{path}", json=body)
                return response.status_code, response.headers.get("Retry-After")

        # The session's row is held (as a long transaction of the session would): every post of the
        # burst that gets a connection waits on it, holding the connection.
        holder = psycopg.connect(database_url())
        holder.execute("SELECT 1 FROM sessions_app_session WHERE id = %s FOR UPDATE", [session.pk])

        def waiting_on_the_session() -> int:
            with psycopg.connect(database_url(), autocommit=True) as probe:
                return probe.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                     "AND datname = current_database()").fetchone()[0]

        with ThreadPoolExecutor(max_workers=50) as pool:
            burst = [pool.submit(send, greedy_key, "POST", f"/sessions/{session.pk}/messages", {"content": f"refund {n}"})
                     for n in range(50)]
            wait_for(lambda: waiting_on_the_session() >= 2, timeout=60, message="the burst to wait on the session")
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
        group.stop_all()
