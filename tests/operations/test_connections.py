"""Web processes reuse their database connections (docs/OPERATIONS.md, "Database connections"):
twenty requests that each query the database open no twenty connections."""

import httpx
import pytest
from django.db import connection

from tests.support.processes import ProcessGroup, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def _sessions_opened() -> int:
    """Connections ever opened to the test database (PostgreSQL's cumulative statistics)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def test_a_web_process_serves_many_requests_on_few_connections(request):
    group = ProcessGroup(name=request.node.name[:60])
    try:
        group.start_web()
        with httpx.Client(base_url=group.base_url, timeout=30, trust_env=False) as client:
            wait_for(lambda: client.get("/readyz").status_code in (200, 503), message="a first answer")
            before = _sessions_opened()
            for _ in range(20):
                assert client.get("/readyz").status_code == 503  # no workers here; the database was asked each time
            after = _sessions_opened()
        assert after - before < 5, f"{after - before} connections opened for 20 requests"
    finally:
        group.stop_all()
