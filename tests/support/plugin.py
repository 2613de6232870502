"""The suite's pytest plugin (registered in pyproject.toml's addopts: `-p tests.support.plugin`):
what every folder of tests shares — the run's policies (no skip in CI; the Redis tests deselected
without REDIS_URL), the checks that span the whole session (every event documented), and the
fixtures for real processes and the demo world. Folder conftests hold only what their own tests
use; helpers live in tests/support/ as plain modules, never imported from a conftest."""

import os

import pytest

_skipped: list[str] = []
_deselected_for_redis: list[str] = []


# --- the run's policies ---------------------------------------------------------------------------

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


# --- what spans the session ----------------------------------------------------------------------

@pytest.fixture(scope="session", autouse=True)
def _events_match_their_contract(django_db_setup, django_db_blocker):
    """Every RunEvent the suite's runs emit — here or in the worker processes tests start — has a
    type and payload fields that docs/EVENTS.md documents; otherwise the session ends in an error."""
    from django.db import connection

    from runs_app.models import RunEvent
    from tests.support import event_contract

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        # The test database django_db_setup made and pointed the connection at — with the run tables,
        # or nothing can emit. (This compared the connection's name with
        # `_get_test_db_name()`, which once set up is "test_" + the test name: the check never ran.)
        cursor.execute("SELECT to_regclass('runs_app_runevent') IS NOT NULL")
        migrated = cursor.fetchone()[0]
    if not migrated:
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
def _no_heartbeat_outlives_the_suite(django_db_setup, django_db_blocker, shared_servers):
    """A test that imports the ASGI application in-process starts that process's web heartbeat
    thread (operations.liveness); it is stopped, and this thread's connections closed, before the
    test databases are dropped. A fixture's teardown runs before those of the fixtures it uses, so
    the shared servers are killed here (closing them twice is harmless)."""
    yield
    from django.db import connections

    from operations.liveness import heartbeat_thread_stop

    with django_db_blocker.unblock():
        shared_servers.close()
    heartbeat_thread_stop()
    # Django drops each test database through its own alias's connection; another alias's open
    # connection to it (the PostgreSQL channel layer's mirror alias, which /readyz reads through)
    # would make the drop wait and fail.
    connections.close_all()
    with django_db_blocker.unblock():
        _no_one_else_on_the_test_database()


# --- fixtures every folder may use ---------------------------------------------------------------

@pytest.fixture
def operator(db):
    """Staff who may decide operator approvals and view everything."""
    from django.contrib.auth.models import Permission

    from tests.support.factories import UserFactory

    user = UserFactory(username="op", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval"]))
    user.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    return user


@pytest.fixture
def simulator(transactional_db):
    """The demo's simulated payment service on a server of its own in this process (its own
    port and URLconf, as in a deployment); the demo tools are pointed at it. Yields its base URL."""
    from django.test import override_settings

    from tests.support.simulator import InProcessSimulator

    with InProcessSimulator() as sim, override_settings(WARDEN_SIM_BASE_URL=sim.url):
        yield sim.url


@pytest.fixture
def demo_world(transactional_db):
    """The demo world's orders and user levels, as `manage.py seed_demo` makes them."""
    from django.core.management import call_command

    call_command("seed_demo", verbosity=0)


@pytest.fixture
def layer_for_this_process(transactional_db):
    """What this test process publishes (a run's first `queued` event, an approval decided in the
    test) goes through the same channel layer as the servers it starts: the test database's
    PostgreSQL layer. (Settings were computed before pytest-django renamed the database.)"""
    from django.test import override_settings

    from tests.support.console import postgres_layer_for_test_db, postgres_layer_pool_drop

    postgres_layer_pool_drop()
    with override_settings(CHANNEL_LAYERS=postgres_layer_for_test_db()):
        yield
    postgres_layer_pool_drop()


@pytest.fixture(scope="session")
def shared_servers(django_db_setup, django_db_blocker):
    """The web servers and the simulator the session's tests share (tests/support/processes.py),
    killed before the test database is dropped."""
    from tests.support.processes import SharedServers

    servers = SharedServers()
    yield servers
    with django_db_blocker.unblock():
        servers.close()


def _no_one_else_on_the_test_database():
    """The test database can be dropped only when this process alone is connected. A connection
    still open here outlived the process or thread that made it: wait for the database to notice
    a killed client, then name what is left (a leak to fix) and end it, so the drop succeeds."""
    import warnings

    from django.db import connection

    from tests.support.processes import wait_for

    query = ("SELECT pid, application_name, state, left(query, 120) FROM pg_stat_activity "
             "WHERE datname = current_database() AND pid <> pg_backend_pid()")

    def others():
        with connection.cursor() as cursor:
            cursor.execute(query)
            return cursor.fetchall()

    try:
        wait_for(lambda: not others(), timeout=20, message="")
    except AssertionError:
        left = others()
        warnings.warn(f"connections outlived the tests that opened them: {left}")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    connection.close()


@pytest.fixture
def procs(transactional_db, layer_for_this_process, shared_servers, request):
    """Real processes against the test database (tests/support/processes.py): the session's shared
    web server for the environment the test chose, and workers and a sweeper of its own, killed
    before the database is flushed. The channel layer is PostgreSQL's, whatever the shell exports;
    the tests of the Redis paths set REDIS_URL themselves. A folder varies the processes'
    environment by overriding this fixture (`procs.base_env.update(...)`)."""
    from tests.support.processes import ProcessGroup

    callspec = getattr(request.node, "callspec", None)
    group = ProcessGroup(name=request.node.originalname[:50] + (f"-{callspec.id}"[:30] if callspec else ""),
                         shared=shared_servers)
    group.base_env.pop("REDIS_URL", None)
    yield group
    group.stop_all()



@pytest.fixture(scope="module")
def mock_llm_process():
    """LLMock (tests/support/llmock.py), one process for a module's tests. (`llmock` and
    `llmock_server` are the names LLMock's own pytest plugin gives its in-process fixtures.)"""
    from tests.support.llmock import LLMock

    server = LLMock().start()
    yield server
    server.stop()


@pytest.fixture
def mock_llm(mock_llm_process):
    """The module's LLMock, with no queued behaviour and an empty journal."""
    mock_llm_process.reset()
    return mock_llm_process
