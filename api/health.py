"""The endpoints an operator's machinery calls (docs/OPERATIONS.md): /healthz for "is this process
up", /readyz for "can this deployment do its work", /metrics for Prometheus."""

import hmac
import logging
import time
from datetime import timedelta

import psycopg
import redis
from channels_postgres.db import MESSAGE_TABLE
from django.conf import settings
from django.db import DatabaseError, connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from operations.metrics import COLLECTOR
from operations.models import ProcessHeartbeat, ProcessRole

logger = logging.getLogger("warden.operations")

REGISTRY.register(COLLECTOR)

_migrations_applied = {"ok": False}
# Seconds /readyz waits for a database connection before it names the database unreachable.
READYZ_CONNECT_SECONDS = 2


@never_cache
@require_GET
def healthz(request):
    """The process is up and serving requests. Nothing else is asked (a load balancer's liveness)."""
    return JsonResponse({"status": "ok"})


def _check_database() -> tuple[bool, str]:
    """A `SELECT 1` on a pooled connection, waiting at most READYZ_CONNECT_SECONDS for one: the web
    process's pool otherwise waits its whole timeout (10 s) for a connection a stopped server never
    gives, and a readiness probe must answer before its prober gives up (Kubernetes waits 1 s by
    default) — with a 503 naming the database. Without a pool, Django's own connection."""
    try:
        pool = connection.pool
        if pool is None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        else:
            with pool.connection(timeout=READYZ_CONNECT_SECONDS) as pooled:
                pooled.execute("SELECT 1")
        return True, "reachable"
    except (DatabaseError, psycopg.Error) as error:
        connection.close()
        return False, f"unreachable: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"


def _check_migrations() -> tuple[bool, str]:
    if _migrations_applied["ok"]:
        return True, "applied"
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        return False, f"{len(plan)} not applied, first {plan[0][0].app_label}.{plan[0][0].name}"
    _migrations_applied["ok"] = True  # a deployment with new migrations is new code: a new process
    return True, "applied"


def _check_channel_layer() -> tuple[bool, str]:
    if settings.REDIS_URL:
        try:
            redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2).ping()
            return True, "redis reachable"
        except redis.RedisError as error:
            return False, f"redis unreachable: {error}"
    try:
        with connections["channels_postgres"].cursor() as cursor:
            cursor.execute(f'SELECT 1 FROM "{MESSAGE_TABLE}" LIMIT 1')
        return True, "postgres layer reachable"
    except DatabaseError as error:
        connections["channels_postgres"].close()
        return False, f"postgres layer unreachable: {str(error).strip()[:200]}"


def _check_heartbeat(role: str, stale_seconds: float, what: str) -> tuple[bool, str]:
    latest = ProcessHeartbeat.objects.filter(role=role).order_by("-beat_at").values_list("beat_at", flat=True).first()
    if latest is None:
        return False, f"no {what} has ever reported"
    age = (timezone.now() - latest).total_seconds()
    if age > stale_seconds:
        return False, f"last {what} heartbeat {age:.0f} s ago (more than {stale_seconds:.0f} s)"
    fresh = ProcessHeartbeat.objects.filter(role=role, beat_at__gte=timezone.now() - timedelta(seconds=stale_seconds))
    if role == ProcessRole.WORKER:
        clusters = fresh.values("cluster").distinct().count()
        return True, f"{fresh.count()} worker(s) in {clusters} cluster(s), last {age:.1f} s ago"
    return True, f"last {age:.1f} s ago"


@never_cache
@require_GET
def readyz(request):
    """Ready when the database is reachable, the migrations are applied, the channel layer is
    reachable, at least one worker cluster and a sweeper report fresh heartbeats. 503 otherwise,
    naming what failed."""
    checks: dict[str, dict] = {}
    ok, detail = _check_database()
    checks["database"] = {"ok": ok, "detail": detail}
    if ok:
        for name, check in (
            ("migrations", _check_migrations),
            ("channel_layer", _check_channel_layer),
            ("workers", lambda: _check_heartbeat(ProcessRole.WORKER, settings.WARDEN_WORKER_STALE_SECONDS, "worker")),
            ("sweeper", lambda: _check_heartbeat(ProcessRole.SWEEPER, settings.WARDEN_SWEEPER_STALE_SECONDS, "sweeper")),
        ):
            try:
                ok, detail = check()
            except DatabaseError as error:
                ok, detail = False, f"database error: {str(error).strip()[:200]}"
            checks[name] = {"ok": ok, "detail": detail}
    else:
        for name in ("migrations", "channel_layer", "workers", "sweeper"):
            checks[name] = {"ok": False, "detail": "not checked: the database is unreachable"}
    failed = [name for name, check in checks.items() if not check["ok"]]
    if failed:
        logger.warning("not ready: %s", ", ".join(f"{n} ({checks[n]['detail']})" for n in failed))
    return JsonResponse({"status": "not ready" if failed else "ready", "failed": failed, "checks": checks},
                        status=503 if failed else 200)


def _metrics_allowed(request) -> bool:
    """The bearer token (WARDEN_METRICS_TOKEN), or a client address in WARDEN_METRICS_ALLOWED_IPS."""
    header = request.headers.get("Authorization", "")
    if settings.WARDEN_METRICS_TOKEN and header.startswith("Bearer "):
        return hmac.compare_digest(header.removeprefix("Bearer ").strip(), settings.WARDEN_METRICS_TOKEN)
    return request.META.get("REMOTE_ADDR") in settings.WARDEN_METRICS_ALLOWED_IPS


@never_cache
@require_GET
def metrics(request):
    if not _metrics_allowed(request):
        response = JsonResponse({"code": "not_permitted", "message": "Metrics need the bearer token or an allowed address.",
                                 "fields": []}, status=401 if settings.WARDEN_METRICS_TOKEN else 403)
        if settings.WARDEN_METRICS_TOKEN:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    started = time.monotonic()
    try:
        body = generate_latest(REGISTRY)
    except DatabaseError as error:
        connection.close()
        logger.warning("metrics: database unreachable", exc_info=True)
        return JsonResponse({"code": "database_unreachable", "message": str(error).strip()[:200], "fields": []}, status=503)
    response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    response["X-Scrape-Seconds"] = f"{time.monotonic() - started:.3f}"
    return response
