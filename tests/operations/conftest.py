import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import ProcessGroup

# Fast heartbeats and no metrics cache in the processes these tests start: the numbers they
# assert arrive within a beat.
FAST = {"WARDEN_WORKER_HEARTBEAT_SECONDS": "0.5", "WARDEN_METRICS_CACHE_SECONDS": "0"}


@pytest.fixture
def procs(transactional_db, request):
    group = ProcessGroup(name=request.node.name[:60], env=FAST)
    yield group
    group.stop_all()


@pytest.fixture
def demo_world(transactional_db):
    from django.core.management import call_command

    call_command("seed_demo", verbosity=0)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of a Prometheus text exposition."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: dict, name: str, **labels) -> float | None:
    return found.get((name, frozenset(labels.items())))
