"""A worker process's heartbeat thread opens its connection before the process's first run switches
the default alias to a pool (engine/executor.py). Django then took that plain connection for a
pooled one and failed to give it back, and a heartbeat that failed (the database away) ended the
thread with that exception: the process stopped beating. The thread closes such a connection as
what it is, and goes on."""

import threading

import pytest
from django.db import connection, connections

from operations import liveness

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_connection_opened_before_the_pool_switch_is_closed_without_failing():
    failures, closed = [], []
    opened, switched = threading.Event(), threading.Event()

    def heartbeat_thread():
        try:
            connection.ensure_connection()
            raw = connection.connection
            opened.set()
            switched.wait(10)
            liveness._connection_close()
            closed.append((connection.connection is None, raw.closed))
        except Exception as error:  # noqa: BLE001 - what the test looks for
            failures.append(error)
        finally:
            opened.set()

    settings_dict = connections.settings["default"]
    options = settings_dict["OPTIONS"]
    thread = threading.Thread(target=heartbeat_thread)
    thread.start()
    try:
        assert opened.wait(10)
        # What engine.executor._pool_connections does to the process's settings on its first run.
        settings_dict["OPTIONS"] = {**options, "pool": {"min_size": 1, "max_size": 2}}
        switched.set()
        thread.join(10)
    finally:
        settings_dict["OPTIONS"] = options
        switched.set()
        thread.join(10)
    assert failures == [] and closed == [(True, True)]
