import pytest

from tests.support.processes import ProcessGroup


@pytest.fixture
def procs(transactional_db, request):
    group = ProcessGroup(name=request.node.name[:60])
    yield group
    group.stop_all()
