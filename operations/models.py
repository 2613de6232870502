"""What every Warden process reports about itself: heartbeats and the counters the metrics read."""

from django.db import models
from django.db.models import Q


class ProcessRole(models.TextChoices):
    WORKER = "worker"  # a django-q2 worker process
    SWEEPER = "sweeper"  # `manage.py sweep --loop`, or the sweeper's django-q2 schedule
    WEB = "web"  # a web server process (daphne)


class ProcessHeartbeat(models.Model):
    """One row per Warden process, written by the process itself every
    WARDEN_WORKER_HEARTBEAT_SECONDS: /readyz looks for fresh worker and sweeper rows, and the
    metrics read the counters every process keeps here (fenced writes refused, sweeps, queue
    pickup latency, connected clients), so any process answers a scrape with the same numbers."""

    identity = models.CharField(max_length=160, primary_key=True)  # host:pid:nonce
    role = models.CharField(max_length=12, choices=ProcessRole.choices)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    # django-q2 workers: the cluster they belong to (host:sentinel pid).
    cluster = models.CharField(max_length=160, blank=True)
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField()
    # Cumulative since the process started: {name: number} and histograms {name: {"buckets": [...], "sum", "count"}}.
    counters = models.JSONField(default=dict, blank=True)
    # Current values (connected clients): counted only while the row is fresh.
    gauges = models.JSONField(default=dict, blank=True)

    class Meta:
        # The table it has had since it lived in runs_app (migrations operations/0001, runs_app/0015).
        db_table = "runs_app_processheartbeat"
        ordering = ["role", "-beat_at"]
        constraints = [models.CheckConstraint(condition=Q(role__in=ProcessRole.values), name="process_heartbeat_role_valid")]
        indexes = [models.Index(fields=["role", "-beat_at"], name="process_heartbeat_fresh")]

    def __str__(self) -> str:
        return f"{self.role} {self.identity}"


class OpenStream(models.Model):
    """A live connection a user holds open — an SSE event stream or a console websocket — so that
    one user cannot hold hundreds (WARDEN_STREAMS_PER_USER; issue 27, finding 10). Deleted when the
    connection ends; a row whose process died expires (`expires_at`, renewed while it lives)."""

    id = models.UUIDField(primary_key=True)
    user_id = models.IntegerField()
    kind = models.CharField(max_length=12)  # "sse" or "websocket"
    opened_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["user_id", "expires_at"], name="open_stream_user")]
