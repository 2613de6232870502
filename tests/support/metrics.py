"""Reading what /metrics exposes, and the environment that makes processes report at once."""

from prometheus_client.parser import text_string_to_metric_families

# Fast heartbeats and no metrics cache in the processes these tests start: the numbers they
# assert arrive within a beat.
FAST = {"WARDEN_WORKER_HEARTBEAT_SECONDS": "0.5", "WARDEN_METRICS_CACHE_SECONDS": "0"}


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of a Prometheus text exposition."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: dict, name: str, **labels) -> float | None:
    return found.get((name, frozenset(labels.items())))
