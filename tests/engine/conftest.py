import pytest

from tests.support.processes import ProcessGroup


@pytest.fixture
def procs(transactional_db, request):
    """Real processes against the test database; stopped before the database is flushed."""
    group = ProcessGroup(name=request.node.name[:60])
    yield group
    group.stop_all()


@pytest.fixture
def demo_world(transactional_db):
    from django.core.management import call_command

    call_command("seed_demo", verbosity=0)
