"""Security findings tested where an attacker touches the system: HTTP requests (through Django's
test client, or raw bytes to a real daphne where a client would normalise them) and subprocesses
that start Warden with a given environment."""

import pytest

from tests.support.processes import ProcessGroup


@pytest.fixture
def procs(transactional_db, request):
    group = ProcessGroup(name=f"security-{request.node.name[:60]}")
    group.base_env.pop("REDIS_URL", None)
    yield group
    group.stop_all()
