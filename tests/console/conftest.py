"""The console's tests: a real daphne (and, where runs must move, real workers) against the
test database, reached with a real websocket client carrying a logged-in user's cookie."""

import pytest
from django.test import override_settings

from tests.console.helpers import postgres_layer_for_test_db, postgres_layer_pool_drop
from tests.support.processes import ProcessGroup


@pytest.fixture
def layer_for_this_process(transactional_db):
    """What this test process publishes (a run's first `queued` event, an approval decided in
    the test) goes through the same layer as the server's: the test database's, by default.
    (Settings were computed before pytest-django renamed the database.)"""
    postgres_layer_pool_drop()
    with override_settings(CHANNEL_LAYERS=postgres_layer_for_test_db()):
        yield
    postgres_layer_pool_drop()


@pytest.fixture
def procs(transactional_db, layer_for_this_process, request):
    """Real processes against the test database; stopped before the database is flushed."""
    callspec = getattr(request.node, "callspec", None)
    group = ProcessGroup(name=f"console-{request.node.originalname[:44]}" + (f"-{callspec.id}" if callspec else ""))
    # The default layer is PostgreSQL's, whatever this shell exports (CI sets REDIS_URL);
    # the tests that exercise Redis set it themselves.
    group.base_env.pop("REDIS_URL", None)
    yield group
    group.stop_all()


@pytest.fixture
def demo_world(transactional_db):
    from django.core.management import call_command

    call_command("seed_demo", verbosity=0)
