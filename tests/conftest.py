import os

import pytest
from django.test import override_settings

from tests.support import event_contract
from tests.support.simulator import InProcessSimulator

_skipped: list[str] = []


_deselected_for_redis: list[str] = []


def pytest_collection_modifyitems(config, items):
    """Tests marked `redis` exist only for the Redis-backed paths. Without REDIS_URL — a fresh
    laptop, as the README's `make test` promises to work on — they are deselected, not skipped
    (CI runs them in a pass of their own with REDIS_URL set: .ci/run)."""
    if os.environ.get("REDIS_URL"):
        return
    redis_only = [item for item in items if item.get_closest_marker("redis")]
    if redis_only:
        config.hook.pytest_deselected(items=redis_only)
        items[:] = [item for item in items if not item.get_closest_marker("redis")]
        _deselected_for_redis.extend(item.nodeid for item in redis_only)


def pytest_terminal_summary(terminalreporter):
    if _deselected_for_redis:
        terminalreporter.write_line(
            f"{len(_deselected_for_redis)} tests of the Redis-backed paths were deselected: REDIS_URL is unset "
            "(run them with REDIS_URL=redis://… make test PYTEST_ARGS='-m redis')."
        )


def pytest_runtest_logreport(report):
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    # In CI no test may be skipped: a skip there hides a missing dependency or feature.
    if os.environ.get("CI") and _skipped:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            reporter.write_line(f"CI forbids skipped tests; skipped: {', '.join(_skipped)}", red=True)
        session.exitstatus = 1


@pytest.fixture
def operator(db):
    from django.contrib.auth.models import Permission

    from tests.factories import UserFactory

    user = UserFactory(username="op", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval"]))
    user.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    return user


@pytest.fixture
def simulator(transactional_db):
    """The demo's simulated payment service on a server of its own in this process (its own
    port and URLconf, as in a deployment); the demo tools are pointed at it. Yields its base URL."""
    with InProcessSimulator() as sim, override_settings(WARDEN_SIM_BASE_URL=sim.url):
        yield sim.url


@pytest.fixture(scope="session", autouse=True)
def _events_match_their_contract(django_db_setup, django_db_blocker):
    """Every RunEvent the suite's runs emit — here or in the worker processes tests start — has a
    type and payload fields that docs/EVENTS.md documents; otherwise the session ends in an error."""
    from django.db import connection

    from runs_app.models import RunEvent

    if connection.settings_dict["NAME"] != connection.creation._get_test_db_name():
        # No test selected needs the database (pytest-django then creates none): nothing can emit.
        yield
        return
    seen: dict[str, set[str]] = {}
    manager = RunEvent.objects
    original = manager.bulk_create

    def recording_bulk_create(objs, *args, **kwargs):
        objs = list(objs)
        for event in objs:
            seen.setdefault(event.type, set()).update(event.payload or {})
        return original(objs, *args, **kwargs)

    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            cursor.execute(event_contract.INSTALL_TRIGGER)
    manager.bulk_create = recording_bulk_create
    yield
    manager.bulk_create = original
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            for kind, fields in event_contract.seen_in_database(cursor).items():
                seen.setdefault(kind, set()).update(fields)
    problems = event_contract.undocumented(seen)
    if problems:
        pytest.fail("docs/EVENTS.md does not cover what the runs emitted:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _no_heartbeat_outlives_the_suite(django_db_setup):
    """A test that imports the ASGI application in-process starts that process's web heartbeat
    thread (operations.liveness); it is stopped, and this thread's connections closed, before the
    test databases are dropped."""
    yield
    from django.db import connections

    from operations.liveness import heartbeat_thread_stop

    heartbeat_thread_stop()
    # Django drops each test database through its own alias's connection; another alias's open
    # connection to it (the PostgreSQL channel layer's mirror alias, which /readyz reads through)
    # would make the drop wait and fail.
    connections.close_all()
