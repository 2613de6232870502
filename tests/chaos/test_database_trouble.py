"""Terminating the workers' database connections mid-run loses and duplicates nothing."""

import time
from collections import Counter

import pytest
from django.db import connection

from runs_app.models import RunStatus
from tests.support.chaos import all_terminal, approve_pending, post, refund_outcomes_are_honest, seqs_gap_free
from tests.support.processes import wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def _terminate_backends_of(application_names: list[str]) -> Counter:
    """Every connection of the processes the test started (by their application_name): not the test
    process's own, whose pooled channel-layer connections then stalled its next in-process decision
    for about a minute in CI (it waited on that pool) — trouble of the test, not of Warden."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name, count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = ANY(%s) "
            "GROUP BY application_name",
            [application_names],
        )
        return Counter(dict(cursor.fetchall()))


def test_terminated_connections_mid_run_lose_and_duplicate_nothing(procs, demo_world, desk_operator):
    procs.keep_shared = False  # the shared web server's and simulator's connections are terminated too
    procs.start_web(simulator=True)
    procs.base_env["PGAPPNAME"] = "database-trouble"  # the workers' and the sweeper's connections
    procs.start_workers(workers=2)
    procs.start_sweeper()
    names = ["database-trouble", procs.web_application_name, "shared-sim"]
    runs = [post(f"Check order {n} and refund it if it's eligible", provider_options={"delay": 0.05}) for n in (1001, 1002, 1003)]
    runs += [post("please run noop 5", provider_options={"delay": 0.05}) for _ in range(2)]
    run_ids = [r.id for r in runs]
    terminated = Counter()
    for _ in range(4):
        time.sleep(1.0)
        approve_pending(desk_operator)
        terminated += _terminate_backends_of(names)
    assert terminated["database-trouble"] > 0, terminated  # the workers' and the sweeper's connections

    def settled():
        approve_pending(desk_operator)
        return all_terminal(run_ids)

    wait_for(settled, timeout=150, interval=0.5, message="every run to finish after the database trouble")
    from runs_app.models import Run

    assert Run.objects.filter(pk__in=run_ids).count() == len(run_ids)
    assert refund_outcomes_are_honest(run_ids) == []
    noop_runs = Run.objects.filter(pk__in=run_ids[3:])
    assert all(r.status == RunStatus.COMPLETED for r in noop_runs), [(r.status, r.error_code, r.error_detail) for r in noop_runs]
    for run_id in run_ids:
        assert seqs_gap_free(run_id)
