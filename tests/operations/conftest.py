"""The operations tests' processes report at once (tests/support/metrics.py: FAST)."""

import pytest

from tests.support.metrics import FAST


@pytest.fixture
def procs(procs):
    procs.base_env.update(FAST)
    return procs
