"""Process heartbeats and the numbers each process keeps (docs/OPERATIONS.md).

Every Warden process that matters to an operator writes one `ProcessHeartbeat` row: django-q2
workers (a thread started when django-q2 spawns the worker), web processes (a thread started with
the ASGI application), and sweepers (one upsert per sweep, so the row's time *is* the last sweep).
A row carries what that process counted since it started — fenced writes refused, task outcomes,
queue pickup latency, sweeps and what they did — and what it holds now (connected websocket and
SSE clients). /readyz reads the rows' freshness; the metrics collectors (operations/metrics.py) add
them up, so a scrape of any process reports every process.
"""

import bisect
import logging
import os
import socket
import threading
import uuid

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone
from psycopg.types.json import Jsonb

from operations.models import ProcessRole

logger = logging.getLogger("warden.liveness")

# Bucket upper bounds (seconds) of the histograms processes keep.
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "queue_pickup_seconds": (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
}

_lock = threading.Lock()
_counters: dict[str, object] = {}
_gauges: dict[str, int] = {}
_process: dict[str, object] = {"pid": None}


def _reset_after_fork() -> None:
    """A forked child (a django-q2 worker) starts its own numbers under its own identity."""
    if _process["pid"] != os.getpid():
        _counters.clear()
        _gauges.clear()
        _process.update(pid=os.getpid(), identity=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
                        started_at=timezone.now(), thread=None)


def process_identity() -> str:
    with _lock:
        _reset_after_fork()
        return _process["identity"]


def count(name: str, amount: int = 1) -> None:
    with _lock:
        _reset_after_fork()
        _counters[name] = _counters.get(name, 0) + amount


def observe(name: str, value: float) -> None:
    """Add `value` to the process's histogram `name` (buckets from HISTOGRAM_BUCKETS)."""
    bounds = HISTOGRAM_BUCKETS[name]
    with _lock:
        _reset_after_fork()
        histogram = _counters.setdefault(name, {"buckets": [0] * len(bounds), "sum": 0.0, "count": 0})
        index = bisect.bisect_left(bounds, value)
        if index < len(bounds):
            histogram["buckets"][index] += 1  # stored per bucket; the collector makes them cumulative
        histogram["sum"] += value
        histogram["count"] += 1


def gauge_add(name: str, delta: int) -> None:
    with _lock:
        _reset_after_fork()
        _gauges[name] = _gauges.get(name, 0) + delta


def snapshot() -> tuple[dict, dict]:
    with _lock:
        _reset_after_fork()
        counters = {k: (dict(v, buckets=list(v["buckets"])) if isinstance(v, dict) else v) for k, v in _counters.items()}
        return counters, dict(_gauges)


_UPSERT = """
INSERT INTO "runs_app_processheartbeat" ("identity", "role", "host", "pid", "cluster", "started_at", "beat_at", "counters", "gauges")
VALUES (%s, %s, %s, %s, %s, %s, now(), %s, %s)
ON CONFLICT ("identity") DO UPDATE SET "beat_at" = now(), "counters" = EXCLUDED."counters", "gauges" = EXCLUDED."gauges"
"""


def heartbeat_write(*, role: str, cluster: str = "", identity: str | None = None, counters: dict | None = None,
                    gauges: dict | None = None) -> None:
    """Upsert this process's row: one statement, outside any transaction of the caller's."""
    if counters is None or gauges is None:
        counters, gauges = snapshot()
    with _lock:
        _reset_after_fork()
        started_at = _process["started_at"]
        identity = identity or _process["identity"]
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT, [identity, role, socket.gethostname(), os.getpid(), cluster, started_at,
                                 Jsonb(counters), Jsonb(gauges)])


# The sweeper's numbers, per process (a sweep loop, or the schedule inside a django-q2 worker).
_sweeps: dict[str, int] = {}


def sweep_recorded(counts: dict[str, int]) -> None:
    """A sweep finished: its process's sweeper row is refreshed with the running totals."""
    with _lock:
        _reset_after_fork()
        if _sweeps.get("_pid") != os.getpid():
            _sweeps.clear()
            _sweeps["_pid"] = os.getpid()
        _sweeps["sweeps"] = _sweeps.get("sweeps", 0) + 1
        for action, n in counts.items():
            _sweeps[action] = _sweeps.get(action, 0) + n
        totals = {k: v for k, v in _sweeps.items() if k != "_pid"}
        identity = f"{_process['identity']}/sweeper"
    heartbeat_write(role=ProcessRole.SWEEPER, identity=identity, counters=totals, gauges={})


def heartbeat_thread_start(*, role: str, cluster: str = "") -> None:
    """Beat every WARDEN_WORKER_HEARTBEAT_SECONDS from a daemon thread (once per process)."""
    with _lock:
        _reset_after_fork()
        if _process.get("thread") is not None:
            return
        stop = threading.Event()
        thread = threading.Thread(target=_beat_forever, kwargs={"role": role, "cluster": cluster, "stop": stop},
                                  name=f"{role}-heartbeat", daemon=True)
        _process.update(thread=thread, stop=stop)
    thread.start()


def heartbeat_thread_stop() -> None:
    """Stop this process's heartbeat thread (its connection closed): for tests, which import the
    ASGI application in-process and must leave no connection open to the test database."""
    with _lock:
        thread, stop = _process.get("thread"), _process.get("stop")
        _process.update(thread=None, stop=None)
    if thread is not None:
        stop.set()
        thread.join(timeout=10)


def _beat_forever(*, role: str, cluster: str, stop: threading.Event) -> None:
    try:
        while not stop.is_set():
            try:
                close_old_connections()  # this thread's connection: reused, health-checked (CONN_HEALTH_CHECKS)
                heartbeat_write(role=role, cluster=cluster)
                if connection.settings_dict.get("OPTIONS", {}).get("pool"):
                    _connection_close()  # back to the pool its process's runs share
            except Exception:  # noqa: BLE001 - the database is away: /readyz says so; beat again later
                logger.warning("%s heartbeat failed", role, exc_info=True)
                _connection_close()
            stop.wait(settings.WARDEN_WORKER_HEARTBEAT_SECONDS)
    finally:
        _connection_close()


def _connection_close() -> None:
    """Close this thread's connection, or give it back to its pool. A worker process switches its
    default alias to a pool on its first run (engine/executor.py), after this thread opened a plain
    connection: Django then takes that one for a pooled one and fails to give it back (its pool is
    missing), which ended the thread with the exception. Such a connection is closed as what it is."""
    raw = connection.connection
    if raw is not None and connection.settings_dict.get("OPTIONS", {}).get("pool") and getattr(raw, "_pool", None) is None:
        connection.connection = None
        raw.close()
        return
    connection.close()


def on_worker_spawn(sender=None, proc_name=None, **kwargs) -> None:
    """django-q2's post_spawn signal, in each new worker process: start its heartbeat."""
    heartbeat_thread_start(role=ProcessRole.WORKER, cluster=f"{socket.gethostname()}:{os.getppid()}")
